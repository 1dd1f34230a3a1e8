from bertvision.stages.experiment_tables import TABLE_NAMES as EXPERIMENT_TABLES
from bertvision.stages.tables import TABLE_NAMES as RESULT_TABLES


rule tables:
    """The summary (full fine-tuning vs the picked BERTVision path), result tables (Markdown +
    CSV) from the metrics files, cost from the feature manifests, and wall time per stage from
    the benchmark files; the search workers' times count in the whole cost of a pick. Every
    task's pick is also a record of its own (picks.json), which serve_bundles serves."""
    input:
        bert=all_bert_metrics(),
        baselines=all_baseline_metrics(),
        heads=all_head_dirs(),
        benchmarks=all_benchmarks(),
        manifests=all_manifests(),
        search_workers=all_search_workers(),
    output:
        **table_outputs(RESULT_TABLES, "Tables"),
        picks=L.picks_record(),
    params:
        heads=S.heads,
        runs=all_runs_json(),
        shards=S.shards,
        out_dir=lambda wc, output: os.path.dirname(output.summary_md),
    log:
        L.log("tables"),
    benchmark:
        L.benchmark("tables")
    shell:
        "bertvision tables --bert-metrics {input.bert} --baseline-metrics {input.baselines} --head-dirs {input.heads} --manifests {input.manifests} "
        "--search-workers {input.search_workers} --runs {params.runs:q} --shards {params.shards} --heads {params.heads} --out-dir {params.out_dir} "
        "> {log} 2>&1"


rule experiment_tables:
    """The experiments' tables: optuna searches, data-fraction curves, cross-checkpoint transfer."""
    input:
        search=all_search_results(),
        subsets=all_subset_head_dirs(),
        heads=for_every_run(L.HEADS_DIR, tasks=S.data_fraction_tasks(), checkpoints=S.data_fraction_checkpoints()),
        bert=all_bert_metrics(),
        transfer=all_transfer_files(),
    output:
        **table_outputs(EXPERIMENT_TABLES, "Experiments"),
    params:
        out_dir=lambda wc, output: os.path.dirname(output.search_md),
    log:
        L.log("experiment_tables"),
    benchmark:
        L.benchmark("experiment_tables")
    shell:
        "bertvision experiment-tables --search {input.search} --subset-dirs {input.subsets} --head-dirs {input.heads} "
        "--bert-metrics {input.bert} --transfer {input.transfer} --out-dir {params.out_dir} > {log} 2>&1"
