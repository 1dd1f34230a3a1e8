rule tables:
    """Result tables (Markdown + CSV) from the metrics files, and wall time per stage from the
    benchmark files."""
    input:
        bert=all_bert_metrics(),
        heads=all_head_dirs(),
        benchmarks=all_benchmarks(),
        manifests=all_manifests(),
    output:
        md="results/tables/glue.md",
        csv=report("results/tables/glue.csv", category="Tables", caption="../workflow/report/glue_table.rst"),
        squad_md="results/tables/squad.md",
        squad_csv=report("results/tables/squad.csv", category="Tables", caption="../workflow/report/squad_table.rst"),
        timing_md="results/tables/timing.md",
        cost_md="results/tables/cost.md",
        cost_csv=report("results/tables/cost.csv", category="Tables", caption="../workflow/report/cost_table.rst"),
        timing_csv=report(
            "results/tables/timing.csv", category="Tables", caption="../workflow/report/timing_table.rst"
        ),
    params:
        heads=S.heads,
    conda:
        ENV
    log:
        "logs/tables.log",
    shell:
        "bertvision tables --bert-metrics {input.bert} --head-dirs {input.heads} "
        "--benchmarks {input.benchmarks} --heads {params.heads} --md {output.md} --csv {output.csv} "
        "--squad-md {output.squad_md} --squad-csv {output.squad_csv} "
        "--cost-md {output.cost_md} --cost-csv {output.cost_csv} --manifests {input.manifests} "
        "--timing-md {output.timing_md} --timing-csv {output.timing_csv} > {log} 2>&1"
