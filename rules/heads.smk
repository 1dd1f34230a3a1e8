rule train_heads:
    """Every configured head on one checkpoint's features, for every seed (epochs chosen on
    the selection split; the evaluation splits are only scored)."""
    input:
        rules.feature_manifest.output,
    output:
        expand(
            HEAD_FILE,
            head=S.heads,
            seed=HEAD_SEEDS,
            file=["head.safetensors", "metrics.json", "eval_predictions.parquet"],
            allow_missing=True,
        ),
    params:
        heads=as_json(S.head_specs()),
        settings=lambda wc: as_json(S.head_training(wc.task)),
        seeds=HEAD_SEEDS,
        out_dir=HEADS_DIR,
    conda:
        ENV
    log:
        "logs/train_heads/{task}/{model}-ft{ftseed}-ckpt{frac}.log",
    benchmark:
        "benchmarks/train_heads/{task}/{model}-ft{ftseed}-ckpt{frac}.tsv"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,
    shell:
        "bertvision train-heads --task {wildcards.task} --heads {params.heads:q} --settings {params.settings:q} "
        "--manifest {input} --seeds {params.seeds} --out-dir {params.out_dir} --threads {threads} > {log} 2>&1"
