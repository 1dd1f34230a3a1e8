"""The bundles that serve a run's picks: for every task, the path the ``tables`` stage picked (a
checkpoint, a head, alone or with BERT, and the fine-tuning seed to serve; ``reporting.picks``),
written as bundles grouped by encoder, and an index ``bundles.json`` over them that
``bertvision serve`` reads as one service. Nothing is chosen here: the pick record says it all.

The tasks picked on the untouched encoder (checkpoint 0: the same weights for every task) share
one bundle, ``frozen``, and so one encoder pass per batch; a task picked on its own fine-tuned
checkpoint gets a bundle of its own, ``{task}-ft{seed}-ckpt-{checkpoint}``. Each task's bundle holds
every head trained at its picked checkpoint (of the picked fine-tuning seed), with the picked head
as its default.

A pick that is a head + BERT ensemble is served as it was evaluated: its bundle keeps the task's
whole model at that checkpoint (its classifier or span head included) and combines BERT's
outputs with the head's, per example or per window. Such a bundle serves that one task, so an
ensemble picked on the untouched encoder gets a bundle of its own too
(``{task}-ft{seed}-ckpt-0``: BERT there is the task model's classifier as fine-tuning
initialised it, the one the evaluation scored).

``bundles.json``: {format: 1, keys, bundles: {name: {path, tasks, encoder_dir}}, picks: {task:
{checkpoint, model (the summary's pick, served as such), head, ft_seed, bundle, dev_mean,
selection_mean}}}.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import SettingsError
from bertvision.files import atomic_dir, atomic_write_json
from bertvision.layout import BUNDLE_SET_INDEX, Checkpoint
from bertvision.registry.tasks import get_task
from bertvision.reporting.picks import Pick, read_picks
from bertvision.runtime.precision import Precision
from bertvision.serving.bundle import BundleError
from bertvision.serving.bundle_writer import collect_runs, write_bundle
from bertvision.serving.settings import checked_task_settings

SET_FORMAT = 1
FROZEN = "frozen"


@dataclass(frozen=True)
class CheckpointRun:
    """One fine-tuning run's checkpoint and the heads trained on its states (keys as the rules
    give them: the layout owns the paths)."""

    task: str
    ftseed: int
    checkpoint: Checkpoint
    checkpoint_dir: Path
    heads_dir: Path

    @classmethod
    def from_json(cls, data: dict) -> CheckpointRun:
        """A run as the rule gives it: {task, ftseed, checkpoint (its name), checkpoint_dir, heads_dir}."""
        return cls(
            data["task"],
            int(data["ftseed"]),
            Checkpoint.named(data["checkpoint"]),
            Path(data["checkpoint_dir"]),
            Path(data["heads_dir"]),
        )


def picked_run(pick: Pick, runs: list[CheckpointRun]) -> CheckpointRun:
    """The run that serves ``pick`` (its task, checkpoint and fine-tuning seed), whose heads
    directory holds the picked head."""
    at = [r for r in runs if r.task == pick.task and r.checkpoint == pick.checkpoint and r.ftseed == pick.ft_seed]
    if not at:
        raise BundleError(
            f"{pick.task}: no checkpoint {pick.checkpoint} of fine-tuning seed {pick.ft_seed} among the run's "
            "heads directories"
        )
    run = at[0]
    trained = {t.head for t in collect_runs(get_task(pick.task), [run.heads_dir])}
    if pick.head not in trained:
        raise BundleError(
            f"{pick.task}: the pick {pick.model!r} at checkpoint {pick.checkpoint} is none of the heads trained "
            f"there ({', '.join(sorted(trained))})"
        )
    return run


def bundle_name(run: CheckpointRun, ensemble: bool) -> str:
    """Tasks picked on the untouched encoder share one; a task's own checkpoint, or an ensemble
    (which needs the task's whole model), gets its own."""
    if run.checkpoint.fraction == 0 and not ensemble:
        return FROZEN
    return f"{run.task}-ft{run.ftseed}-ckpt-{run.checkpoint}"


def write_picked_bundles(
    out_dir: Path,
    picks_path: Path,
    backbone: str,
    runs: list[CheckpointRun],
    tokenizer_source: str,
    task_settings: dict[str, dict],
    keys: dict,
    precision: str,
) -> dict:
    """Write the bundles serving every task of ``runs`` as ``picks_path`` (the ``tables``
    stage's picks record) picked it for ``backbone``, and their index, into ``out_dir``
    (replaced); a task with no pick is an error naming it."""
    picks = {p.task: p for p in read_picks(picks_path) if p.backbone == backbone}
    tasks = list(dict.fromkeys(r.task for r in runs))
    unpicked = [t for t in tasks if t not in picks]
    if unpicked:
        raise BundleError(f"{picks_path}: no picked path for {', '.join(unpicked)} (backbone {backbone})")
    groups: dict[str, dict[str, dict]] = {}
    encoder_dirs: dict[str, Path] = {}
    described = {}
    for name in tasks:
        pick = picks[name]
        run = picked_run(pick, runs)
        bundle = bundle_name(run, ensemble=pick.ensemble is not None)
        encoder_dirs.setdefault(bundle, run.checkpoint_dir)
        settings = {**task_settings.get(name, {}), "heads_dirs": [str(run.heads_dir)], "picked": pick.head}
        if pick.ensemble is not None:
            settings.update(ensemble={"head": pick.head, "how": pick.ensemble}, picked=pick.model)
        groups.setdefault(bundle, {})[name] = settings
        described[name] = {
            "checkpoint": pick.checkpoint.name,
            "model": pick.model,
            "head": pick.head,
            "ft_seed": run.ftseed,
            "bundle": bundle,
            "dev_mean": pick.dev_mean,
            "selection_mean": pick.selection_mean,
        }
    with atomic_dir(out_dir) as scratch:
        for bundle, members in sorted(groups.items()):
            write_bundle(
                scratch / bundle,
                encoder_dirs[bundle],
                tokenizer_source,
                members,
                {**keys, "bundle": bundle, "encoder_dir": str(encoder_dirs[bundle])},
                precision,
            )
        index = {
            "format": SET_FORMAT,
            "keys": keys,
            "bundles": {
                b: {"path": b, "tasks": list(members), "encoder_dir": str(encoder_dirs[b])}
                for b, members in sorted(groups.items())
            },
            "picks": described,
        }
        atomic_write_json(index, scratch / BUNDLE_SET_INDEX)
    return index


def serve_picks(
    out: Path,
    picks: Path,
    backbone: str,
    checkpoint_runs: list,
    tokenizer: str,
    precision: Precision,
    task_settings: dict | None = None,
    provenance: dict | None = None,
) -> None:
    """``bertvision serve-bundles``: ``write_picked_bundles`` from the command line's JSON; each
    task's bundle, printed."""
    try:
        runs = [CheckpointRun.from_json(r) for r in checkpoint_runs]
    except (KeyError, TypeError, ValueError) as err:
        raise SettingsError(
            "--checkpoint-runs: each run is {task, ftseed, checkpoint, checkpoint_dir, heads_dir} "
            f"({type(err).__name__}: {err})"
        ) from None
    index = write_picked_bundles(
        out,
        picks,
        backbone,
        runs,
        tokenizer,
        checked_task_settings(task_settings or {}),
        provenance or {},
        precision,
    )
    for task, pick in index["picks"].items():
        print(
            f"{task}: {pick['model']} at checkpoint {pick['checkpoint']}, fine-tuning seed {pick['ft_seed']}: "
            f"bundle {pick['bundle']}"
        )
    print(f"wrote {out}")
