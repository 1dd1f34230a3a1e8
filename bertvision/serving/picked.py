"""The bundles that serve a run's picks: for every task, the path the summary picked (a checkpoint
and a head), written as bundles grouped by encoder, and an index ``bundles.json`` over them that
``bertvision serve`` reads as one service.

The tasks picked on the untouched encoder (checkpoint 0: the same weights for every task) share
one bundle, ``frozen``, and so one encoder pass per batch; a task picked on its own fine-tuned
checkpoint gets a bundle of its own, ``{task}-ft{seed}-ckpt{fraction}``. Each task's bundle holds
every head trained at its picked checkpoint, with the summary's head as its default. Where the
summary averaged several fine-tuning seeds, the seed served is the one whose run of that head
scored best on the selection split (ties: the lower seed). Every choice reads the selection split.

A pick that is a head + BERT ensemble is served as it was evaluated: its bundle keeps the task's
whole model at that checkpoint (its classifier or span head included) and combines BERT's
outputs with the head's, per example or per window. Such a bundle serves that one task, so an
ensemble picked on the untouched encoder gets a bundle of its own too
(``{task}-ft{seed}-ckpt0``: BERT there is the task model's classifier as fine-tuning
initialised it, the one the evaluation scored).

``bundles.json``: {format: 1, keys, bundles: {name: {path, tasks, checkpoint}}, picks: {task:
{epoch_fraction, model (the summary's pick, served as such), head, ft_seed, bundle, dev_mean,
selection_mean}}}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bertvision.evaluation.ensemble import ensemble_rules
from bertvision.layout import BUNDLE_SET_INDEX
from bertvision.registry.tasks import get_task
from bertvision.reporting.results import ensemble_name
from bertvision.reporting.summary import ROW_KINDS
from bertvision.runtime.io import atomic_dir, atomic_write_json
from bertvision.serving.bundle import BundleError
from bertvision.serving.bundle_writer import collect_runs, selection_score, write_bundle

SET_FORMAT = 1
PICKED_ROW = ROW_KINDS[2]
FROZEN = "frozen"


@dataclass(frozen=True)
class CheckpointRun:
    """One fine-tuning run's checkpoint and the heads trained on its states (keys as the rules
    give them: the layout owns the paths)."""

    task: str
    ftseed: int
    frac: str
    checkpoint_dir: Path
    heads_dir: Path

    @property
    def epoch_fraction(self) -> float:
        return float(self.frac)

    @classmethod
    def from_json(cls, data: dict) -> CheckpointRun:
        return cls(
            data["task"], int(data["ftseed"]), str(data["frac"]), Path(data["checkpoint_dir"]), Path(data["heads_dir"])
        )


@dataclass(frozen=True)
class Pick:
    task: str
    epoch_fraction: float
    model: str  # the summary's name: a head, or a head + BERT ensemble
    dev_mean: float
    selection_mean: float


def summary_picks(summary_csv: Path, backbone: str) -> dict[str, Pick]:
    """Task -> the summary's picked path for ``backbone``."""
    table = pd.read_csv(summary_csv)
    missing = {"backbone", "task", "row", "epoch_fraction", "model"} - set(table.columns)
    if missing:
        raise BundleError(f"{summary_csv}: not a summary table (no column {', '.join(sorted(missing))})")
    rows = table[(table["row"] == PICKED_ROW) & (table["backbone"] == backbone)]
    return {
        r.task: Pick(r.task, float(r.epoch_fraction), str(r.model), float(r.dev_mean), float(r.selection_mean))
        for r in rows.itertuples()
    }


def served_head(pick: Pick, heads: set[str]) -> tuple[str, str | None]:
    """(the head of ``pick``, and the ensemble rule when the pick is that head with BERT's)."""
    if pick.model in heads:
        return pick.model, None
    task = get_task(pick.task)
    for head in sorted(heads):
        for how in ensemble_rules(task):
            if ensemble_name(head, how) == pick.model:
                return head, how
    raise BundleError(
        f"{pick.task}: the summary's pick {pick.model!r} at checkpoint {pick.epoch_fraction:g} is none of the "
        f"heads trained there ({', '.join(sorted(heads))}) nor their ensembles"
    )


def choose_run(pick: Pick, candidates: list[CheckpointRun]) -> tuple[CheckpointRun, str, str | None]:
    """The fine-tuning seed to serve ``pick`` from (the best selection score of the picked head,
    ties: the lower seed), the head, and the ensemble rule (None: the head alone)."""
    at = [r for r in candidates if r.task == pick.task and math.isclose(r.epoch_fraction, pick.epoch_fraction)]
    if not at:
        raise BundleError(f"{pick.task}: no checkpoint {pick.epoch_fraction:g} among the run's heads directories")
    task = get_task(pick.task)
    best: tuple[float, int, CheckpointRun] | None = None
    for run in sorted(at, key=lambda r: r.ftseed):
        trained = collect_runs(task, [run.heads_dir])
        head, how = served_head(pick, {t.head for t in trained})
        score = max(selection_score(task, t) for t in trained if t.head == head)
        if best is None or score > best[0]:
            best = (score, run.ftseed, run)
    return best[2], head, how


def bundle_name(run: CheckpointRun, ensemble: bool) -> str:
    """Tasks picked on the untouched encoder share one; a task's own checkpoint, or an ensemble
    (which needs the task's whole model), gets its own."""
    if run.epoch_fraction == 0 and not ensemble:
        return FROZEN
    return f"{run.task}-ft{run.ftseed}-ckpt{run.frac}"


def write_picked_bundles(
    out_dir: Path,
    summary_csv: Path,
    backbone: str,
    runs: list[CheckpointRun],
    tokenizer_source: str,
    task_settings: dict[str, dict],
    keys: dict,
    precision: str,
) -> dict:
    """Write the bundles serving every task of ``runs`` (as the summary picked it) and their index
    into ``out_dir`` (replaced); a task the summary has no pick for is an error naming it."""
    picks = summary_picks(summary_csv, backbone)
    tasks = list(dict.fromkeys(r.task for r in runs))
    unpicked = [t for t in tasks if t not in picks]
    if unpicked:
        raise BundleError(f"{summary_csv}: no picked path for {', '.join(unpicked)} (backbone {backbone})")
    groups: dict[str, dict[str, dict]] = {}
    checkpoints: dict[str, Path] = {}
    described = {}
    for name in tasks:
        pick = picks[name]
        run, head, how = choose_run(pick, runs)
        bundle = bundle_name(run, ensemble=how is not None)
        checkpoints.setdefault(bundle, run.checkpoint_dir)
        settings = {**task_settings.get(name, {}), "heads_dirs": [str(run.heads_dir)], "picked": head}
        if how is not None:
            settings.update(ensemble={"head": head, "how": how}, picked=pick.model)
        groups.setdefault(bundle, {})[name] = settings
        described[name] = {
            "epoch_fraction": pick.epoch_fraction,
            "model": pick.model,
            "head": head,
            "ft_seed": run.ftseed,
            "bundle": bundle,
            "dev_mean": pick.dev_mean,
            "selection_mean": pick.selection_mean,
        }
    with atomic_dir(out_dir) as scratch:
        for bundle, members in sorted(groups.items()):
            write_bundle(
                scratch / bundle,
                checkpoints[bundle],
                tokenizer_source,
                members,
                {**keys, "bundle": bundle, "checkpoint": str(checkpoints[bundle])},
                precision,
            )
        index = {
            "format": SET_FORMAT,
            "keys": keys,
            "bundles": {
                b: {"path": b, "tasks": list(members), "checkpoint": str(checkpoints[b])}
                for b, members in sorted(groups.items())
            },
            "picks": described,
        }
        atomic_write_json(index, scratch / BUNDLE_SET_INDEX)
    return index
