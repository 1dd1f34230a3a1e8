"""A serving bundle: one encoder checkpoint, its tokenizer and the heads of several tasks that
were trained on that encoder's hidden states, in one directory::

    bundle.json                   what is in it (below)
    encoder/                      the bare encoder (model.safetensors, config.json) and its tokenizer
    heads/{task}/{head}/          head.safetensors + metrics.json of the seed kept for each head

``bundle.json``: {format: 1, keys (provenance: backbone, encoder, ft_seed, ...), precision (the
extraction precision the heads' features were computed at, reproduced when serving), backend
(what ran the encoder for them: torch, onnx or onnx-int8; the service's default), layers,
hidden, tasks: {task: {kind, text_fields, label_names, primary_metric, eval_splits, max_length,
doc_stride (span and answerability tasks: their context windows), max_answer_length, n_best,
feature_level ("cls" or "tokens"), picked (the default head), heads: {head: {path, seed, seeds,
spec, level, parameters, mean_selection_score, selection_metrics, eval_metrics {split: metrics},
null_threshold (span heads), source, ensemble}}}}, task_model}.

A head + BERT ensemble is a head entry ``"{head} + BERT ({how})"`` with ``ensemble: {head, how}``
(the head's files, combined with BERT's own outputs as the evaluation combines them: per example,
or per window for span and answerability tasks; a span ensemble has its own null threshold);
its bundle has one task, ``task_model`` names it, and ``encoder/`` then holds that task's whole
model at its checkpoint (its classifier or span head kept), whose one forward pass gives both
the states and BERT's outputs.

Per task and head name the seed with the best selection score is kept (ties: the lower seed);
the task's default head is the one with the best mean selection score over its seeds (ties:
fewer parameters, then the name). Every choice reads the selection split only.

Weights are read as safetensors only (never pickle) and no remote code is ever run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import BertvisionError
from bertvision.layout import BUNDLE_ENCODER, BUNDLE_INDEX, BUNDLE_SET_INDEX, HEAD_METRICS, HEAD_WEIGHTS
from bertvision.models.backbone import missing_safetensors
from bertvision.registry.heads import HEAD_TYPES
from bertvision.registry.states import PAIR_PARTS
from bertvision.runtime.precision import BACKENDS, PRECISIONS

FORMAT = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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
    ensemble: dict | None = None  # {head, how}: this head's outputs combined with BERT's
    pair: str = "joint"  # a pair task's texts as this head reads them: one sequence, or each alone

    def state_width(self, hidden: int) -> int:
        """The width of what this head reads per layer: the encoder's hidden size, or for a pair
        encoded apart its ``PAIR_PARTS`` features of the two texts."""
        return len(PAIR_PARTS) * hidden if self.pair == "apart" else hidden

    def summary(self) -> dict:
        return {
            "seed": self.seed,
            "seeds": list(self.seeds),
            "spec": self.spec,
            "level": self.level,
            "pair": self.pair,
            "parameters": self.parameters,
            "mean_selection_score": self.mean_selection_score,
            "selection_metrics": self.selection_metrics,
            "eval_metrics": self.eval_metrics,
            "ensemble": self.ensemble,
        }


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

    @property
    def takes_questions(self) -> bool:
        """Asked with question/context items, cut into context windows: span tasks, and
        answerability (one label per question from its windows' [CLS] states)."""
        return self.doc_stride is not None


@dataclass(frozen=True)
class Bundle:
    root: Path
    keys: dict
    precision: str
    layers: int
    hidden: int
    tasks: dict[str, TaskEntry]
    task_model: str | None = None  # encoder/ is this task's whole model, classifier kept (ensembles)
    backend: str = "torch"  # what computed the heads' states; the service runs the same by default

    @property
    def encoder_dir(self) -> Path:
        return self.root / BUNDLE_ENCODER


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
        seed = int(data["seed"])
        seeds = tuple(int(each) for each in data.get("seeds", [seed]))
        if seed not in seeds:
            raise BundleError(f"{where}: seed {seed} is not among the seeds trained ({list(seeds)})")
        return HeadEntry(
            name=name,
            dir=head_dir,
            seed=seed,
            seeds=seeds,
            spec=dict(data["spec"]),
            level=str(data["level"]),
            parameters=int(data["parameters"]),
            mean_selection_score=float("nan") if mean is None else float(mean),
            selection_metrics=dict(data.get("selection_metrics", {})),
            eval_metrics=dict(data.get("eval_metrics", {})),
            null_threshold=None if threshold is None else float(threshold),
            source=data.get("source", {}),
            ensemble=dict(data["ensemble"]) if data.get("ensemble") else None,
            pair=str(data.get("pair", "joint")),
        )
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, BundleError):
            raise
        raise BundleError(f"{where}: malformed ({type(err).__name__}: {err})") from None


def _task_entry(root: Path, name: str, data: dict) -> TaskEntry:
    where = f"{root / BUNDLE_INDEX}: tasks.{name}"
    try:
        heads = {head: _head_entry(root, name, head, h) for head, h in data["heads"].items()}
        entry = TaskEntry(
            name=name,
            kind=data["kind"],
            text_fields=tuple(data["text_fields"]),
            label_names=tuple(data.get("label_names", ())),
            primary_metric=data["primary_metric"],
            max_length=int(data["max_length"]),
            doc_stride=data.get("doc_stride"),
            max_answer_length=data.get("max_answer_length"),
            n_best=data.get("n_best"),
            feature_level=data["feature_level"],
            picked=data["picked"],
            heads=heads,
        )
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
    if entry.kind == "regression" and entry.takes_questions:
        problems.append("a regression task over context windows")
    if entry.takes_questions and (entry.label_names and len(entry.label_names) != 2):
        problems.append("a windowed classification task has two labels (answerable, no answer)")
    if entry.is_span and (not entry.doc_stride or not entry.n_best or not entry.max_answer_length):
        problems.append("a span task needs doc_stride, n_best and max_answer_length")
    if entry.is_span and any(h.null_threshold is None for h in heads.values()):
        problems.append("a span head without null_threshold")
    for name, head in heads.items():
        if head.spec.get("type") not in HEAD_TYPES:  # made by a bertvision that registers a head type this one lacks
            known = ", ".join(HEAD_TYPES)
            problems.append(f"head {name}: type {head.spec.get('type')!r} is not one this bertvision has ({known})")
        if head.ensemble and head.ensemble.get("head") not in heads:
            problems.append(f"head {name}: an ensemble of a head the task does not have")
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
    if meta.get("backend", "torch") not in BACKENDS:
        raise BundleError(f"{meta_path}: backend {meta.get('backend')!r}, expected one of {', '.join(BACKENDS)}")
    tasks = {name: _task_entry(root, name, data) for name, data in (meta.get("tasks") or {}).items()}
    if not tasks:
        raise BundleError(f"{meta_path}: no tasks")
    task_model = meta.get("task_model")
    if task_model is not None and list(tasks) != [task_model]:
        raise BundleError(f"{meta_path}: task_model {task_model!r}: a bundle with the task model has that one task")
    if task_model is None and any(h.ensemble for t in tasks.values() for h in t.heads.values()):
        raise BundleError(f"{meta_path}: ensemble heads need the task's model (task_model)")
    try:
        return Bundle(
            root=root,
            keys=dict(meta.get("keys") or {}),
            precision=meta["precision"],
            layers=int(meta["layers"]),
            hidden=int(meta["hidden"]),
            tasks=tasks,
            task_model=task_model,
            backend=meta.get("backend", "torch"),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BundleError(f"{meta_path}: malformed ({type(err).__name__}: {err})") from None


def task_owners(bundles: list[Bundle]) -> dict[str, int]:
    """Task -> the position of the one bundle among ``bundles`` that serves it; a bundle given twice,
    or two with a task in common, is a BundleError."""
    owner: dict[str, int] = {}
    for i, bundle in enumerate(bundles):
        for name in bundle.tasks:
            if name in owner and bundles[owner[name]].root == bundle.root:
                raise BundleError(f"{bundle.root}: given twice (by itself or in a set of bundles)")
            if name in owner:
                raise BundleError(
                    f"{bundle.root}: task {name} is also served by {bundles[owner[name]].root}; "
                    "give each task to one bundle (write bundles with disjoint --task lists)"
                )
            owner[name] = i
    return owner


def bundle_paths(paths) -> list[Path]:
    """Bundle directories from what a user names: bundles, and sets of bundles (a directory with
    ``bundles.json``, as ``serve-bundles`` writes: each of its bundles, in its order)."""
    out = []
    for path in paths:
        path = Path(path)
        index = path / BUNDLE_SET_INDEX
        if (path / BUNDLE_INDEX).exists() or not index.exists():
            out.append(path)
            continue
        try:
            members = json.loads(index.read_text())["bundles"]
            out += [path / member["path"] for member in members.values()]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise BundleError(f"{index}: not a bundle set index ({type(err).__name__}: {err})") from None
        if not members:
            raise BundleError(f"{index}: lists no bundles")
    return out
