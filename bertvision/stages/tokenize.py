"""The ``tokenize`` stage: the backbone's fast tokenizer, sentence pairs where the task has two
texts, truncation at the task's max length, no padding stored."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from bertvision.config.settings import TokenizeSettings
from bertvision.data.squad_windows import build_windows
from bertvision.data.token_ids import tokenize_apart, tokenize_frame
from bertvision.errors import ConfigError
from bertvision.files import atomic_write_parquet
from bertvision.layout import split_file, texts_file
from bertvision.models.backbone import load_tokenizer
from bertvision.models.encoder_io import load_model_config, summary_position, uses_token_types
from bertvision.registry.metrics import question_gold
from bertvision.registry.task_spec import TaskSpec, splits_of

log = logging.getLogger(__name__)


def answerability_windows(df: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Span windows as classification rows: ``idx`` is the window's question, ``label`` 1 where
    the window holds no whole answer (the question has none, or it lies elsewhere)."""
    return pd.DataFrame(
        {
            "idx": df["idx"].to_numpy()[windows["example"].to_numpy()],
            "input_ids": windows["input_ids"],
            "token_type_ids": windows["token_type_ids"],
            "length": windows["length"].astype(np.int32),
            "label": ((windows["start"] == 0) & (windows["end"] == 0)).astype(np.int64).to_numpy(),
        }
    )


def answer_in_no_window(df: pd.DataFrame, rows: pd.DataFrame) -> int:
    """Answerable questions none of whose windows holds the whole answer (a doc_stride shorter
    than the answer): every window of theirs trains as "no answer", but they are scored as the
    answerable questions they are."""
    holds = set(rows.loc[rows["label"] == 0, "idx"].tolist())
    return sum(1 for idx, no_answer in question_gold(df).items() if not no_answer and idx not in holds)


def check_windows_fit(task: TaskSpec, df: pd.DataFrame, tokenizer, max_length: int, stride: int, split: str) -> None:
    """A window holds the question, the special tokens and at least one context token more than
    the stride that the next window repeats; else the tokenizer cannot cut the context."""
    questions = [q.lstrip() for q in df["question"]]
    longest = max((len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]), default=0)
    room = max_length - longest - tokenizer.num_special_tokens_to_add(pair=True)
    if room <= stride:
        raise ConfigError(
            f"tasks.{task.name}: doc_stride {stride} does not fit: the longest {split} question takes {longest} "
            f"tokens, which leaves {room} context tokens per window of max_length {max_length}; set "
            f"tasks.{task.name}.doc_stride below {max(room, 1)} or raise tasks.{task.name}.max_length"
        )


def tokenize_task(task: TaskSpec, settings: TokenizeSettings, raw_dir: Path, out_dir: Path) -> dict:
    """Every split of the task: examples (or, for span tasks, context windows) as token ids."""
    tokenizer = load_tokenizer(settings.backbone)
    summary_position(tokenizer)
    token_types = uses_token_types(tokenizer, load_model_config(settings.backbone))
    max_length = settings.max_length
    stats = {}
    for split in splits_of(task):
        df = pd.read_parquet(split_file(raw_dir, split))
        if task.windowed:
            check_windows_fit(task, df, tokenizer, max_length, settings.doc_stride, split)
        if task.kind == "span":
            tokens = build_windows(df, tokenizer, max_length, settings.doc_stride)
        elif task.answerability:
            tokens = answerability_windows(df, build_windows(df, tokenizer, max_length, settings.doc_stride))
        else:
            tokens = tokenize_frame(df, task, tokenizer, max_length)
        texts = None
        if task.two_texts:  # each distinct text alone too, for the heads that read a pair apart
            texts, sides = tokenize_apart(df, task, tokenizer, max_length)
            tokens["text_a"], tokens["text_b"] = sides[:, 0], sides[:, 1]
        if not token_types:  # the encoder takes none (RoBERTa, DistilBERT): collate sends none
            tokens = tokens.drop(columns="token_type_ids")
            texts = None if texts is None else texts.drop(columns="token_type_ids")
        if texts is not None:
            atomic_write_parquet(texts, texts_file(out_dir, split))
            log.info("%s/%s: %d distinct texts for %d pairs, each encoded alone", task.name, split, len(texts), len(df))
        truncated = int((tokens["length"] >= max_length).sum())
        stats[split] = {
            "rows": len(tokens),
            **(
                {"questions": len(df), "answerable_without_whole_answer_window": answer_in_no_window(df, tokens)}
                if task.answerability
                else {}
            ),
            "mean_length": float(tokens["length"].mean()),
            "max_length": int(tokens["length"].max()),
            "at_max_length": truncated,
        }
        log.info("%s/%s: %s", task.name, split, stats[split])
        atomic_write_parquet(tokens, split_file(out_dir, split))
    return stats
