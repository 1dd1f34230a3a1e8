rule train_heads:
    """Every head configured for the task on one checkpoint's features, for every seed, one run
    directory each (epochs chosen on the selection split; the evaluation splits are only
    scored). Each head comes with its final training settings (S.head_settings). Under racing,
    the first fine-tuning seed's job decides which heads every fine-tuning seed trains there."""
    input:
        features=FILES.features_input,
        raw=rules.download.output,
        bert_logits=FILES.bert_logits_input,
        searched=lambda wc: FILES.searched_best(wc).values(),
        survivors=RACE.survivors(L.HEADS_DIR),
    output:
        directory(L.HEADS_DIR),
    params:
        heads=lambda wc: as_json(S.head_settings(wc.task)),
        runtime=lambda wc, resources: as_json(S.head_runtime(resources.gpu)),
        race=as_json(S.head_race()),
        seeds=S.head_seeds,
        searched=lambda wc: get_searched_args(wc),
        features=get_features_arg,
        train_fraction=1,
        survivors=lambda wc, input: f"--survivors-from {input.survivors}" if input.survivors else "",
        finish=get_finished_heads,
    log:
        L.log("train_heads"),
    benchmark:
        L.benchmark("train_heads")
    threads: 1
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=get_head_runs),
    shell:
        "bertvision train-heads --task {wildcards.task} --heads {params.heads:q} "
        "--runtime {params.runtime:q} --race {params.race:q} --manifest {params.features} --raw-dir {input.raw} "
        "--bert-logits {input.bert_logits} --seeds {params.seeds} --out-dir {output} "
        "--searched {params.searched} --train-fraction {params.train_fraction} {params.survivors} {params.finish} "
        "--threads {threads} > {log} 2>&1"


use rule train_heads as train_heads_subset with:
    """The data-fraction experiment: the task's heads trained on a nested {train_fraction} share of the
    training features of one checkpoint (selection and evaluation splits whole)."""
    input:
        features=FILES.features_input,
        raw=rules.download.output,
        bert_logits=FILES.bert_logits_input,
        searched=lambda wc: FILES.searched_best(wc, S.data_fraction_heads(wc.task)).values(),
        survivors=RACE.survivors(L.SUBSET_HEADS_DIR),
    output:
        directory(L.SUBSET_HEADS_DIR),
    params:
        heads=lambda wc: as_json(S.head_settings(wc.task, S.data_fraction_heads(wc.task))),
        searched=lambda wc: get_searched_args(wc, S.data_fraction_heads(wc.task)),
        train_fraction=lambda wc: wc.train_fraction,
        # a curve of score against the share of rows: every head trained to its end, none cut short by the race
        finish=lambda wc: "--finish " + " ".join(S.data_fraction_heads(wc.task)),
    log:
        L.log("train_heads_subset"),
    benchmark:
        L.benchmark("train_heads_subset")
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=get_subset_runs),


rule transfer:
    """Cross-checkpoint transfer: every head trained on one checkpoint's features (and the
    data-fraction heads, on a share of its rows), evaluated on every other checkpoint's features
    of the same fine-tuning run."""
    input:
        heads=FILES.transfer_head_dirs,
        features=lambda wc: [f for run in FILES.checkpoint_runs(wc) for f in FILES.features(run)],
        raw=rules.download.output,
    output:
        L.TRANSFER_FILE,
    params:
        in_memory_max_mb=lambda wc: S.head_training(wc.task).in_memory_max_mb,
        runtime=lambda wc, resources: as_json(S.head_runtime(resources.gpu)),
        features=lambda wc: " ".join(get_source_arg(run) for run in FILES.checkpoint_runs(wc)),
    log:
        L.log("transfer"),
    benchmark:
        L.benchmark("transfer")
    threads: 1
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=None, training=False),
    shell:
        "bertvision transfer --task {wildcards.task} --head-dirs {input.heads} --manifests {params.features} "
        "--raw-dir {input.raw} --in-memory-max-mb {params.in_memory_max_mb} --runtime {params.runtime:q} --out {output} "
        "--threads {threads} > {log} 2>&1"
