rule plots:
    """Score vs epochs per task, score vs parameters, and the learned layer weights."""
    input:
        tables=["results/tables/glue.csv", "results/tables/squad.csv"],
        heads=all_head_dirs(),
    output:
        epochs=[
            report(
                f"results/plots/{task}-score-vs-epochs.png",
                category="Plots",
                subcategory="Score vs epochs",
                caption="../workflow/report/score_vs_epochs.rst",
            )
            for task in S.tasks
        ],
        params=report(
            "results/plots/score-vs-parameters.png",
            category="Plots",
            caption="../workflow/report/score_vs_parameters.rst",
        ),
        layers=report(
            "results/plots/layer-weights.png",
            category="Plots",
            caption="../workflow/report/layer_weights.rst",
        ),
    params:
        tasks=S.tasks,
    conda:
        ENV
    log:
        "logs/plots.log",
    shell:
        "bertvision plots --tables {input.tables} --head-dirs {input.heads} --tasks {params.tasks} "
        "--out-dir results/plots > {log} 2>&1"


rule plot_data_fraction:
    """Score vs the share of training data the heads saw."""
    input:
        rules.experiment_tables.output.data_fraction_csv,
    output:
        report("results/plots/data-fraction.png", category="Plots", caption="../workflow/report/data_fraction_plot.rst"),
    conda:
        ENV
    log:
        "logs/plot_data_fraction.log",
    shell:
        "bertvision plot-data-fraction --table {input} --out {output} > {log} 2>&1"
