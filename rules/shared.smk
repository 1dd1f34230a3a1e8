# Shared encoders (config section `shared`): a mixture fine-tuned on several tasks, each shared
# encoder's states of every shared task (where the main pipeline does not already have them),
# the heads trained on them, source heads applied to tasks with the same labels, the
# cross-task table and the bundle `bertvision serve` loads.


rule finetune_mixture:
    """One encoder fine-tuned on the training rows of several tasks at once (each task with its
    own output layer); only the encoder is kept."""
    input:
        tokens=lambda wc: get_mixture_tokens(wc).values(),
    output:
        expand(L.MIXTURE_FILE, file=L.MIXTURE_FILES, allow_missing=True),
    params:
        settings=lambda wc: as_json(S.mixture(wc.model, wc.encoder)),
        compute=as_json(S.finetune_compute()),
        tokens_dirs=lambda wc: " ".join(f"{task}={path}" for task, path in get_mixture_tokens(wc).items()),
        out_dir=L.MIXTURE_DIR,
        bertvision=get_launcher,
    log:
        L.log("finetune_mixture"),
    benchmark:
        L.benchmark("finetune_mixture")
    priority: 20
    threads: S.threads
    resources:
        **get_requests(REQUESTS.mixture, gpus=GPU, micro_batches=True),
    shell:
        "{params.bertvision} finetune-mixture --encoder-name {wildcards.encoder} --model-name {wildcards.model} "
        "--settings {params.settings:q} --compute {params.compute:q} --tokens-dirs {params.tokens_dirs} "
        "--out-dir {params.out_dir} --seed {wildcards.ftseed} --micro-batches {resources.micro_batches} "
        "--threads {threads} > {log} 2>&1"


use rule extract as extract_shared with:
    input:
        checkpoint=get_encoder_weights,
        tokens=rules.tokenize.output,
    output:
        directory(expand(L.SHARED_SHARD_DIR, n_shards=S.shards, allow_missing=True)[0]),
    params:
        checkpoint=lambda wc, input: os.path.dirname(input.checkpoint),
        settings=get_extract_settings,
        compute=as_json(S.extract_compute()),
        attrs=lambda wc: as_json(S.shared_extract_attrs(wc.model, wc.encoder, int(wc.ftseed), wc.task)),
        n_shards=S.shards,
        bert_logits="",  # a shared encoder's states only: no BERT output layer belongs to it
    log:
        L.log("extract_shared"),
    benchmark:
        L.benchmark("extract_shared")


use rule feature_manifest as feature_manifest_shared with:
    input:
        lambda wc: [L.SHARED_SHARD_DIR.format(**wc, shard=i, n_shards=S.shards) for i in range(S.shards)],
    output:
        L.SHARED_MANIFEST,
    log:
        L.log("feature_manifest_shared"),
    benchmark:
        L.benchmark("feature_manifest_shared")


use rule train_heads as train_heads_shared with:
    input:
        manifest=L.SHARED_MANIFEST,
        raw=rules.download.output,
        bert_logits=[],  # no BERT output layer belongs to a shared encoder: no ensembles
        searched=[],
        survivors=[],  # every fine-tuning seed's job races on its own (one head by default)
    output:
        directory(L.SHARED_HEADS_DIR),
    params:
        heads=lambda wc: as_json(S.head_settings(wc.task, S.shared_heads(wc.task))),
        searched="",
        features=lambda wc, input: input.manifest,  # shared encoders' states are always stored
        finish="",  # its heads are the shared ones alone: the race's survivors are the cell's candidates
    log:
        L.log("train_heads_shared"),
    benchmark:
        L.benchmark("train_heads_shared")
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=get_shared_head_runs),


rule head_transfer:
    """A source task's heads (on its own encoder) applied as they are to {task}, whose labels
    mean the same, on {task}'s states of the source's encoder."""
    input:
        heads=lambda wc: get_shared_encoder(wc).heads_dir(wc.model, int(wc.ftseed), wc.encoder),
        manifest=L.SHARED_MANIFEST,
        raw=rules.download.output,
    output:
        L.HEAD_TRANSFER_FILE,
    params:
        heads=lambda wc: [n for n in S.shared_heads(wc.task) if n in S.shared_heads(wc.encoder)],
        in_memory_max_mb=lambda wc: S.head_training(wc.task).in_memory_max_mb,
        runtime=lambda wc, resources: as_json(S.head_runtime(resources.gpu)),
    log:
        L.log("head_transfer"),
    benchmark:
        L.benchmark("head_transfer")
    threads: 1
    resources:
        **get_requests(REQUESTS.heads, "gpu", runs=None, training=False),
    shell:
        "bertvision head-transfer --source {wildcards.encoder} --target {wildcards.task} --head-dir {input.heads} "
        "--head-names {params.heads} --manifest {input.manifest} --raw-dir {input.raw} "
        "--in-memory-max-mb {params.in_memory_max_mb} "
        "--runtime {params.runtime:q} --out {output} --threads {threads} > {log} 2>&1"


rule cross_task:
    """The cross-task transfer table and heatmap: every shared task's heads on every shared
    encoder, picked on selection, against the task's own and the frozen encoder."""
    input:
        heads=TARGETS.shared_head_dirs(),
        transfer=TARGETS.head_transfer_files(),
    output:
        **get_table_outputs(["cross_task"], "Experiments"),
        plot=report(L.plot("cross-task"), category="Plots", caption="../workflow/report/cross_task_plot.rst"),
    params:
        encoders=as_json([e.to_json() for e in S.shared_encoders().values()]),
        models=S.models,
        ft_seeds=S.shared_ft_seeds,
        heads=as_json({t: list(S.shared_heads(t)) for t in S.shared_tasks}),
        epochs=as_json(get_mixture_epochs()),
        out_dir=lambda wc, output: os.path.dirname(output.cross_task_md),
    log:
        L.log("cross_task"),
    benchmark:
        L.benchmark("cross_task")
    shell:
        "bertvision cross-task --encoders {params.encoders:q} --models {params.models} --ft-seeds {params.ft_seeds} "
        "--task-heads {params.heads:q} --epochs {params.epochs:q} --transfer-files {input.transfer} "
        "--out-dir {params.out_dir} --plot {output.plot} > {log} 2>&1"


rule bundle:
    """What `bertvision serve` loads: the shared encoder (safetensors), its tokenizer and every
    shared task's shared heads (shared.heads) trained on it, with their specs and dev metrics."""
    input:
        checkpoint=get_encoder_weights,
        heads=lambda wc: get_bundle_heads(wc).values(),
    output:
        directory(L.BUNDLE_DIR),
    # bundles/{model}/picked is serve_bundles' (the summary's picks), never a shared encoder's
    wildcard_constraints:
        encoder=r"(?!picked$)[A-Za-z0-9_.-]+",
    params:
        encoder_dir=lambda wc, input: os.path.dirname(input.checkpoint),
        tokenizer=lambda wc: S.pretrained(wc.model),
        heads=lambda wc: " ".join(f"{t}={d}" for t, d in get_bundle_heads(wc).items()),
        task_settings=get_bundle_task_settings(
            S.models[0], S.shared_tasks, {t: sorted(S.shared_heads(t)) for t in S.shared_tasks}
        ),
        provenance=lambda wc: as_json({"backbone": wc.model, "encoder": wc.encoder, "ft_seed": S.shared_ft_seeds[0]}),
        precision=S.extract_compute().precision,
    log:
        L.log("bundle"),
    benchmark:
        L.benchmark("bundle")
    resources:
        **get_requests(REQUESTS.serving),
    shell:
        "bertvision bundle --encoder-dir {params.encoder_dir} --tokenizer {params.tokenizer:q} --task-head-dirs {params.heads} "
        "--task-settings {params.task_settings:q} --provenance {params.provenance:q} --precision {params.precision} "
        "--out {output} > {log} 2>&1"
