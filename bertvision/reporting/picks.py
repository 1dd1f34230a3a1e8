"""The pick: for each backbone and task, the BERTVision path the summary chooses (checkpoint,
head, alone or with BERT) and the fine-tuning seed that serves it, as a record of its own.
The ``tables`` stage writes it where the choice is made (``reporting.choice.choose_picks``);
the summary table renders its picked rows from it and ``serve-bundles`` serves it.

``picks.json``: {format: 1, picks: [{backbone, task, checkpoint (its name: "0", "0.3", "1"),
model (the summary's name: the head, or "head + BERT (rule)"), head, ensemble (the rule that
combines BERT's outputs with the head's; null: the head alone), ft_seed, selection_mean,
dev_mean}, ...]}, in the summary's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import DataFormatError
from bertvision.files import atomic_write_json, read_json
from bertvision.layout import Checkpoint

PICKS_FORMAT = 1


@dataclass(frozen=True)
class Pick:
    """A task's picked path on one backbone. ``selection_mean`` and ``dev_mean``: the path's
    mean over seeds; ``ft_seed``: the fine-tuning seed whose run of ``head`` at ``checkpoint``
    scored best on the selection split (ties: the lower seed), the one served."""

    backbone: str
    task: str
    checkpoint: Checkpoint
    model: str
    head: str
    ensemble: str | None
    ft_seed: int
    selection_mean: float
    dev_mean: float

    def to_json(self) -> dict:
        return {
            "backbone": self.backbone,
            "task": self.task,
            "checkpoint": self.checkpoint.name,
            "model": self.model,
            "head": self.head,
            "ensemble": self.ensemble,
            "ft_seed": self.ft_seed,
            "selection_mean": self.selection_mean,
            "dev_mean": self.dev_mean,
        }

    @classmethod
    def from_json(cls, data: dict) -> Pick:
        return cls(
            str(data["backbone"]),
            str(data["task"]),
            Checkpoint.named(data["checkpoint"]),
            str(data["model"]),
            str(data["head"]),
            data["ensemble"],
            int(data["ft_seed"]),
            float(data["selection_mean"]),
            float(data["dev_mean"]),
        )


def write_picks(picks: list[Pick], path: Path) -> None:
    atomic_write_json({"format": PICKS_FORMAT, "picks": [p.to_json() for p in picks]}, path)


def read_picks(path: Path) -> list[Pick]:
    """The picks the ``tables`` stage wrote to ``path``; a file that is not such a record is an
    error naming it."""
    try:
        data = read_json(path)
        if data.get("format") != PICKS_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {PICKS_FORMAT}")
        return [Pick.from_json(p) for p in data["picks"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataFormatError(f"{path}: not a picks record ({type(err).__name__}: {err})") from None
