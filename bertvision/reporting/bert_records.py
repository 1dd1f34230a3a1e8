"""BERT's own records at the checkpoints, as the tables read them."""

from __future__ import annotations


def is_scored(record: dict) -> bool:
    """Whether a BERT record holds scores: at checkpoint 0, whose head has not trained, the tables
    read its training record (its seconds and device), which holds none."""
    return record.get("metrics") is not None
