"""Load a task split from the Hugging Face hub (or a local dataset repository with the same
layout, which is how the tests exercise this path offline)."""

from __future__ import annotations

import pandas as pd

from bertvision.data.glue_files import canonical_frame
from bertvision.errors import DataFormatError
from bertvision.registry.tasks import TaskSpec


def load_hub_split(task: TaskSpec, split: str, repo: str | None = None) -> pd.DataFrame:
    import datasets

    repo = repo or task.hub_id
    hub_split = task.hub_splits[split]
    ds = datasets.load_dataset(repo, task.hub_config, split=hub_split)
    df = ds.to_pandas()
    where = f"{repo}/{task.hub_config} split {hub_split}"
    # nyu-mll/glue names its columns as our canonical text fields.
    missing = [c for c in (*task.text_fields, "label") if c not in df.columns]
    if missing:
        raise DataFormatError(f"{where}: missing column(s) {missing}; has {list(df.columns)}")
    if task.kind == "classification":
        bad = ~df["label"].between(0, task.num_labels - 1)
        if bad.any():
            row = int(bad.idxmax())
            raise DataFormatError(
                f"{where}: row {row}: label {df['label'].iloc[row]} outside 0..{task.num_labels - 1} "
                "(GLUE test splits have no labels)"
            )
    for name in task.text_fields:
        empty = df[name].isna() | (df[name].astype(str).str.strip() == "")
        if empty.any():
            raise DataFormatError(f"{where}: row {int(empty.idxmax())}: empty text in column {name!r}")
    df["idx"] = df["idx"] if "idx" in df.columns else range(len(df))
    return canonical_frame(df, task)
