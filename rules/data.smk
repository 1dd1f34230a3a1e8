rule download:
    """Task source (local glue_data folder or the hub) -> canonical parquet splits
    (train, selection carved from train, the task's evaluation splits)."""
    input:
        source_files,
    output:
        directory("data/raw/{task}"),
    params:
        settings=lambda wc: as_json(S.download(wc.task)),
    conda:
        ENV
    log:
        "logs/download/{task}.log",
    benchmark:
        "benchmarks/download/{task}.tsv"
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 30 * attempt,
    shell:
        "bertvision download --task {wildcards.task} --settings {params.settings:q} --out-dir {output} > {log} 2>&1"


rule tokenize:
    """Canonical splits -> token ids with the backbone's fast tokenizer (no padding stored)."""
    input:
        rules.download.output,
    output:
        directory("data/tokens/{model}/{task}"),
    params:
        backbone=lambda wc: S.pretrained(wc.model),
        max_length=lambda wc: S.max_length(wc.task),
        doc_stride=lambda wc: S.doc_stride(wc.task),
    conda:
        ENV
    log:
        "logs/tokenize/{task}/{model}.log",
    benchmark:
        "benchmarks/tokenize/{task}/{model}.tsv"
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 30 * attempt,
    shell:
        "bertvision tokenize --task {wildcards.task} --backbone {params.backbone:q} "
        "--max-length {params.max_length} --doc-stride {params.doc_stride} --raw-dir {input} --out-dir {output} > {log} 2>&1"
