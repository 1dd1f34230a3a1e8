"""scripts/retable.py's reading of records written before today's spelling: each old record is read
through an upgraded copy under the output folder, with the files beside it linked in, and the run's
own folder is left as it was."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def retable():
    spec = importlib.util.spec_from_file_location("retable", ROOT / "scripts" / "retable.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_old_records_are_read_through_copies_and_the_run_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the script reads the run's relative paths from its folder
    folder = Path("models/m/stsb/ft1/ckpt-0.3")
    folder.mkdir(parents=True)
    old = {
        "train.json": {"epoch_fraction": 0.3, "seed": 1},
        "eval_metrics.json": {"epoch_fraction": 0.3, "metrics": {}},
    }
    for name, record in old.items():
        (folder / name).write_text(json.dumps(record))
    (folder / "eval_predictions.parquet").write_bytes(b"rows")
    before = {p: p.read_bytes() for p in folder.iterdir()}
    module, copies = retable(), tmp_path / "out" / "records"
    read = [module.current_record(folder / name, copies) for name in old]  # train.json first, as the script does
    assert [json.loads(p.read_text())["checkpoint"] for p in read] == ["0.3", "0.3"]
    assert all("epoch_fraction" not in json.loads(p.read_text()) for p in read)
    assert (
        read[1].parent / "eval_predictions.parquet"
    ).read_bytes() == b"rows"  # beside the copy, as beside the record
    assert {p: p.read_bytes() for p in folder.iterdir()} == before  # no record written through a link into the run
    current = folder / "current.json"
    current.write_text(json.dumps({"checkpoint": "0.3"}))
    assert module.current_record(current, copies) == current  # today's records are read where they are


def test_retable_run_on_a_run_rebuilds_the_tables_stages_tables_of_the_checkpoints_the_race_reached(
    tmp_path, monkeypatch
):
    """scripts/retable.py run for real on a hand-made run (tests.test_whole_cost's records, written where
    layout puts them, each checkpoint's training record beside), the race having reached 0 and 0.3 and
    one benchmark file named before c55c270: its tables are the tables stage's on the records it
    should read (full fine-tuning's among them), and the old-named file gets a copy under today's
    name beside it."""
    import shutil
    import subprocess
    import sys

    from bertvision.jobs import Job
    from bertvision.layout import CHECKPOINT_FILE, RACE_DECISION, TRAIN_RECORD
    from bertvision.stages.tables import build_tables
    from tests.test_whole_cost import MODEL, SHARDS, TASK, HandWorked, write_benchmark, write_json

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)  # the records' paths are relative to the run, as the stages write them
    r = HandWorked(Path("."))
    for scored in (x for x in r.runs if x.checkpoint.fraction > 0):  # at 0 the training record is BERT's record
        trained = {"model": MODEL, "task": TASK, "seed": scored.ftseed, "checkpoint": scored.checkpoint.name}
        write_json(Path(scored.format(CHECKPOINT_FILE, file=TRAIN_RECORD)), trained)
    reached = ("0", "0.3")
    decisions = []
    for checkpoint in reached:
        best = {"candidate": "ap", "selection": 0.8}
        decision = {"model": MODEL, "task": TASK, "checkpoint": checkpoint, "best": best, "last": checkpoint == "0.3",
                    "why": ""}  # fmt: skip
        decisions.append(
            write_json(Path(RACE_DECISION.format(model=MODEL, task=TASK, checkpoint=checkpoint)), decision)
        )
        write_benchmark(Job("race_checkpoint", {"task": TASK, "model": MODEL, "checkpoint": checkpoint}), 1.0)
    kept = [i for i, run_ in enumerate(r.runs) if run_.checkpoint.name in reached]
    today = Path(Job("finetune", r.runs[kept[-1]].keys).benchmark)
    old = today.with_name(today.name.replace("ckpt-", "ckpt"))  # the spelling before c55c270
    today.rename(old)
    workers = [w for w in r.workers if json.loads(w.read_text())["keys"]["checkpoint"] in reached]
    pick = [r.runs[i] for i in kept]
    expected = tmp_path / "expected"
    shutil.copyfile(old, today)  # the stage reads today's name
    build_tables([r.bert[i] for i in kept], [r.head_dirs[i] for i in kept], [r.manifests[i] for i in kept], pick,
                 SHARDS, ["lp", "ap"], expected, r.baselines, workers, decisions)  # fmt: skip
    today.unlink()

    out = tmp_path / "out"
    script = [sys.executable, str(ROOT / "scripts" / "retable.py")]
    done = subprocess.run([*script, str(run), str(out), "--heads", "lp", "ap"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert old.exists() and today.read_bytes() == old.read_bytes()
    written = sorted(p.relative_to(expected) for p in expected.rglob("*") if p.is_file())
    assert (
        "summary.csv" in map(str, written)
        and sorted(p.relative_to(out) for p in out.glob("*") if p.is_file()) == written
    )
    for name in written:
        assert (out / name).read_bytes() == (expected / name).read_bytes(), name
    assert "full fine-tuning" in (out / "summary.csv").read_text()
