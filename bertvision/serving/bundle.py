"""A serving bundle: one encoder checkpoint, its tokenizer and the heads of several tasks that
were trained on that encoder's hidden states, in one directory::

    bundle.json                   what is in it (below)
    encoder/                      the bare encoder (model.safetensors, config.json) and its tokenizer
    heads/{task}/{head}/          head.safetensors + metrics.json of the seed kept for each head

``bundle.json``: {format: 1, keys (provenance: backbone, encoder, ft_seed, ...), precision (the
extraction precision the heads' features were computed at, reproduced when serving), layers,
hidden, tasks: {task: {kind, text_fields, label_names, primary_metric, eval_splits, max_length,
doc_stride, max_answer_length, n_best, feature_level ("cls" or "tokens"), picked (the default
head), heads: {head: {path, seed, seeds, spec, level, parameters, mean_selection_score,
selection_metrics, eval_metrics {split: metrics}, null_threshold (span heads), source}}}}}.

Per task and head name the seed with the best selection score is kept (ties: the lower seed);
the task's default head is the one with the best mean selection score over its seeds (ties:
fewer parameters, then the name). Every choice reads the selection split only.

Weights are read as safetensors only (never pickle) and no remote code is ever run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import BertvisionError
from bertvision.layout import BUNDLE_ENCODER, BUNDLE_HEAD, BUNDLE_INDEX, HEAD_METRICS, HEAD_WEIGHTS, head_runs
from bertvision.models.backbone import missing_safetensors
from bertvision.registry.heads import is_token_head
from bertvision.registry.tasks import TaskSpec, get_task
from bertvision.runtime.io import atomic_write_json, read_json

FORMAT = 1
ENCODER_FILES = ("config.json", "model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")


class BundleError(BertvisionError, ValueError):
    """A bundle (or what it is built from) is missing a file or is inconsistent; names the file."""


@dataclass(frozen=True)
class HeadEntry:
    name: str
    dir: Path  # holds HEAD_WEIGHTS and HEAD_METRICS
    seed: int
    seeds: tuple[int, ...]  # every seed trained; ``seed`` is the one kept
    spec: dict
    level: str  # "cls" ([CLS] of every layer) or "tokens" (every real token)
    parameters: int
    mean_selection_score: float
    selection_metrics: dict
    eval_metrics: dict  # eval split -> metrics
    null_threshold: float | None  # span heads: tuned on the selection split
    source: dict

    def summary(self) -> dict:
        return {"seed": self.seed, "seeds": list(self.seeds), "spec": self.spec, "level": self.level,
                "parameters": self.parameters, "mean_selection_score": self.mean_selection_score,
                "selection_metrics": self.selection_metrics, "eval_metrics": self.eval_metrics}


@dataclass(frozen=True)
class TaskEntry:
    name: str
    kind: str  # "classification" | "regression" | "span"
    text_fields: tuple[str, ...]
    label_names: tuple[str, ...]
    primary_metric: str
    max_length: int
    doc_stride: int | None
    max_answer_length: int | None
    n_best: int | None
    feature_level: str
    picked: str
    heads: dict[str, HeadEntry]

    @property
    def outputs(self) -> int:
        return {"regression": 1, "span": 2}.get(self.kind, len(self.label_names))

    @property
    def is_span(self) -> bool:
        return self.kind == "span"


@dataclass(frozen=True)
class Bundle:
    root: Path
    keys: dict
    precision: str
    layers: int
    hidden: int
    tasks: dict[str, TaskEntry]

    @property
    def encoder_dir(self) -> Path:
        return self.root / BUNDLE_ENCODER


# --- writing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadRun:
    """One trained head (a ``train_heads`` run directory) and its metrics record."""

    dir: Path
    record: dict

    @property
    def head(self) -> str:
        return self.record["head"]

    @property
    def seed(self) -> int:
        return int(self.record["seed"])


def selection_score(task: TaskSpec, run: HeadRun) -> float:
    """The primary metric on the selection split; -inf where it is missing, so it never wins."""
    score = task.primary_score(run.record.get("metrics", {}), "selection")
    return -math.inf if math.isnan(score) else score


def keep_best_seeds(task: TaskSpec, runs: list[HeadRun]) -> dict[str, HeadRun]:
    """Head name -> its run with the best selection score (ties: the lower seed)."""
    kept: dict[str, HeadRun] = {}
    for run in sorted(runs, key=lambda r: (r.head, r.seed)):
        best = kept.get(run.head)
        if best is None or selection_score(task, run) > selection_score(task, best):
            kept[run.head] = run
    return kept


def mean_selection_scores(task: TaskSpec, runs: list[HeadRun]) -> dict[str, float]:
    by_head: dict[str, list[float]] = {}
    for run in runs:
        by_head.setdefault(run.head, []).append(selection_score(task, run))
    return {head: sum(scores) / len(scores) for head, scores in by_head.items()}


def pick_default_head(means: dict[str, float], parameters: dict[str, int]) -> str:
    """The best mean selection score; ties: fewer parameters, then the name."""
    return min(means, key=lambda head: (-means[head], parameters[head], head))


def collect_runs(task: TaskSpec, heads_dirs: list[Path]) -> list[HeadRun]:
    runs: list[HeadRun] = []
    seen: dict[tuple[str, int], Path] = {}
    for heads_dir in heads_dirs:
        if not Path(heads_dir).is_dir():
            raise BundleError(f"{heads_dir}: no such heads directory (a train_heads output) for task {task.name}")
        found = head_runs(heads_dir)
        if not found:
            raise BundleError(f"{heads_dir}: no trained heads ({{head}}/seed{{seed}}/{HEAD_METRICS}) for {task.name}")
        for run_dir in found:
            record = read_json(run_dir / HEAD_METRICS)
            if record.get("task") != task.name:
                raise BundleError(f"{run_dir / HEAD_METRICS}: a head of task {record.get('task')!r}, "
                                  f"given for {task.name}")
            if not (run_dir / HEAD_WEIGHTS).exists():
                raise BundleError(f"{run_dir / HEAD_WEIGHTS}: missing")
            run = HeadRun(run_dir, record)
            if (run.head, run.seed) in seen:
                raise BundleError(f"{task.name}: head {run.head} seed {run.seed} is in both {seen[run.head, run.seed]} "
                                  f"and {run_dir}; give each trained head once")
            seen[run.head, run.seed] = run_dir
            runs.append(run)
    return runs


def head_level(task: TaskSpec, spec: dict) -> str:
    return "tokens" if task.kind == "span" or is_token_head(spec) else "cls"


def null_threshold(run: HeadRun) -> float | None:
    threshold = run.record.get("metrics", {}).get("selection", {}).get("null_threshold")
    return None if threshold is None else float(threshold)


def head_entry_json(task: TaskSpec, run: HeadRun, seeds: list[int], mean: float) -> dict:
    record = run.record
    threshold = null_threshold(run)
    if task.kind == "span" and threshold is None:
        raise BundleError(f"{run.dir / HEAD_METRICS}: no metrics.selection.null_threshold (span heads need the "
                          "threshold tuned on the selection split)")
    return {
        "path": BUNDLE_HEAD.format(task=task.name, head=run.head),
        "seed": run.seed,
        "seeds": sorted(seeds),
        "spec": record["head_spec"],
        "level": head_level(task, record["head_spec"]),
        "parameters": int(record["parameters"]),
        "mean_selection_score": mean if math.isfinite(mean) else None,
        "selection_metrics": record["metrics"].get("selection", {}),
        "eval_metrics": {split: record["metrics"][split] for split in task.eval_splits if split in record["metrics"]},
        "null_threshold": threshold,
        "source": record.get("source", {}),
    }


def task_json(task: TaskSpec, settings: dict, runs: list[HeadRun]) -> dict:
    kept = keep_best_seeds(task, runs)
    means = mean_selection_scores(task, runs)
    seeds: dict[str, list[int]] = {}
    for run in runs:
        seeds.setdefault(run.head, []).append(run.seed)
    heads = {head: head_entry_json(task, run, seeds[head], means[head]) for head, run in sorted(kept.items())}
    picked = pick_default_head(means, {h: e["parameters"] for h, e in heads.items()})
    span = task.span
    doc_stride = settings.get("doc_stride") or (span.doc_stride if span else None)
    return {
        "kind": task.kind,
        "text_fields": list(task.text_fields),
        "label_names": list(task.label_names),
        "primary_metric": task.primary_metric,
        "eval_splits": list(task.eval_splits),
        "max_length": int(settings.get("max_length") or task.max_length),
        "doc_stride": int(doc_stride) if span else None,
        "max_answer_length": span.max_answer_length if span else None,
        "n_best": span.n_best if span else None,
        "feature_level": "tokens" if any(e["level"] == "tokens" for e in heads.values()) else "cls",
        "picked": picked,
        "heads": heads,
    }


def check_safetensors_dir(folder: Path, what: str) -> None:
    """``folder`` must hold model.safetensors (or its shard index); a pickle-only folder is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BundleError(f"{folder}: no such {what} directory")
    if not (folder / "config.json").exists():
        raise BundleError(f"{folder / 'config.json'}: missing ({what})")
    problem = missing_safetensors(folder)
    if problem:
        raise BundleError(f"{problem} ({what})")


def save_bare_encoder(encoder_dir: Path, tokenizer_source: str, out: Path) -> tuple[int, int]:
    """The encoder of ``encoder_dir`` (a task model's "bert." weights or a bare encoder) without
    pooler or task head, and the tokenizer, into ``out``; returns (layers incl. embeddings, hidden)."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    from bertvision.models.backbone import load_tokenizer

    check_safetensors_dir(encoder_dir, "encoder checkpoint")
    hf_logging.set_verbosity_error()  # the task head's weights are dropped on purpose
    hf_logging.disable_progress_bar()
    model = AutoModel.from_pretrained(str(encoder_dir), add_pooling_layer=False, use_safetensors=True,
                                      trust_remote_code=False)
    model.save_pretrained(out, safe_serialization=True)
    load_tokenizer(tokenizer_source).save_pretrained(out)
    return model.config.num_hidden_layers + 1, model.config.hidden_size


def check_head_fits(run: HeadRun, layers: int, hidden: int, outputs: int) -> None:
    from bertvision.models.head_io import load_head

    try:
        load_head(run.dir, layers, hidden, outputs)
    except RuntimeError as err:  # shape mismatches in load_state_dict
        raise BundleError(f"{run.dir / HEAD_WEIGHTS}: does not fit this encoder's states (layers {layers}, hidden "
                          f"{hidden}); was it trained on another encoder's features? ({str(err).splitlines()[0]})")


def write_bundle(out_dir: Path, encoder_dir: Path, tokenizer_source: str, tasks: dict[str, dict], keys: dict,
                 precision: str) -> Bundle:
    """Build a bundle in ``out_dir`` (replacing one there). ``tasks``: {task: {"heads_dirs": [train_heads
    output dirs], "max_length": int, "doc_stride": int | None}} (missing settings: the registry's);
    ``precision``: the extraction precision of the heads' features. Written into a scratch
    directory and renamed into place, so a failed build leaves nothing that looks complete."""
    if precision not in PRECISIONS:
        raise BundleError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if not tasks:
        raise BundleError("no tasks given")
    out_dir = Path(out_dir)
    scratch = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        layers, hidden = save_bare_encoder(Path(encoder_dir), tokenizer_source, scratch / BUNDLE_ENCODER)
        described = {}
        for name, settings in tasks.items():
            try:
                task = get_task(name)
            except KeyError as err:
                raise BundleError(err.args[0]) from None
            runs = collect_runs(task, [Path(d) for d in settings.get("heads_dirs", [])])
            described[name] = task_json(task, settings, runs)
            kept = keep_best_seeds(task, runs)
            for head, entry in described[name]["heads"].items():
                check_head_fits(kept[head], layers, hidden, task.num_labels)
                target = scratch / entry["path"]
                target.mkdir(parents=True)
                for file in (HEAD_WEIGHTS, HEAD_METRICS):
                    shutil.copy2(kept[head].dir / file, target / file)
        atomic_write_json({"format": FORMAT, "keys": keys, "precision": precision, "layers": layers,
                           "hidden": hidden, "tasks": described}, scratch / BUNDLE_INDEX)
        replace_dir(scratch, out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return load_bundle(out_dir)


def replace_dir(new: Path, target: Path) -> None:
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


# --- reading ------------------------------------------------------------------------------------
def _require(path: Path) -> Path:
    if not path.exists():
        raise BundleError(f"{path}: missing from the bundle")
    return path


def _head_entry(root: Path, task: str, name: str, data: dict) -> HeadEntry:
    where = f"{root / BUNDLE_INDEX}: tasks.{task}.heads.{name}"
    try:
        head_dir = root / data["path"]
        for file in (HEAD_WEIGHTS, HEAD_METRICS):
            _require(head_dir / file)
        threshold = data.get("null_threshold")
        mean = data.get("mean_selection_score")
        return HeadEntry(name=name, dir=head_dir, seed=int(data["seed"]),
                         seeds=tuple(data.get("seeds", [data["seed"]])),
                         spec=dict(data["spec"]), level=str(data["level"]), parameters=int(data["parameters"]),
                         mean_selection_score=float("nan") if mean is None else float(mean),
                         selection_metrics=dict(data.get("selection_metrics", {})),
                         eval_metrics=dict(data.get("eval_metrics", {})),
                         null_threshold=None if threshold is None else float(threshold), source=data.get("source", {}))
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, BundleError):
            raise
        raise BundleError(f"{where}: malformed ({type(err).__name__}: {err})") from None


def _task_entry(root: Path, name: str, data: dict) -> TaskEntry:
    where = f"{root / BUNDLE_INDEX}: tasks.{name}"
    try:
        heads = {head: _head_entry(root, name, head, h) for head, h in data["heads"].items()}
        entry = TaskEntry(name=name, kind=data["kind"], text_fields=tuple(data["text_fields"]),
                          label_names=tuple(data.get("label_names", ())), primary_metric=data["primary_metric"],
                          max_length=int(data["max_length"]), doc_stride=data.get("doc_stride"),
                          max_answer_length=data.get("max_answer_length"), n_best=data.get("n_best"),
                          feature_level=data["feature_level"], picked=data["picked"], heads=heads)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, BundleError):
            raise
        raise BundleError(f"{where}: malformed ({type(err).__name__}: {err})") from None
    problems = []
    if entry.kind not in ("classification", "regression", "span"):
        problems.append(f"kind {entry.kind!r}")
    if not heads:
        problems.append("no heads")
    if entry.picked not in heads:
        problems.append(f"picked head {entry.picked!r} is not among its heads {sorted(heads)}")
    if entry.kind == "classification" and len(entry.label_names) < 2:
        problems.append("a classification task without label_names")
    if entry.is_span and (not entry.doc_stride or not entry.n_best or not entry.max_answer_length):
        problems.append("a span task needs doc_stride, n_best and max_answer_length")
    if entry.is_span and any(h.null_threshold is None for h in heads.values()):
        problems.append("a span head without null_threshold")
    if problems:
        raise BundleError(f"{where}: " + "; ".join(problems))
    return entry


def load_bundle(path: Path) -> Bundle:
    """The bundle in ``path`` (files checked, nothing loaded into memory but its description)."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise BundleError(f"{root}: no such bundle directory")
    meta_path = _require(root / BUNDLE_INDEX)
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as err:
        raise BundleError(f"{meta_path}: not valid JSON ({err})") from None
    if meta.get("format") != FORMAT:
        raise BundleError(f"{meta_path}: format {meta.get('format')!r}, this version reads format {FORMAT}")
    encoder = root / BUNDLE_ENCODER
    check_safetensors_dir(encoder, "bundle's encoder")
    for name in TOKENIZER_FILES:
        _require(encoder / name)
    if meta.get("precision") not in PRECISIONS:
        raise BundleError(f"{meta_path}: precision {meta.get('precision')!r}, expected one of {', '.join(PRECISIONS)}")
    tasks = {name: _task_entry(root, name, data) for name, data in (meta.get("tasks") or {}).items()}
    if not tasks:
        raise BundleError(f"{meta_path}: no tasks")
    try:
        return Bundle(root=root, keys=dict(meta.get("keys") or {}), precision=meta["precision"],
                      layers=int(meta["layers"]), hidden=int(meta["hidden"]), tasks=tasks)
    except (KeyError, TypeError, ValueError) as err:
        raise BundleError(f"{meta_path}: malformed ({type(err).__name__}: {err})") from None
