"""The cross-task report from head records: which runs it reads over the fine-tuning seeds, the
head it picks per encoder, and the points it sets each cell against."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bertvision.files import atomic_write_json
from bertvision.layout import HEAD_METRICS, HEAD_RUN, Checkpoint, SharedEncoder
from bertvision.reporting.cross_task import (
    AS_IS,
    FROZEN,
    MIXTURE,
    OTHER,
    OWN,
    cross_task_markdown,
    cross_task_table,
    head_runs_on_encoders,
)


def write_head_record(heads_dir, head: str, seed: int, dev: float) -> None:
    run = HEAD_RUN.format(head=head, seed=seed)
    record = {"head": head, "parameters": 10, "metrics": {"selection": {"accuracy": dev}, "dev": {"accuracy": dev}}}
    (heads_dir / run).mkdir(parents=True)
    atomic_write_json(record, heads_dir / run / HEAD_METRICS)


def test_an_untouched_encoders_heads_count_once_over_the_fine_tuning_seeds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frozen = SharedEncoder("frozen", "frozen", checkpoint=Checkpoint(0), first_ftseed=1)
    own = SharedEncoder("rte", "task", source="rte", checkpoint=Checkpoint(1), first_ftseed=1)
    assert frozen.heads_dir("tiny", 1, "rte") == frozen.heads_dir("tiny", 2, "rte")  # one directory, two seeds
    for seed, dev in ((1, 0.50), (2, 0.60)):
        write_head_record(tmp_path / frozen.heads_dir("tiny", 1, "rte"), "lp", seed, dev)
    for ftseed in (1, 2):
        for seed, dev in ((1, 0.70), (2, 0.80)):
            write_head_record(tmp_path / own.heads_dir("tiny", ftseed, "rte"), "lp", seed, dev)

    runs = head_runs_on_encoders([frozen, own], ["tiny"], [1, 2], {"rte": ["lp"]}, {})
    table = cross_task_table(runs).set_index("encoder")

    assert table.loc["frozen", "n"] == 2 and table.loc["rte", "n"] == 4
    assert table.loc["frozen", "dev_std"] == pytest.approx(0.0707107, abs=1e-6)  # std of 0.50, 0.60
    assert table.loc["frozen", "dev_mean"] == pytest.approx(0.55)


def run_rows() -> pd.DataFrame:
    rows = []

    def add(encoder, role, head, parameters, selections, devs):
        for selection, dev in zip(selections, devs):
            rows.append(
                {"backbone": "tiny", "task": "rte", "encoder": encoder, "role": role, "trained_on": "x",
                 "head": head, "selection": selection, "dev": dev, "parameters": parameters, "raced_out": False}
            )  # fmt: skip

    add("mix", MIXTURE, "lp", 10, [0.4, 0.4], [0.66, 0.66])  # rows out of the table's order
    add("wnli", AS_IS, "lp", 10, [0.3, 0.3], [0.61, 0.61])
    add("wnli", OTHER, "lp", 10, [0.4, 0.4], [0.76, 0.76])
    add("frozen", FROZEN, "big", 100, [0.55, 0.55], [0.80, 0.80])  # ties lp on selection, more parameters
    add("frozen", FROZEN, "lp", 10, [0.55, 0.55], [0.50, 0.54])
    add("rte", OWN, "big", 100, [0.50, 0.52], [0.90, 0.92])  # best on dev, worse on selection
    add("rte", OWN, "lp", 10, [0.60, 0.62], [0.70, 0.72])
    return pd.DataFrame(rows)


def test_the_table_picks_each_cell_on_selection_and_states_points_against_own_and_frozen():
    table = cross_task_table(run_rows())

    assert list(table["role"]) == [OWN, FROZEN, OTHER, MIXTURE, AS_IS]
    cells = table.set_index("role")
    assert list(cells["head"]) == ["lp"] * 5  # selection, then fewer parameters; never dev
    assert cells.loc[OWN, "dev_mean"] == pytest.approx(0.71)
    assert cells.loc[FROZEN, "dev_std"] == pytest.approx(math.sqrt(2) * 0.02)  # ddof 1 over two seeds
    assert cells.loc[OTHER, "diff_vs_own"] == pytest.approx(5.0)  # 0.76 - 0.71, in points
    assert cells.loc[MIXTURE, "diff_vs_own"] == pytest.approx(-5.0)
    assert cells.loc[AS_IS, "diff_vs_frozen"] == pytest.approx(9.0)  # 0.61 - 0.52
    assert cells.loc[OWN, "diff_vs_own"] == 0 and cells.loc[FROZEN, "diff_vs_frozen"] == 0

    markdown = cross_task_markdown(table)
    assert "**0.710 ± 0.014**" in markdown  # the task's own encoder in bold, no points against itself
    assert "0.760 ± 0.000 (+5.0)" in markdown and "0.660 ± 0.000 (-5.0)" in markdown
