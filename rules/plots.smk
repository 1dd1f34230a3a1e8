rule plots:
    """Score vs epochs per task, score vs parameters, score vs seconds, the learned layer weights
    and the training-loss curves (heads and full fine-tuning)."""
    input:
        tables=[rules.tables.output.glue_csv, rules.tables.output.squad_csv],
        summary=rules.tables.output.summary_csv,
        methods=rules.tables.output.methods_csv,
        **get_per_task(lambda m, t, runs: FILES.head_dirs(runs)),
        baselines=TARGETS.baseline_metrics(),
    output:
        epochs=[
            report(
                L.plot(L.score_vs_epochs_plot(task)),
                category="Plots",
                subcategory="Score vs epochs",
                caption="../workflow/report/score_vs_epochs.rst",
            )
            for task in S.tasks
        ],
        params=report(
            L.plot("score-vs-parameters"), category="Plots", caption="../workflow/report/score_vs_parameters.rst"
        ),
        layers=report(L.plot("layer-weights"), category="Plots", caption="../workflow/report/layer_weights.rst"),
        seconds=report(
            L.plot("score-vs-seconds"), category="Plots", caption="../workflow/report/score_vs_seconds.rst"
        ),
        loss=report(L.plot("training-loss"), category="Plots", caption="../workflow/report/training_loss.rst"),
        methods=report(
            L.plot("methods-cost-score"), category="Plots", caption="../workflow/report/methods_cost_score.rst"
        ),
    params:
        tasks=S.tasks,
        head_dirs=lambda wc: FILES.head_dirs(RACE.runs()),
        out_dir=lambda wc, output: os.path.dirname(output.params),
    log:
        L.log("plots"),
    benchmark:
        L.benchmark("plots")
    shell:
        "bertvision plots --result-csvs {input.tables} --summary-csv {input.summary} --methods-csv {input.methods} "
        "--head-dirs {params.head_dirs} "
        "--baseline-metrics {input.baselines} --tasks {params.tasks} "
        "--out-dir {params.out_dir} > {log} 2>&1"


rule plot_data_fraction:
    """Score vs the share of training data the heads saw."""
    input:
        rules.experiment_tables.output.data_fraction_csv,
    output:
        report(L.plot("data-fraction"), category="Plots", caption="../workflow/report/data_fraction_plot.rst"),
    log:
        L.log("plot_data_fraction"),
    benchmark:
        L.benchmark("plot_data_fraction")
    shell:
        "bertvision plot-data-fraction --table-csv {input} --out {output} > {log} 2>&1"


rule plot_bert_curve:
    """BERT's own fine-tuning curve: score on dev and selection vs epochs trained."""
    input:
        rules.experiment_tables.output.bert_curve_csv,
    output:
        report(L.plot("bert-curve"), category="Plots", caption="../workflow/report/bert_curve_plot.rst"),
    log:
        L.log("plot_bert_curve"),
    benchmark:
        L.benchmark("plot_bert_curve")
    shell:
        "bertvision plot-bert-curve --table-csv {input} --out {output} > {log} 2>&1"
