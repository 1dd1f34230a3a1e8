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
