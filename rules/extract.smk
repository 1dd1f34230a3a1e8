rule extract:
    """Shard {shard} of every split of a task: the [CLS] hidden state of every layer of a
    frozen checkpoint (every real token's for span tasks and tasks with token_features), one
    HDF5 file per split; at a fine-tuned checkpoint, BERT's own head's outputs on the scored
    splits from the same pass (rule score_bert scores them)."""
    input:
        checkpoint=expand(L.CHECKPOINT_FILE, file="model.safetensors", allow_missing=True)[0],
        tokens=rules.tokenize.output,
    output:
        directory(expand(L.SHARD_DIR, n_shards=S.shards, allow_missing=True)[0]),
    params:
        checkpoint=lambda wc, input: os.path.dirname(input.checkpoint),
        settings=get_extract_settings,
        compute=as_json(S.extract_compute()),
        attrs=lambda wc: as_json(S.extract_attrs(FILES.run(wc))),
        n_shards=S.shards,
        splits=lambda wc: splits_of(get_task(wc.task)),
        scored_splits=lambda wc: scored_splits(get_task(wc.task)),
        bert_logits=lambda wc: "--keep-bert-logits" if FILES.scored_in_extraction(wc) else "",
    log:
        L.log("extract"),
    benchmark:
        L.benchmark("extract")
    priority: 10
    threads: 1
    resources:
        **get_requests(REQUESTS.extract, gpus=GPU, micro_batches=True),
        **{f"extract_{key}": value for key, value in S.extract().to_dict().items()},
    shell:
        "bertvision extract --splits {params.splits} --scored-splits {params.scored_splits} --checkpoint-dir {params.checkpoint} --tokens-dir {input.tokens} "
        "--out-dir {output} --shard {wildcards.shard} --n-shards {params.n_shards} "
        "--settings {params.settings:q} --compute {params.compute:q} --attrs {params.attrs:q} "
        "{params.bert_logits} --micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"


rule feature_manifest:
    """Check that each split's shards tile it exactly; record their sizes and checksums."""
    input:
        FILES.shard_dirs,
    output:
        L.MANIFEST,
    log:
        L.log("feature_manifest"),
    benchmark:
        L.benchmark("feature_manifest")
    params:
        splits=lambda wc: splits_of(get_task(wc.task)),
    resources:
        mem_mb=1000,
        runtime=lambda wc, attempt: 30 * attempt,
    shell:
        "bertvision manifest --splits {params.splits} --out {output} --shard-dirs {input} > {log} 2>&1"
