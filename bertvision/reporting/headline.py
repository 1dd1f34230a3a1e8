"""What a finished run prints last: each task's verdict in one sentence (the summary's, with its
Markdown taken off), and where the whole summary is, so that `make run` ends on its answer."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from bertvision.reporting.verdict import verdict

# a sentence ends at a full stop before a capital letter (not inside a figure such as 2.7)
SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")


def headline(table: pd.DataFrame) -> list[str]:
    """Per backbone and task of a summary table: "task (backbone): the verdict's first sentence"."""
    lines = []
    for (backbone, task), block in table.groupby(["backbone", "task"], sort=True):
        first = SENTENCE_END.split(verdict(block), maxsplit=1)[0]
        lines.append(f"{task} ({backbone}): {first.replace('**', '').replace('`', '')}")
    return lines


def print_headline(summary_csv: str | Path, summary_md: str | Path, since: float) -> None:
    """Print the headline of the summary if the run made it (written after ``since``, a time):
    an older one may not say what the run's settings give."""
    path = Path(summary_csv)
    if not path.exists() or path.stat().st_mtime < since:
        return
    lines = headline(pd.read_csv(summary_csv))
    if lines:
        print(f"\nThe verdicts ({summary_md} has every method, its cost and the reasons):")
        print("\n".join(f"  {line}" for line in lines))
