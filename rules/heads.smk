rule train_heads:
    """Every head configured for the task on one checkpoint's features, for every seed, into
    {head}/seed{seed}/ (epochs chosen on the selection split; the evaluation splits are only
    scored)."""
    input:
        manifest=rules.feature_manifest.output,
        raw=rules.download.output,
        bert_logits=expand(CKPT_FILE, file="eval_logits.npz", allow_missing=True)[0],
    output:
        directory(HEADS_DIR),
    params:
        heads=lambda wc: as_json(S.task_heads(wc.task)),
        settings=lambda wc: as_json(S.head_training(wc.task)),
        seeds=HEAD_SEEDS,
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
        "--manifest {input.manifest} --raw-dir {input.raw} --bert-logits {input.bert_logits} --seeds {params.seeds} --out-dir {output} "
        "--threads {threads} > {log} 2>&1"
