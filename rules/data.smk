rule download:
    """Task source (local glue_data folder or the hub) -> canonical parquet splits
    (train, selection carved from train, the task's evaluation splits)."""
    input:
        get_source_files,
    output:
        directory(L.RAW_DIR),
    params:
        settings=lambda wc: as_json(S.download(wc.task)),
        # a declared task's declaration: a changed label set or column reruns the download (a new
        # unlabelled file only the predict job, which reads it)
        declaration=lambda wc: as_json(get_task(wc.task).labelled().to_dict()) if get_task(wc.task).declared else "",
    log:
        L.log("download"),
    benchmark:
        L.benchmark("download")
    resources:
        **get_requests(REQUESTS.data, tokens=False),
    shell:
        "bertvision download --task {wildcards.task} --settings {params.settings:q} --out-dir {output} > {log} 2>&1"


rule tokenize:
    """Canonical splits -> token ids with the backbone's fast tokenizer (no padding stored)."""
    input:
        raw=rules.download.output,
        backbone=get_backbone_files,
    output:
        directory(L.TOKENS_DIR),
    params:
        settings=lambda wc: as_json(S.tokenize(wc.model, wc.task)),
    log:
        L.log("tokenize"),
    benchmark:
        L.benchmark("tokenize")
    resources:
        **get_requests(REQUESTS.data, tokens=True),
    shell:
        "bertvision tokenize --task {wildcards.task} --settings {params.settings:q} --raw-dir {input.raw} "
        "--out-dir {output} > {log} 2>&1"
