"""Racing the heads of one head-training job (``heads.race.protocol: racing``): successive halving
on the selection split instead of training every head with every seed to its end.

Every head starts with the first seed, in lockstep. At each rung (an epoch count, ``rungs``)
the runs still in the race are ranked by their best selection score so far and only the best
``keep`` share (at least one) goes on; the others stop there, their best epoch so far their
result. After the last rung the survivors train to their end, and only they are then trained
with the other seeds, so every head the summary can pick has all its seeds. A run that stopped
early (patience) before a rung still takes part in its ranking with its best score.

A survivor's first-seed run is exactly the run the grid trains (same batch order, same
schedule over its whole ``max_epochs``): racing only stops runs, it never changes one. The heads
in ``finish`` (those another experiment reads from this job: the shared encoders' heads) are
never stopped and take no place among the kept: the others race as they would without them."""

from __future__ import annotations

import math

from bertvision.training.loop import Lockstep, RunState


def race(
    groups: list[Lockstep], rungs: tuple[int, ...], keep: float, finish: frozenset[str] = frozenset()
) -> list[RunState]:
    """Run the race over every run of ``groups`` (lockstep groups of one job, each with its own
    problem or batch size); return the survivors, in the groups' order. Ties keep the earlier run;
    the runs of the heads named in ``finish`` are never stopped."""
    runs = [state for group in groups for state in group.states]
    for rung in sorted(set(rungs)):
        for group in groups:
            group.advance(rung)
        standing = [state for state in runs if state.raced_out_at is None and state.run.name not in finish]
        ranked = sorted(standing, key=lambda state: state.best["score"], reverse=True)
        for state in ranked[max(1, math.ceil(keep * len(standing))) :]:
            state.race_out(rung)
    for group in groups:
        group.advance()
    return [state for state in runs if state.raced_out_at is None]
