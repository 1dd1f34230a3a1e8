"""The choice: per backbone and task, the BERTVision path that ranks first on selection
(``reporting.ranking``) and the fine-tuning seed that serves it, from every run the tables
read. The summary renders what this chooses; ``picks.json`` (``reporting.picks``) records it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bertvision.layout import Checkpoint
from bertvision.reporting.candidates import FULL_FT, SEED_AGGREGATES, sample_std
from bertvision.reporting.picks import Pick
from bertvision.reporting.ranking import Candidate, difference_error, frame_candidates, ranked


def over_seeds(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs averaged over seeds, per (kind, checkpoint, model)."""
    keys = ["kind", "checkpoint", "model"]
    g = runs.groupby(keys, sort=False, dropna=False)  # full fine-tuning has no checkpoint
    out = g.agg(
        **SEED_AGGREGATES,
        selection_std=("selection", sample_std),
        seconds=("seconds", "mean"),
        seconds_std=("seconds", sample_std),
        whole_seconds=("whole_seconds", lambda v: v.mean(skipna=False)),
        whole_seconds_std=("whole_seconds", sample_std),
        feature_bytes=("feature_bytes", "mean"),
        device=("device", "first"),
        precision=("precision", "first"),
        **({"pair": ("pair", "first")} if "pair" in runs else {}),
        **({"searched": ("searched", "any")} if "searched" in runs else {}),
        # each run's eval predictions file (None: not kept), for the summary's paired bootstrap
        **({"predictions": ("predictions", tuple)} if "predictions" in runs else {}),
        # the fine-tuning seeds behind a row (0: none, full fine-tuning's and BERT's own rows)
        ft_seeds=("ft_seed", "nunique") if "ft_seed" in runs else ("dev", lambda v: 0),
        **({"raced_out": ("raced_out", lambda v: bool(v.isin([True]).any()))} if "raced_out" in runs else {}),
        **(
            {"deterministic": ("deterministic", lambda v: bool(v.isin([True]).all()))}
            if "deterministic" in runs
            else {}
        ),
    ).reset_index()
    if "kept_epoch" in runs:  # full fine-tuning: name the row by the epochs each seed kept
        full = runs[runs["kind"] == FULL_FT]
        if len(full):
            kept = ", ".join(str(int(e)) for e in full["kept_epoch"])
            out.loc[out["kind"] == FULL_FT, "model"] = f"BERT, epoch kept of {int(full['epochs'].iloc[0])}: {kept}"
    return out


def path_candidates(configs: pd.DataFrame) -> list[Candidate]:
    return frame_candidates(configs, "model", "selection_mean", "trainable_params", "checkpoint", "selection_std", "n")


def pick(configs: pd.DataFrame) -> pd.Series | None:
    """The row that ranks first (``reporting.ranking``): the best mean selection score, unless it
    needs a later checkpoint than a path within its noise; ties go to fewer trainable parameters,
    then the earlier checkpoint, then the name (never to a dev score or a time). A head the race
    stopped in any of its jobs is no candidate (a seed cut short)."""
    order = ranked(path_candidates(configs))
    return configs.loc[order[0].ref] if order else None


def ranks_before(a: pd.Series, b: pd.Series) -> bool:
    """Whether row ``a`` ranks before row ``b`` of one block as ``pick`` ranks them (selection score
    rounded as the ranking rounds it, then fewer trainable parameters, ...)."""
    order = ranked(path_candidates(pd.DataFrame([a, b])))
    return bool(order) and order[0].ref == a.name


def passed_over(configs: pd.DataFrame) -> tuple[pd.Series, float] | None:
    """The path with the best mean selection score when the pick is another, at an earlier
    checkpoint within its noise, with the standard error of their difference; else None."""
    candidates = [c for c in path_candidates(configs) if c.eligible]
    order = ranked(candidates)
    if not order:
        return None
    top = min(candidates, key=Candidate.key)
    return None if top is order[0] else (configs.loc[top.ref], difference_error(top, order[0]))


def counted_once(block: pd.DataFrame) -> pd.DataFrame:
    """A block's runs with the untouched encoder's head runs repeated for every fine-tuning seed
    counted once."""
    return block[block["repeat"] != True] if "repeat" in block else block  # noqa: E712


def bertvision_paths(configs: pd.DataFrame) -> pd.DataFrame:
    """The BERTVision paths among a block's configurations: every head and head + BERT ensemble."""
    return configs[configs["kind"].isin(["head", "ensemble"])]


def served_seed(block: pd.DataFrame, kind: str, model: str, checkpoint: Checkpoint) -> int:
    """The fine-tuning seed whose run of the path served (``kind`` ``model``: a head, or a head + BERT
    ensemble, scored as the ensemble) at ``checkpoint`` scored best on the selection split (its best
    head seed; a missing score never wins; ties: the lower seed)."""
    runs = block[(block["kind"] == kind) & (block["model"] == model) & (block["checkpoint"] == checkpoint.fraction)]
    best = runs.assign(score=runs["selection"].fillna(-np.inf)).groupby("ft_seed")["score"].max()
    return int(best[best == best.max()].index.min())


def choose_picks(runs: pd.DataFrame) -> list[Pick]:
    """Per backbone and task, the path with the best mean selection score (``pick``) and the
    fine-tuning seed to serve it from: the record the summary and serve-bundles read."""
    picks = []
    if runs.empty:
        return picks
    for (backbone, task), block in runs.groupby(["backbone", "task"], sort=True):
        picked = pick(bertvision_paths(over_seeds(counted_once(block))))
        if picked is None:
            continue
        checkpoint = Checkpoint(picked["checkpoint"])
        made = block[
            (block["kind"] == picked["kind"])
            & (block["model"] == picked["model"])
            & (block["checkpoint"] == checkpoint.fraction)
        ].iloc[0]
        ensemble = made["ensemble"] if picked["kind"] == "ensemble" else None
        picks.append(
            Pick(
                backbone,
                task,
                checkpoint,
                picked["model"],
                made["head"],
                ensemble,
                served_seed(block, picked["kind"], picked["model"], checkpoint),
                float(picked["selection_mean"]),
                float(picked["dev_mean"]),
            )
        )
    return picks
