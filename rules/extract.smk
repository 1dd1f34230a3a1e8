rule extract:
    """Shard {shard} of every split of a task: the [CLS] hidden state of every layer of a
    frozen checkpoint (every real token's for span tasks and tasks with token_features), one
    HDF5 file per split."""
    input:
        checkpoint=expand(CKPT_FILE, file="model.safetensors", allow_missing=True)[0],
        tokens=rules.tokenize.output,
    output:
        directory(expand(SHARD_DIR, n_shards=N_SHARDS, allow_missing=True)[0]),
    params:
        settings=as_json(S.extract()),
        attrs=extract_attrs,
        splits=lambda wc: splits_of(get_task(wc.task)),
        n_shards=N_SHARDS,
    conda:
        ENV
    log:
        "logs/extract/{task}/{model}-ft{ftseed}-ckpt{frac}-{shard}.log",
    benchmark:
        "benchmarks/extract/{task}/{model}-ft{ftseed}-ckpt{frac}-{shard}.tsv"
    priority: 10
    threads: 1
    resources:
        gpu=GPU,
        gpu_model=GPU_MODEL,
        mem_mb=extract_request("mem_mb"),
        runtime=extract_request("runtime"),
        micro_batches=micro_batches,
    shell:
        "bertvision extract --checkpoint $(dirname {input.checkpoint}) --tokens-dir {input.tokens} "
        "--splits {params.splits} --out-dir {output} --shard {wildcards.shard} --shards {params.n_shards} "
        "--settings {params.settings:q} --attrs {params.attrs:q} "
        "--micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"


rule feature_manifest:
    """Check that each split's shards tile it exactly; record their sizes and checksums."""
    input:
        shard_dirs,
    output:
        MANIFEST,
    params:
        splits=lambda wc: splits_of(get_task(wc.task)),
    conda:
        ENV
    log:
        "logs/feature_manifest/{task}/{model}-ft{ftseed}-ckpt{frac}.log",
    benchmark:
        "benchmarks/feature_manifest/{task}/{model}-ft{ftseed}-ckpt{frac}.tsv"
    resources:
        mem_mb=1000,
        runtime=lambda wc, attempt: 30 * attempt,
    shell:
        "bertvision manifest --out {output} --splits {params.splits} --shard-dirs {input} > {log} 2>&1"
