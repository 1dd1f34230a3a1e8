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


rule experiment_tables:
    """The experiments' tables: optuna searches, data-fraction curves, cross-checkpoint transfer."""
    input:
        search=all_search_results(),
        subsets=all_subset_head_dirs(),
        heads=for_every_run(HEADS_DIR, tasks=S.data_fraction_tasks(), fractions=S.data_fraction_checkpoints()),
        bert=all_bert_metrics(),
        transfer=all_transfer_files(),
    output:
        search_md="results/tables/search.md",
        search_csv=report("results/tables/search.csv", category="Experiments", caption="../workflow/report/search_table.rst"),
        data_fraction_md="results/tables/data_fraction.md",
        data_fraction_csv=report(
            "results/tables/data_fraction.csv", category="Experiments", caption="../workflow/report/data_fraction_table.rst"
        ),
        transfer_md="results/tables/transfer.md",
        transfer_csv=report(
            "results/tables/transfer.csv", category="Experiments", caption="../workflow/report/transfer_table.rst"
        ),
    conda:
        ENV
    log:
        "logs/experiment_tables.log",
    shell:
        "bertvision experiment-tables --search {input.search} --subset-dirs {input.subsets} --head-dirs {input.heads} "
        "--bert-metrics {input.bert} --transfer {input.transfer} "
        "--search-md {output.search_md} --search-csv {output.search_csv} "
        "--data-fraction-md {output.data_fraction_md} --data-fraction-csv {output.data_fraction_csv} "
        "--transfer-md {output.transfer_md} --transfer-csv {output.transfer_csv} > {log} 2>&1"
