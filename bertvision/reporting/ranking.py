"""The one ranking of candidates: a head or head + BERT ensemble at a checkpoint, and, in the
verdict, full fine-tuning and the peers. The race's checkpoint decisions, the summary's pick, the
verdict's best other method, the cross-task table and every bundle writer rank with it.

A candidate counts only when every run of it ran to its end: a head the race stopped in any of
its jobs (one fine-tuning seed's job may stop a head that another's keeps) is no candidate
anywhere, because what the race stopped has a seed cut short and the pick averages over seeds.
The race thus goes on, or stops, on the same candidate the pick then takes, and no bundle serves
a head the race stopped. Among the others: the best mean selection score; ties go to fewer
trainable parameters, then the earlier checkpoint, then the name; a missing score or size comes
last (never a dev score or a time).

Further fine-tuning has to pay for itself: when the best candidate comes from a later checkpoint
than another's best, it ranks first only if its mean selection score is above that one's by more
than the standard error of their difference (over their runs); else the earliest checkpoint's
best within that noise does (the one-standard-error rule, with the fine-tuning a path needs as
its cost). The race goes on when it cannot tell a gain from noise (``stages.race``); the pick
does not pay for a gain it cannot tell from noise."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from bertvision.registry.task_spec import TaskSpec
from bertvision.reporting.results import ensemble_name, ensemble_parameters, raced_out

SCORE_DIGITS = 9


def _last_if_missing(value) -> tuple:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return (1, 0.0) if missing else (0, float(value))


@dataclass(frozen=True)
class Candidate:
    name: str
    selection: float  # mean selection score over its runs
    parameters: float  # trainable parameters
    checkpoint: float | None = None  # epochs of fine-tuning its states come from (None: not a head path)
    raced_out: bool = False  # some run of it was stopped by the race
    runs: int = 1
    std: float = field(
        default=math.nan, compare=False
    )  # sample std of its selection scores over its runs (NaN: one run)
    ref: object = field(default=None, compare=False)  # what the caller ranks (a row's index)

    @property
    def standard_error(self) -> float:
        """Of its mean selection score over its runs (0 with one run: unmeasured)."""
        return 0.0 if math.isnan(self.std) else self.std / math.sqrt(self.runs)

    @property
    def eligible(self) -> bool:
        return not self.raced_out and not math.isnan(self.selection)

    def key(self) -> tuple:
        # Means of the same scores summed in another order (pandas in the pick, Python in the race)
        # differ in the last bits: rounded, such a tie is a tie everywhere.
        return (
            _last_if_missing(-round(self.selection, SCORE_DIGITS)),
            _last_if_missing(self.parameters),
            _last_if_missing(self.checkpoint),
            self.name,
        )


def _has_checkpoint(candidate: Candidate) -> bool:
    return candidate.checkpoint is not None and not math.isnan(candidate.checkpoint)


def difference_error(a: Candidate, b: Candidate) -> float:
    """The standard error of the difference of their mean selection scores."""
    return math.hypot(a.standard_error, b.standard_error)


def ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The eligible candidates, best first: the first an earlier checkpoint's best whose score is
    within noise of a later checkpoint's better one (see the module's docstring)."""
    order = sorted((c for c in candidates if c.eligible), key=Candidate.key)
    if not order or not _has_checkpoint(order[0]):
        return order
    top, earlier = order[0], {}
    for candidate in order:  # the first of a checkpoint is its best
        if _has_checkpoint(candidate) and candidate.checkpoint < top.checkpoint:
            earlier.setdefault(candidate.checkpoint, candidate)
    for checkpoint in sorted(earlier):
        if top.selection - earlier[checkpoint].selection <= difference_error(top, earlier[checkpoint]):
            return [earlier[checkpoint], *(c for c in order if c is not earlier[checkpoint])]
    return order


def best(candidates: Iterable[Candidate]) -> Candidate | None:
    order = ranked(candidates)
    return order[0] if order else None


def frame_candidates(
    frame: pd.DataFrame,
    name: str,
    selection: str,
    parameters: str,
    checkpoint: str | None = None,
    std: str | None = None,
    runs: str | None = None,
) -> list[Candidate]:
    """A candidate per row of ``frame`` (with these columns, and ``raced_out`` where the race
    ran), its ``ref`` the row's index."""
    return [
        Candidate(
            str(row[name]),
            float(row[selection]),
            row[parameters],
            row[checkpoint] if checkpoint else None,
            raced_out=row.get("raced_out") in (True,),  # NaN or None where no race ran
            # frames of methods with no checkpoint (the verdict's rival) need no spread
            runs=int(row.get(runs, 1)) if runs else 1,
            std=float(row.get(std, math.nan)) if std else math.nan,
            ref=index,
        )
        for index, row in frame.iterrows()
    ]


def ranked_frame(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The rows of ``frame`` that rank, best first (``columns``: ``frame_candidates``' names)."""
    return frame.loc[[c.ref for c in ranked(frame_candidates(frame, *columns))]]


def head_candidates(task: TaskSpec, records: list[dict], checkpoint: float | None = None) -> list[Candidate]:
    """Every head and head + BERT ensemble in these head records (the runs of one checkpoint,
    over its fine-tuning and head seeds), each over all its runs."""
    runs: dict[str, list[tuple[float, dict]]] = {}
    for record in records:
        runs.setdefault(record["head"], []).append((task.primary_score(record["metrics"], "selection"), record))
        for how, metrics in (record.get("ensembles") or {}).items():
            name = ensemble_name(record["head"], how)
            runs.setdefault(name, []).append((task.primary_score(metrics, "selection"), record))
    out = []
    for name, scored in runs.items():
        records_of = [r for _, r in scored]
        ensemble = name != records_of[0]["head"]
        scores = [s for s, _ in scored]
        mean = float(sum(scores) / len(scores))
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1)) if len(scores) > 1 else math.nan
        out.append(
            Candidate(
                name,
                mean,
                ensemble_parameters(records_of[0]) if ensemble else records_of[0]["parameters"],
                checkpoint,
                raced_out=any(raced_out(r) for r in records_of),
                runs=len(scored),
                std=std,
            )
        )
    return out
