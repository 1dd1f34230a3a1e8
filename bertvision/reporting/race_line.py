"""The summary's lines on how the pick was raced: among the heads of each job, and between
checkpoints (``stages.race``'s decisions)."""

from __future__ import annotations

import pandas as pd


def checkpoint_race_line(decisions: list[dict]) -> str:
    """Where the race between checkpoints stopped fine-tuning (``stages.race``'s decisions of one
    backbone and task, in checkpoint order); empty under the grid."""
    if not decisions:
        return ""
    steps = []
    for d in decisions:
        best = d["best"]
        score = f"{best['candidate']} {best['selection']:.3f}" if best else "no head scored"
        steps.append(f"{d['checkpoint']} ({score})")
    last = decisions[-1]
    end = (
        "every configured checkpoint ran"
        if last["last"]
        else f"fine-tuning stopped after checkpoint {last['checkpoint']} ({last['why']})"
    )
    return f"Checkpoints raced (the best candidate's mean selection score): {' → '.join(steps)}; {end}."


def head_selection_line(table: pd.DataFrame) -> str:
    """How the heads were chosen among (``heads.race``), and what the race stopped."""
    if table.empty or "head_selection" not in table:
        return ""
    blocks = table.drop_duplicates(["backbone", "task"])
    if not (blocks["head_selection"] == "racing").any():
        return "Head selection: grid (every head, head seed and checkpoint trained to its end)."
    stopped, runs = int(blocks["raced_out_runs"].sum()), int(blocks["head_runs"].sum())
    return (
        f"Head selection: racing (successive halving on the selection split): {stopped} of {runs} head runs were "
        "stopped by the race; they count in the whole cost and are never picked."
    )
