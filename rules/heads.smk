rule train_head:
    """One head architecture on one checkpoint's features, for every configured seed
    (epochs chosen on the selection split; the evaluation splits are only scored)."""
    input:
        rules.feature_manifest.output,
    output:
        expand(HEAD_DIR + "/seed{seed}/{file}", seed=HEAD_SEEDS,
               file=["head.safetensors", "metrics.json", "eval_predictions.parquet"], allow_missing=True),
    params:
        spec=lambda wc: as_json(S.head_spec(wc.head)),
        settings=lambda wc: as_json(S.head_training(wc.task)),
        out_dirs=head_seed_dirs,
        seeds=HEAD_SEEDS,
    log:
        "logs/train_head/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}.log",
    benchmark:
        "benchmarks/train_head/{task}/{model}-ft{ftseed}-ckpt{frac}-{head}.tsv"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,
    shell:
        "{BV} train-head --task {wildcards.task} --head {wildcards.head} --spec {params.spec:q} "
        "--settings {params.settings:q} --manifest {input} --seeds {params.seeds} "
        "--out-dirs {params.out_dirs} --threads {threads} > {log} 2>&1"
