rule search_worker:
    """One of search.workers jobs that share the optuna study of one head on one checkpoint;
    each runs its share of the trials (objective: the selection split)."""
    input:
        manifest=rules.feature_manifest.output,
        raw=rules.download.output,
    output:
        SEARCH_WORKER,
    params:
        spec=lambda wc: as_json(S.task_heads(wc.task)[wc.head]),
        settings=lambda wc: as_json(S.head_training(wc.task)),
        search=as_json(S.search()),
        storage=study_storage,
        label=lambda wc: f"{wc.model}/{wc.task}/ft{wc.ftseed}/ckpt-{wc.frac}/{wc.head}",
    conda:
        ENV
    log:
        "logs/search_worker/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}-{worker}.log",
    benchmark:
        "benchmarks/search_worker/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}-{worker}.tsv"
    threads: 1
    resources:
        mem_mb=heads_request("mem_mb", trials_per_worker),
        runtime=heads_request("runtime", trials_per_worker),
    shell:
        "bertvision search-worker --task {wildcards.task} --head {wildcards.head} --spec {params.spec:q} "
        "--settings {params.settings:q} --search {params.search:q} --manifest {input.manifest} "
        "--raw-dir {input.raw} --storage {params.storage:q} --study-label {params.label:q} "
        "--worker {wildcards.worker} --out {output} --threads {threads} > {log} 2>&1"


rule search_best:
    """The study's best parameters and trial counts, once every worker has finished."""
    input:
        lambda wc: expand(SEARCH_WORKER, worker=range(SEARCH_WORKERS), **wc),
    output:
        SEARCH_BEST,
    conda:
        ENV
    log:
        "logs/search_best/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}.log",
    benchmark:
        "benchmarks/search_best/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}.tsv"
    resources:
        mem_mb=1000,
        runtime=lambda wc, attempt: 10 * attempt,
    shell:
        "bertvision search-best --workers {input} --out {output} > {log} 2>&1"
