"""Adding a task is one registry entry plus its data files; adding a head is one class plus its
registration. Proved the way a user would do it: a copy of the package with exactly those
additions runs the whole workflow (config validation, job requests, every stage, the tables)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, SHIPPED_GLUE, snakemake_command

pytestmark = pytest.mark.slow

NEW_TASK = """

register(_glue(
    "sst2b",
    kind="classification",
    text_fields=("sentence",),
    max_length=66,
    train_rows=67349,
    metrics=("accuracy",),
    label_names=("negative", "positive"),
    raw_labels=("0", "1"),
    glue=GlueFileLayout(folder="SST-B", files={"train": "train.tsv", "dev": "dev.tsv"},
                        text_columns=("sentence",), label_column="label"),
))
"""

NEW_HEAD_CLASS = '''

@builds("layer-max")
class LayerMaxHead(nn.Module):
    """The element-wise max over layers, then a linear layer."""

    def __init__(self, layers: int, hidden: int, outputs: int, *, dropout: float, scale: float):
        super().__init__()
        self.scale = scale
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.scale * x.amax(dim=-2)))
'''

NEW_HEAD_REGISTRATION = """

register(HeadType(
    "layer-max", "The max over layers, then a linear layer.",
    {"dropout": DROPOUT, "scale": Option(float, 1.0, "Multiplies the pooled state.", minimum=0)},
))
"""


def package_copy(root: Path) -> Path:
    """The parts of the project the workflow runs from, copied to ``root``."""
    for part in ("bertvision", "workflow", "rules", "profiles"):
        shutil.copytree(REPO / part, root / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def glue_folder(root: Path) -> Path:
    """The new task's data files: the first rows of the real SST-2 files, as a new folder."""
    for split, rows in (("train", 120), ("dev", 40)):
        with gzip.open(SHIPPED_GLUE / "SST-2" / f"{split}.tsv.gz", "rt", encoding="utf-8") as fh:
            lines = fh.read().split("\n")[: rows + 1]
        (root / "SST-B").mkdir(parents=True, exist_ok=True)
        (root / "SST-B" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_a_new_task_and_a_new_head_run_through_the_whole_workflow(tmp_path, tiny_bert):
    repo = package_copy(tmp_path / "repo")
    with open(repo / "bertvision/registry/tasks.py", "a") as fh:
        fh.write(NEW_TASK)
    with open(repo / "bertvision/models/heads.py", "a") as fh:
        fh.write(NEW_HEAD_CLASS)
    with open(repo / "bertvision/registry/heads.py", "a") as fh:
        fh.write(NEW_HEAD_REGISTRATION)

    workdir = tmp_path / "work"
    workdir.mkdir()
    config = {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {"glue_dir": str(glue_folder(tmp_path / "glue"))},
        "tasks": {"sst2b": {"train_size": 100}},
        "finetune": {"epoch_fractions": [0, 1.0], "settings": {"batch_size": 16}},
        "baseline": {"epochs": 1, "seeds": [1]},  # not what this test is about: the smallest
        "resources": {"threads": 1},  # two jobs share the 2 cores
        "heads": {
            "seeds": [1],
            "training": {"max_epochs": 2, "patience": 1},
            "models": {"lp": {"type": "lp"}, "max": {"type": "layer-max", "scale": 0.5}},
        },
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    # The copy comes first on the path of Snakemake and of every job it starts (cwd is not the repo).
    env = {**os.environ, "PYTHONPATH": str(repo)}
    cmd = snakemake_command(workdir, "--cores", "2", snakefile=repo / "workflow/Snakefile", timeout=900)
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    glue = pd.read_csv(workdir / "results/tables/glue.csv")
    assert set(glue["task"]) == {"sst2b"} and set(glue["metric"]) == {"accuracy"}
    assert {"BERT", "lp", "max"} <= set(glue["model"]) and set(glue["checkpoint"]) == {0.0, 1.0}
    record = json.loads((workdir / "heads/tiny/sst2b/ft1/ckpt-1/max/seed1/metrics.json").read_text())
    # defaults from the registry, and what every per-example head reads by default
    assert record["head_spec"] == {"type": "layer-max", "dropout": 0.0, "scale": 0.5, "reads": "cls", "pair": "joint"}
    assert record["parameters"] == 32 * 2 + 2
    raw = pd.read_parquet(workdir / "data/raw/sst2b/dev.parquet")
    assert len(raw) == 40 and list(raw.columns) == ["idx", "sentence", "label"]


def test_the_unchanged_package_knows_neither(tmp_path):
    """Without the additions the same names are config errors naming the key."""

    def validate(config: str) -> subprocess.CompletedProcess:
        (tmp_path / "c.yaml").write_text(textwrap.dedent(config))
        command = [sys.executable, "-m", "bertvision", "validate-config", str(tmp_path / "c.yaml")]
        proc = subprocess.run(command, capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        return proc

    head = validate("""
        backbones: {m: {pretrained: bert-base-uncased}}
        tasks: {mrpc: null}
        heads: {models: {max: {type: layer-max}}}
    """)
    assert "heads.models.max.type: 'layer-max' is not one of" in head.stderr
    task = validate("""
        backbones: {m: {pretrained: bert-base-uncased}}
        tasks: {sst2b: null}
    """)
    assert "tasks: unknown task 'sst2b'" in task.stderr
