"""Where a head-training job gets its hidden states: a feature manifest (stored features) or a
``StreamSource`` (``store: false``: the frozen checkpoint runs in the job; ``features/streamed.py``).
Kept free of torch so that the command line parses sources cheaply."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertvision.config.settings import ExtractCompute, ExtractSettings

# What a manifest (and every head record through it) keeps of its shards' attributes
SOURCE_KEYS = ("model", "task", "checkpoint", "ft_seed", "encoder", "pair_forms")


@dataclass(frozen=True)
class StreamSource:
    """A checkpoint's frozen encoder over a task's tokenized splits. ``attrs``: what a feature
    shard would have recorded (``Workflow.extract_attrs``)."""

    checkpoint: str
    tokens_dir: str
    settings: ExtractSettings
    compute: ExtractCompute
    attrs: dict

    def to_json(self) -> str:
        return json.dumps(
            {
                "checkpoint": self.checkpoint,
                "tokens_dir": self.tokens_dir,
                "settings": json.loads(self.settings.to_json()),
                "compute": json.loads(self.compute.to_json()),
                "attrs": self.attrs,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> StreamSource:
        d = json.loads(text)
        return cls(
            d["checkpoint"],
            d["tokens_dir"],
            ExtractSettings.from_dict(d["settings"], "--features"),
            ExtractCompute.from_dict(d["compute"], "--features"),
            d["attrs"],
        )

    @property
    def level(self) -> str:
        """'tokens' (span tasks, or example tasks with token_features) or 'cls'."""
        return self.attrs.get("features") or ("tokens" if self.attrs["label_kind"] == "span" else "cls")


def feature_source(text: str):
    """A command-line feature source: a manifest path, or a StreamSource as JSON."""
    return StreamSource.from_json(text) if text.lstrip().startswith("{") else Path(text)
