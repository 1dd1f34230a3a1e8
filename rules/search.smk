rule search_worker:
    """One of search.workers jobs that share the optuna study of one head on one checkpoint;
    each runs its share of the trials (objective: the selection split)."""
    input:
        features=FILES.features_input,
        raw=rules.download.output,
    output:
        L.SEARCH_WORKER,
    params:
        study=lambda wc: as_json({k: wc[k] for k in ("model", "task", "ftseed", "checkpoint", "head")}),
        head=get_search_head,
        runtime=lambda wc, resources: as_json(S.head_runtime(resources.gpu)),
        search=as_json(S.search()),
        storage=get_study_storage,
        features=get_features_arg,
    log:
        L.log("search_worker"),
    benchmark:
        L.benchmark("search_worker")
    threads: 1
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=get_trials_per_worker),
    shell:
        "bertvision search-worker --task {wildcards.task} --keys {params.study:q} --head {params.head:q} "
        "--runtime {params.runtime:q} --search {params.search:q} "
        "--manifest {params.features} --raw-dir {input.raw} --storage {params.storage:q} "
        "--worker {wildcards.worker} --out {output} --threads {threads} > {log} 2>&1"


rule search_best:
    """The study's best parameters and trial counts, once every worker has finished."""
    input:
        lambda wc: expand(L.SEARCH_WORKER, worker=range(S.search_workers), **wc),
    output:
        L.SEARCH_BEST,
    log:
        L.log("search_best"),
    benchmark:
        L.benchmark("search_best")
    resources:
        mem_mb=1000,
        runtime=lambda wc, attempt: 10 * attempt,
    shell:
        "bertvision search-best --worker-records {input} --out {output} > {log} 2>&1"
