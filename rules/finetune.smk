rule finetune:
    """Partial fine-tuning: a checkpoint (safetensors) plus BERT's own evaluation predictions
    and metrics at every configured epoch fraction; fraction 0 = the pretrained encoder."""
    input:
        tokens=rules.tokenize.output,
        raw=rules.download.output,
    output:
        expand(
            CKPT_FILE,
            frac=S.fractions,
            file=[
                "model.safetensors",
                "config.json",
                "eval_metrics.json",
                "eval_predictions.parquet",
                "eval_logits.npz",
            ],
            allow_missing=True,
        ),
    params:
        backbone=lambda wc: S.pretrained(wc.model),
        settings=lambda wc: as_json(S.finetune(wc.task)),
        out_dir="models/{model}/{task}/ft{ftseed}",
        bertvision=launcher,
    conda:
        ENV
    log:
        "logs/finetune/{task}/{model}-ft{ftseed}.log",
    benchmark:
        "benchmarks/finetune/{task}/{model}-ft{ftseed}.tsv"
    # fine-tuning first: every other stage of a task waits for it
    priority: 20
    threads: THREADS
    resources:
        gpu=GPU,
        gpu_model=GPU_MODEL,
        mem_mb=finetune_request("mem_mb"),
        runtime=finetune_request("runtime"),
        micro_batches=micro_batches,
    shell:
        "{params.bertvision} finetune --task {wildcards.task} --backbone {params.backbone:q} --tokens-dir {input.tokens} "
        "--raw-dir {input.raw} --out-dir {params.out_dir} --seed {wildcards.ftseed} --settings {params.settings:q} "
        "--micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"
