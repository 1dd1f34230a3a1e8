"""The ``cross_task`` stage: the cross-task transfer table (Markdown, CSV) and its heatmap, from
the heads trained on every shared encoder's states and the heads applied as they are."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bertvision.files import atomic_path
from bertvision.layout import SharedEncoder, table
from bertvision.reporting.cross_task import (
    cross_task_heatmap,
    cross_task_markdown,
    cross_task_table,
    head_runs_on_encoders,
    heads_applied_as_is,
)
from bertvision.reporting.markdown import write_csv, write_text

TABLE_NAME = "cross_task"


def build_cross_task(
    encoders: list[dict],
    models: list[str],
    ft_seeds: list[int],
    task_heads: dict[str, list[str]],
    epochs: dict[str, float],
    out_dir: Path,
    plot: Path,
    transfer_files: list[Path] = (),
) -> pd.DataFrame:
    """``encoders``: the shared encoders as records; ``task_heads``: task -> the head names trained on
    them; ``epochs``: mixture name -> its epochs."""
    runs = pd.concat(
        [
            head_runs_on_encoders([SharedEncoder.from_json(e) for e in encoders], models, ft_seeds, task_heads, epochs),
            heads_applied_as_is(transfer_files),
        ],
        ignore_index=True,
    )
    frame = cross_task_table(runs)
    write_csv(frame, table(TABLE_NAME, "csv", out_dir))
    write_text(cross_task_markdown(frame), table(TABLE_NAME, "md", out_dir))
    with atomic_path(Path(plot)) as tmp:
        cross_task_heatmap(frame, tmp)
    return frame
