"""How a task declared from a Hugging Face dataset (``tasks.<name>.hub``) reads its rows. The
dataset id, its config and its split names are the ``TaskSpec``'s own ``hub_id``,
``hub_config`` and ``hub_splits``, as for a registered task."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HubLayout:
    """A declared hub task's text columns and label column (``answers`` for a question task, whose
    rows are shaped as rajpurkar/squad_v2's), and the dataset revision it reads (None: the default
    branch)."""

    text_columns: tuple[str, ...]
    label_column: str
    revision: str | None = None
