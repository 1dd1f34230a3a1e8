"""The ``tables`` stage: the result tables (GLUE, SQuAD 2.0), the cost of each result and the
wall time per stage, from the metrics files, the feature manifests and Snakemake's benchmark
files; nothing is typed in by hand. It makes the pick of every task (``reporting.picks``),
writes it as a record of its own and renders the summary from it."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from bertvision.files import read_json
from bertvision.jobs import baseline_job, embed_job, peer_job, timing_jobs
from bertvision.layout import Run, head_metrics_files, picks_record, rows_record, table
from bertvision.reporting.candidates import candidate_runs
from bertvision.reporting.choice import choose_picks
from bertvision.reporting.costs import cost_markdown, cost_table
from bertvision.reporting.markdown import markdown_page, write_csv, write_text
from bertvision.reporting.methods import method_table, methods_markdown
from bertvision.reporting.picks import write_picks
from bertvision.reporting.results import long_records, result_tables
from bertvision.reporting.summary import summary_table
from bertvision.reporting.summary_page import summary_markdown
from bertvision.reporting.timing import stage_precisions, timing_markdown, timing_table
from bertvision.reporting.whole_cost import race_jobs, search_jobs

log = logging.getLogger(__name__)

# Every table this stage writes (each as .md and .csv).
TABLE_NAMES = ("summary", "methods", "glue", "squad", "cost", "timing")


def _write(name: str, frame: pd.DataFrame, markdown: str, out_dir: Path) -> None:
    write_csv(frame, table(name, "csv", out_dir))
    write_text(markdown, table(name, "md", out_dir))


def _rows_record(raw_dir: Path) -> dict | None:
    path = rows_record(raw_dir)
    if not path.exists():  # downloaded by a version that kept no record: the run stands, the note is left out
        log.warning("%s: not there (downloaded before the record was kept); its repeats of train go unsaid", path)
        return None
    return read_json(path)


def build_tables(
    bert_metrics: list[Path],
    head_dirs: list[Path],
    manifests: list[Path],
    runs: list[Run],
    n_shards: int,
    head_order: list[str],
    out_dir: Path,
    baseline_metrics: list[Path] = (),
    search_workers: list[Path] = (),
    race_decisions: list[Path] = (),
    peer_metrics: list[Path] = (),
    peers: dict | None = None,
    raw_dirs: list[Path] = (),
) -> None:
    """``runs``: every run the workflow made, whose jobs' benchmark files give the times;
    ``baseline_metrics``: the full fine-tuning runs (the summary's reference); ``search_workers``:
    every search worker's record, whose job's time is part of a pick's whole cost;
    ``race_decisions``: the race's decision at every checkpoint it reached; ``peer_metrics``:
    every peer run (``stages/peer``), ``peers``: task -> the peers the config names for it (those
    that do not apply get a line saying why); ``raw_dirs``: every task's downloaded rows, whose
    record (``layout.rows_record``) says which repeat a train row. Besides the
    tables, ``out_dir`` gets each task's pick (``layout.picks_record``)."""
    head_metrics = head_metrics_files(head_dirs)
    baselines = tuple(baseline_job(r["model"], r["task"], r["seed"]) for r in map(read_json, baseline_metrics))
    peer_records = list(map(read_json, peer_metrics))
    baselines += tuple(peer_job(r["model"], r["task"], r["peer"], r["seed"]) for r in peer_records)
    encoded = dict.fromkeys((r["model"], r["task"]) for r in peer_records if r.get("shared_encoding"))
    baselines += tuple(embed_job(model, task) for model, task in encoded)
    jobs = timing_jobs(runs, n_shards, baselines)
    raced = sorted(map(read_json, race_decisions), key=lambda d: float(d["checkpoint"]))
    # every job the picks ran: the summary's and the cost table's whole costs
    spent = jobs + search_jobs(map(read_json, search_workers)) + race_jobs(raced)
    candidates = candidate_runs(list(baseline_metrics), bert_metrics, head_metrics, manifests, spent, peer_metrics)
    picks = choose_picks(candidates)
    write_picks(picks, picks_record(out_dir))
    verdict = summary_table(candidates, picks)
    decisions: dict[tuple, list[dict]] = {}
    for d in raced:
        decisions.setdefault((d["model"], d["task"]), []).append(d)
    rows = {r["task"]: r for r in map(_rows_record, raw_dirs) if r}
    summary_page = summary_markdown(verdict, decisions, peers or {}, rows)
    _write("summary", verdict, summary_page, out_dir)
    write_text(markdown_page(summary_page, "bertvision summary"), table("summary", "html", out_dir))
    methods = method_table(candidates)
    _write("methods", methods, methods_markdown(methods), out_dir)
    for name, (summary, markdown) in result_tables(long_records(bert_metrics, head_metrics), head_order).items():
        _write(name, summary, markdown, out_dir)
    costs = cost_table(bert_metrics, head_metrics, manifests, spent)
    _write("cost", costs, cost_markdown(costs), out_dir)
    precisions = stage_precisions(
        map(read_json, bert_metrics), map(read_json, baseline_metrics), map(read_json, head_metrics),
        map(read_json, manifests), peer_records,
    )  # fmt: skip
    timing = timing_table(jobs, precisions)
    _write("timing", timing, timing_markdown(timing), out_dir)
