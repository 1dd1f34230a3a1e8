rule embed:
    """The backbone's own sentence embedding (its declared pooling) of every text of a task, each
    distinct text encoded once, for every peer that trains no encoder: the linear model and the
    cosine read one encoding."""
    input:
        raw=rules.download.output,
        backbone=get_backbone_files,
    output:
        L.EMBEDDINGS,
    params:
        settings=lambda wc: as_json(S.embedding(wc.model, wc.task)),
        compute=as_json(S.embedding_compute()),
    log:
        L.log("embed"),
    benchmark:
        L.benchmark("embed")
    threads: S.threads
    resources:
        **get_requests(REQUESTS.embed, gpus=min(GPU, 1)),
    shell:
        "bertvision embed --task {wildcards.task} --model-name {wildcards.model} --settings {params.settings:q} "
        "--compute {params.compute:q} --raw-dir {input.raw} --out {output} --threads {threads} > {log} 2>&1"


rule peer:
    """A peer method (config ``peers``): what a practitioner would use instead of the BERTVision
    path (the backbone's own sentence embedding with a linear model or the cosine, LoRA, BitFit,
    SetFit), its settings chosen on the selection split, its dev score reported beside full
    fine-tuning's."""
    input:
        tokens=rules.tokenize.output,
        raw=rules.download.output,
        embeddings=get_peer_embeddings,
    output:
        expand(L.PEER_FILE, file=L.PEER_FILES, allow_missing=True),
    params:
        settings=lambda wc: as_json(S.peer(wc.model, wc.task, wc.peer)),
        compute=lambda wc: as_json(S.peer_compute(wc.peer)),
        out_dir=L.PEER_DIR,
        embeddings=lambda wc, input: f"--embeddings {shlex.quote(input.embeddings)}" if input.embeddings else "",
    log:
        L.log("peer"),
    benchmark:
        L.benchmark("peer")
    threads: S.threads
    resources:
        # one process on at most one GPU: a peer runs one session per learning rate, which
        # torchrun's process group would have to outlive; none for a linear model on the task's
        # embeddings (scikit-learn, on the CPU)
        **get_requests(
            REQUESTS.peer, gpus=lambda wc: 0 if get_peer(wc.peer).reads_embeddings else min(GPU, 1), micro_batches=True
        ),
    shell:
        "bertvision peer --task {wildcards.task} --model-name {wildcards.model} "
        "--settings {params.settings:q} --compute {params.compute:q} --tokens-dir {input.tokens} "
        "--raw-dir {input.raw} --out-dir {params.out_dir} --seed {wildcards.seed} "
        "--micro-batches {resources.micro_batches} --threads {threads} {params.embeddings} > {log} 2>&1"
