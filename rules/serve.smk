# What `bertvision serve` loads to answer every task of a run as the tables stage picked it (picks.json).


rule serve_bundles:
    """The picked path for every task of a backbone (picks.json: checkpoint, head, seed): the tasks
    picked on the untouched encoder in one bundle, each task picked on its own checkpoint in a
    bundle of its own, and their index (bundles.json); `bertvision serve bundles/MODEL/picked`."""
    input:
        picks=L.picks_record(),
        **get_per_task(
            lambda m, t, runs: FILES.head_dirs(runs) + [run.format(L.CHECKPOINT_FILE, file="model.safetensors") for run in runs],
            by_model=True,
        ),
    output:
        directory(L.PICKED_BUNDLES_DIR),
    params:
        runs=lambda wc: as_json([run.served() for run in get_backbone_runs(wc)]),
        tokenizer=lambda wc: S.pretrained(wc.model),
        task_settings=lambda wc: get_bundle_task_settings(wc.model, S.tasks),
        provenance=lambda wc: as_json({"backbone": wc.model}),
        precision=S.extract_compute().precision,
    log:
        L.log("serve_bundles"),
    benchmark:
        L.benchmark("serve_bundles")
    resources:
        **get_requests(REQUESTS.serving),
    shell:
        "bertvision serve-bundles --picks {input.picks} --backbone {wildcards.model} --checkpoint-runs {params.runs:q} "
        "--tokenizer {params.tokenizer:q} --task-settings {params.task_settings:q} --provenance {params.provenance:q} "
        "--precision {params.precision} --out {output} > {log} 2>&1"


rule predict:
    """A task's unlabelled file (tasks.<name>.files.test) answered by the summary's picked path through
    the serving engine: results/predictions/MODEL/TASK.csv, the deliverable; never scored."""
    input:
        bundles=L.PICKED_BUNDLES_DIR,
        unlabelled=lambda wc: below_here([get_task(wc.task).unlabelled_file]),
    output:
        L.PREDICTIONS_FILE,
    log:
        L.log("predict"),
    benchmark:
        L.benchmark("predict")
    resources:
        **get_requests(REQUESTS.serving),
    shell:
        "bertvision predict --task {wildcards.task} --bundles {input.bundles} --out {output} > {log} 2>&1"
