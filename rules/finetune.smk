rule finetune:
    """Partial fine-tuning to one checkpoint (safetensors, its training record, and the state the
    next checkpoint goes on from), from the checkpoint before it; fraction 0 = the pretrained
    encoder with a freshly initialised head. One job per checkpoint: a race stops the run between
    two."""
    input:
        tokens=rules.tokenize.output,
        previous=get_previous_checkpoint,
    output:
        expand(L.CHECKPOINT_FILE, file=L.CHECKPOINT_FILES, allow_missing=True),
    params:
        settings=lambda wc: as_json(S.finetune(wc.model, wc.task, L.Checkpoint.named(wc.checkpoint))),
        compute=lambda wc: as_json(S.finetune_compute(L.Checkpoint.named(wc.checkpoint))),
        out_dir=L.FINETUNE_DIR,
        previous=get_previous_flag,
        bertvision=get_launcher,
    log:
        L.log("finetune"),
    benchmark:
        L.benchmark("finetune")
    # fine-tuning first: every other stage of a task waits for it
    priority: 20
    threads: S.threads
    resources:
        **get_requests(REQUESTS.finetune, gpus=GPU, micro_batches=True),
        # not a param, so not a rerun trigger: a checkpoint configured later goes on from one that
        # dropped its optimizer state by replaying it (stages/finetune.replay), and the checkpoints
        # before it stay as they ran
        optimizer_state=get_optimizer_state,
    shell:
        "{params.bertvision} finetune --task {wildcards.task} --model-name {wildcards.model} "
        "--settings {params.settings:q} --compute {params.compute:q} --tokens-dir {input.tokens} "
        "--out-dir {params.out_dir} --seed {wildcards.ftseed} --checkpoint {wildcards.checkpoint} {params.previous} "
        "--optimizer-state {resources.optimizer_state} "
        "--micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"


rule score_bert:
    """BERT's own head at a checkpoint, scored on selection and the evaluation splits (its table
    row; its logits feed the head + BERT ensembles): from the outputs the extraction kept beside
    the states where they are stored (one pass over the checkpoint, not two), else (streamed
    states) by running the checkpoint here. Checkpoint 0 is not scored: its head has not trained."""
    wildcard_constraints:
        checkpoint=r"[0-9.]*[1-9][0-9.]*",  # any checkpoint but 0
    input:
        unpack(FILES.bert_scoring_inputs),
    output:
        expand(L.CHECKPOINT_FILE, file=L.BERT_SCORE_FILES, allow_missing=True),
    params:
        # the scoring batch only where this job runs the checkpoint: a new one reruns no job
        # whose scores come from an extraction, nor the heads that read them
        settings=lambda wc: (
            "" if FILES.scored_in_extraction(wc) else f"--settings {shlex.quote(as_json(S.bert_scoring(wc.task)))}"
        ),
        compute=as_json(S.finetune_compute()),
        checkpoint=lambda wc: FILES.run(wc).format(L.CHECKPOINT_DIR),
        shards=lambda wc, input: " ".join(["--shard-dirs", *input.shards]) if "shards" in input.keys() else "",
    log:
        L.log("score_bert"),
    benchmark:
        L.benchmark("score_bert")
    threads: lambda wc: 1 if FILES.scored_in_extraction(wc) else S.threads
    resources:
        **get_requests(
            REQUESTS.bert_scoring,
            gpus=lambda wc: 0 if FILES.scored_in_extraction(wc) else GPU,
            scored_in_extraction=FILES.scored_in_extraction,
        ),
    shell:
        "bertvision score-bert --task {wildcards.task} {params.settings} --compute {params.compute:q} "
        "--checkpoint-dir {params.checkpoint} --tokens-dir {input.tokens} --raw-dir {input.raw} {params.shards} "
        "--threads {threads} > {log} 2>&1"


rule baseline:
    """Full fine-tuning, the bar to beat: the epochs of its own schedule, the one kept chosen on
    the selection split, its dev score and the seconds to reach it recorded."""
    input:
        tokens=rules.tokenize.output,
        raw=rules.download.output,
    output:
        expand(L.BASELINE_FILE, file=L.BASELINE_FILES, allow_missing=True),
    params:
        settings=lambda wc: as_json(S.baseline(wc.model, wc.task)),
        compute=as_json(S.finetune_compute()),
        out_dir=L.BASELINE_DIR,
        bertvision=get_launcher,
    log:
        L.log("baseline"),
    benchmark:
        L.benchmark("baseline")
    # the longest jobs of a run start as soon as their tokens exist, with fine-tuning's priority,
    # so that the short ones fill the other cores beside them instead of leaving them for the end
    priority: 20
    threads: S.threads
    resources:
        **get_requests(REQUESTS.baseline, gpus=GPU, micro_batches=True),
    shell:
        "{params.bertvision} baseline --task {wildcards.task} --model-name {wildcards.model} "
        "--settings {params.settings:q} --compute {params.compute:q} --tokens-dir {input.tokens} "
        "--raw-dir {input.raw} --out-dir {params.out_dir} --seed {wildcards.seed} "
        "--micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"


rule bert_curve:
    """BERT's own fine-tuning curve (experiments.bert_curve): full fine-tuning with the baseline's
    settings, scored on selection and dev at every point; a reported figure, nothing chosen from it."""
    input:
        tokens=rules.tokenize.output,
        raw=rules.download.output,
    output:
        L.BERT_CURVE_FILE,
    params:
        settings=lambda wc: as_json(S.bert_curve(wc.model, wc.task)),
        compute=as_json(S.finetune_compute()),
        bertvision=get_launcher,
    log:
        L.log("bert_curve"),
    benchmark:
        L.benchmark("bert_curve")
    threads: S.threads
    resources:
        **get_requests(REQUESTS.bert_curve, gpus=GPU, micro_batches=True),
    shell:
        "{params.bertvision} bert-curve --task {wildcards.task} --model-name {wildcards.model} "
        "--settings {params.settings:q} --compute {params.compute:q} --tokens-dir {input.tokens} "
        "--raw-dir {input.raw} --out {output} --seed {wildcards.seed} "
        "--micro-batches {resources.micro_batches} --threads {threads} > {log} 2>&1"
