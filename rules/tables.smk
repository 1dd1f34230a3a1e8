from bertvision.stages.experiment_tables import TABLE_NAMES as EXPERIMENT_TABLES
from bertvision.stages.tables import TABLE_NAMES as RESULT_TABLES


rule tables:
    """The summary (full fine-tuning vs the picked BERTVision path), result tables (Markdown +
    CSV) from the metrics files, cost from the feature manifests, and wall time per stage from
    the benchmark files; the search workers' times count in the whole cost of a pick. Every
    task's pick is also a record of its own (picks.json), which serve_bundles serves."""
    input:
        baselines=TARGETS.baseline_metrics(),
        baseline_benchmarks=[job.benchmark for job in TARGETS.baseline_jobs()],
        peers=TARGETS.peer_metrics(),
        peer_benchmarks=[job.benchmark for job in TARGETS.peer_jobs() + TARGETS.embed_jobs()],
        raw=TARGETS.raw_dirs(),
        **get_per_task(lambda m, t, runs: FILES.for_tables(runs, RACE.decisions_of(m, t))),
    output:
        **get_table_outputs(RESULT_TABLES, "Tables"),
        summary_html=report(L.table("summary", "html"), category="Summary", caption="../workflow/report/summary_page.rst"),
        picks=L.picks_record(),
    params:
        heads=S.heads,
        runs=lambda wc: as_json([run.to_json() for run in RACE.runs()]),
        bert=lambda wc: FILES.bert_records(RACE.runs()),
        head_dirs=lambda wc: FILES.head_dirs(RACE.runs()),
        manifests=lambda wc: FILES.manifests(RACE.runs()),
        search_workers=lambda wc: FILES.search_workers(RACE.runs()),
        race=lambda wc: RACE.decisions(),
        shards=S.shards,
        peer_methods=as_json({t: S.configured_peers(t) for t in S.tasks}),
        out_dir=lambda wc, output: os.path.dirname(output.summary_md),
    log:
        L.log("tables"),
    benchmark:
        L.benchmark("tables")
    shell:
        "bertvision tables --bert-metrics {params.bert} --baseline-metrics {input.baselines} --head-dirs {params.head_dirs} --manifests {params.manifests} "
        "--peer-metrics {input.peers} --peers {params.peer_methods:q} --raw-dirs {input.raw} --search-workers {params.search_workers} --race-decisions {params.race} --runs {params.runs:q} --n-shards {params.shards} --head-order {params.heads} --out-dir {params.out_dir} "
        "> {log} 2>&1"


rule experiment_tables:
    """The experiments' tables: optuna searches, data-fraction curves, cross-checkpoint transfer,
    BERT's own fine-tuning curve."""
    input:
        **get_per_task(lambda m, t, runs: FILES.search_results(runs) + FILES.bert_records(runs)),
        subsets=TARGETS.subset_head_dirs(),
        heads=TARGETS.for_every_run(L.HEADS_DIR, tasks=S.data_fraction_tasks(), checkpoints=S.data_fraction_checkpoints()),
        transfer=TARGETS.transfer_files(),
        curves=TARGETS.bert_curve_files(),
        bert=FILES.experiment_bert_records([]),
    output:
        **get_table_outputs(EXPERIMENT_TABLES, "Experiments"),
    params:
        search=lambda wc: FILES.search_results(RACE.runs()),
        bert=lambda wc: FILES.experiment_bert_records(RACE.runs()),
        out_dir=lambda wc, output: os.path.dirname(output.search_md),
    log:
        L.log("experiment_tables"),
    benchmark:
        L.benchmark("experiment_tables")
    shell:
        "bertvision experiment-tables --best-files {params.search} --subset-dirs {input.subsets} --head-dirs {input.heads} "
        "--bert-metrics {params.bert} --transfer-files {input.transfer} --curve-files {input.curves} --out-dir {params.out_dir} "
        "> {log} 2>&1"
