checkpoint race_checkpoint:
    """The race between checkpoints (heads.race, protocol racing): whether the best head's mean
    selection score at this checkpoint may beat the earlier checkpoints' by more than min_gain
    (checkpoint_rule), and so whether fine-tuning goes on to the next one. A Snakemake checkpoint: the tables, plots
    and bundles ask for the next checkpoint's heads only once this has decided."""
    input:
        unpack(RACE.decision_inputs),
    output:
        L.RACE_DECISION,
    params:
        race=as_json(S.checkpoint_race()),
        last=lambda wc: "--last" if L.Checkpoint.named(wc.checkpoint) == S.checkpoints[-1] else "",
    log:
        L.log("race_checkpoint"),
    benchmark:
        L.benchmark("race_checkpoint")
    resources:
        mem_mb=1000,
        runtime=lambda wc, attempt: 10 * attempt,
    shell:
        "bertvision race-checkpoint --task {wildcards.task} --model-name {wildcards.model} --checkpoint {wildcards.checkpoint} "
        "--head-dirs {input.heads} --previous-decision {input.previous} --race {params.race:q} "
        "{params.last} --out {output} > {log} 2>&1"
