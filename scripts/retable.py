"""Rebuild a finished run's tables with this checkout's reporting code, from the run's own
records and benchmark files (nothing is trained again): how a change in the accounting moves
the figures of a run already made.

    python scripts/retable.py WORKDIR OUT_DIR [--heads lp ap ...] [--config CONFIG [OVERLAY ...]]

The heads are the run's own (its config's, in its order, given --config; else as its head records
name them), unless --heads names them. A run of a config that declares its own tasks needs
--config: reading the config declares them.

The runs are every fine-tuning checkpoint under WORKDIR/models (its keys read from its training
record) that has a heads directory and,
where the race decided (WORKDIR/race), only the checkpoints it reached; the extraction's shards
per checkpoint are read from the feature manifests. OUT_DIR gets the tables stage's files
(summary.md, cost.md, ...). Race decisions written before their best entry was named `candidate`
(ab8ab48) are read through a renamed copy under OUT_DIR/records. A run made before BERT's
head had its own scoring job (rule score_bert) scored it inside each fine-tuning job, whose
benchmark file counts it: such a checkpoint gets a score_bert benchmark file of 0 seconds in
WORKDIR/benchmarks; benchmark files named before c55c270 (``ckpt0.3``) get a copy under today's name
(``ckpt-0.3``). Those are the only files this script writes there. Training and BERT records and
search worker records written before the checkpoint had one spelling (``epoch_fraction``, ``frac``)
are read through copies under OUT_DIR/records that spell it ``checkpoint`` (the files beside each
linked in)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from bertvision import layout as L
from bertvision.files import read_json
from bertvision.jobs import Job
from bertvision.layout import Checkpoint, Run
from bertvision.registry.peers import PEERS
from bertvision.script_support import (
    ScriptError,
    add_config_argument,
    declare_config_tasks,
    known_task,
    run_directory,
    run_script,
)
from bertvision.stages.tables import build_tables

EVERY_TRAIN_RECORD = L.CHECKPOINT_FILE.format(model="*", task="*", ftseed="*", checkpoint="*", file=L.TRAIN_RECORD)


def current_record(path: Path, copies: Path) -> Path:
    """A record as today's reporting reads it, in a copy under ``copies`` where it was written
    before: a race decision's ``best.head`` (which named a candidate, head or ensemble) becomes
    ``best.candidate``; a training or BERT record's float ``epoch_fraction`` and a search worker
    record's ``keys.frac`` become ``checkpoint`` (the checkpoint's name)."""
    d = read_json(path)
    best, keys = d.get("best") or {}, d.get("keys") or {}
    if "head" not in best and "epoch_fraction" not in d and "frac" not in keys:
        return path
    if "head" in best:
        d["best"] = {("candidate" if k == "head" else k): v for k, v in best.items()}
    if "epoch_fraction" in d:
        d["checkpoint"] = Checkpoint(d.pop("epoch_fraction")).name
    if "frac" in keys:
        keys["checkpoint"] = keys.pop("frac")
    copy = copies / path
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.unlink(missing_ok=True)  # a link made for an earlier record of the folder: never write through it
    copy.write_text(json.dumps(d))
    for sibling in path.parent.iterdir():  # the files the reporting reads beside a record (predictions, logits)
        if not (copy.parent / sibling.name).exists():
            (copy.parent / sibling.name).symlink_to(sibling.resolve())
    return copy


def current_benchmark_names(workdir: Path) -> None:
    """Benchmark files named before c55c270 spelled a checkpoint ``ckpt0.3``; today's reporting looks
    for ``ckpt-0.3``: each such file gets a copy under today's name (``layout.current_benchmark_name``)."""
    for _, old in L.benchmark_files(workdir):
        new = L.current_benchmark_name(old)
        if new != old and not new.exists():
            shutil.copyfile(old, new)


def extraction_shards(manifests: list[Path]) -> int:
    """Extraction jobs per checkpoint: each job writes one shard of every split."""
    counts = {len(split["shards"]) for m in manifests for split in read_json(m)["splits"].values()}
    if len(counts) > 1:
        raise ScriptError(f"the runs' feature manifests disagree on the number of shards: {sorted(counts)}")
    return counts.pop() if counts else 1


def rebuild(workdir: Path, out_dir: Path, heads: list[str] | None) -> None:
    """The tables of the run in ``workdir`` under ``out_dir``; ``heads``: their order (None: the
    order the run's head records name them in)."""
    os.chdir(workdir)  # benchmark and log paths are relative to the working directory
    current_benchmark_names(Path())
    records = out_dir / "records"
    every_decision = L.RACE_DECISION.format(model="*", task="*", checkpoint="*")
    decisions = [current_record(path, records) for path in sorted(Path().glob(every_decision))]
    reached: dict[tuple, set] = {}
    for path in decisions:
        d = read_json(path)
        reached.setdefault((d["model"], d["task"]), set()).add(d["checkpoint"])
    runs, bert, head_dirs, manifests, workers = [], [], [], [], []
    for record_file in sorted(Path().glob(EVERY_TRAIN_RECORD)):
        trained = read_json(current_record(record_file, records))  # its keys, from its own record
        known_task(trained["task"])
        checkpoint = Checkpoint.named(trained["checkpoint"])
        keys = {"model": trained["model"], "task": trained["task"], "ftseed": trained["seed"], "checkpoint": checkpoint}
        heads_dir = Path(L.HEADS_DIR.format(**keys))
        reached_here = reached.get((trained["model"], trained["task"]), set())
        if not heads_dir.is_dir() or (decisions and checkpoint.name not in reached_here):
            continue
        manifest = Path(L.MANIFEST.format(**keys))
        run = Run(trained["model"], trained["task"], trained["seed"], checkpoint, manifest.exists())
        runs.append(run)
        record = record_file.parent / L.bert_record_file(checkpoint)
        record = record if record.exists() else record_file.parent / L.BERT_METRICS  # older runs: at 0
        bert.append(current_record(record, records))
        scoring = Path(Job("score_bert", run.keys).benchmark)
        if checkpoint.fraction > 0 and not scoring.exists() and "scored_from" not in read_json(bert[-1]):
            scoring.parent.mkdir(parents=True, exist_ok=True)
            scoring.write_text("s\th:m:s\tmax_rss\n0.0\t0:00:00\t0.0\n")  # scored in the finetune job
        head_dirs.append(heads_dir)
        manifests += [manifest] if manifest.exists() else []
        workers += [
            current_record(w, records)
            for w in sorted(Path().glob(L.SEARCH_WORKER.format(**keys, head="*", worker="*")))
        ]
    if not runs:
        raise ScriptError(f"{workdir}: no fine-tuning checkpoint with a heads directory (heads/)")
    if heads is None:
        heads = list(dict.fromkeys(read_json(path)["head"] for path in L.head_metrics_files(head_dirs)))
    baselines = sorted(Path().glob(L.BASELINE_FILE.format(model="*", task="*", seed="*", file=L.BASELINE_METRICS)))
    shards = extraction_shards(manifests)
    every_peer = L.PEER_FILE.format(model="*", task="*", peer="*", seed="*", file=L.PEER_METRICS)
    peer_records = {path: read_json(path) for path in Path().glob(every_peer)}
    peer_metrics = sorted(peer_records, key=lambda path: list(PEERS).index(peer_records[path]["peer"]))
    ran: dict[str, dict] = {}  # the peers that ran (the config may name more, which did not apply)
    for path in peer_metrics:
        ran.setdefault(peer_records[path]["task"], {})[peer_records[path]["peer"]] = None
    peers = {task: list(names) for task, names in ran.items()}
    build_tables(
        bert, head_dirs, manifests, runs, shards, heads, out_dir.resolve(), baselines, workers, decisions,
        peer_metrics, peers,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--heads", nargs="+", help="the heads' order in the tables (default: the run's own)")
    add_config_argument(parser)
    args = parser.parse_args()
    out_dir = args.out_dir.resolve()
    workdir = run_directory(args.workdir, EVERY_TRAIN_RECORD)
    settings = declare_config_tasks(args.config, workdir)
    rebuild(workdir, out_dir, args.heads or (settings.heads if settings else None))
    print(f"tables written to {out_dir}")


if __name__ == "__main__":
    run_script(main)
