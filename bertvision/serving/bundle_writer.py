"""Writing a serving bundle (format: ``bertvision.serving.bundle``) from a run's encoder checkpoint
and each task's ``train_heads`` outputs: per task and head the seed best on the selection split,
and the task's default head, picked on selection only (``reporting.ranking``, as the summary
picks; a head the race stopped in any job is not served); written to a scratch directory and renamed
into place."""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from bertvision.errors import SettingsError
from bertvision.files import atomic_dir, atomic_write_json, read_json
from bertvision.layout import BUNDLE_ENCODER, BUNDLE_HEAD, BUNDLE_INDEX, HEAD_METRICS, HEAD_WEIGHTS, head_runs
from bertvision.registry.heads import head_pair, is_token_head
from bertvision.registry.states import PAIR_PARTS
from bertvision.registry.task_spec import TaskSpec
from bertvision.registry.tasks import get_task
from bertvision.reporting.ranking import best, head_candidates
from bertvision.reporting.results import raced_out
from bertvision.runtime.precision import PRECISIONS, Precision
from bertvision.serving.bundle import FORMAT, Bundle, BundleError, check_safetensors_dir, load_bundle
from bertvision.serving.settings import checked_task_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedHead:
    """One trained head (a ``train_heads`` run directory) and its metrics record."""

    dir: Path
    record: dict

    @property
    def head(self) -> str:
        return self.record["head"]

    @property
    def seed(self) -> int:
        return int(self.record["seed"])


def selection_score(task: TaskSpec, run: TrainedHead) -> float:
    """The primary metric on the selection split; -inf where it is missing, so it never wins."""
    score = task.primary_score(run.record.get("metrics", {}), "selection")
    return -math.inf if math.isnan(score) else score


def keep_best_seeds(task: TaskSpec, runs: list[TrainedHead]) -> dict[str, TrainedHead]:
    """Head name -> its run with the best selection score (ties: the lower seed)."""
    kept: dict[str, TrainedHead] = {}
    for run in sorted(runs, key=lambda r: (r.head, r.seed)):
        best = kept.get(run.head)
        if best is None or selection_score(task, run) > selection_score(task, best):
            kept[run.head] = run
    return kept


def collect_runs(task: TaskSpec, heads_dirs: list[Path], names: list[str] | None = None) -> list[TrainedHead]:
    """The runs of the heads ``names`` (None: every head) in ``heads_dirs``, none the race stopped."""
    runs: list[TrainedHead] = []
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
                raise BundleError(
                    f"{run_dir / HEAD_METRICS}: a head of task {record.get('task')!r}, given for {task.name}"
                )
            if not (run_dir / HEAD_WEIGHTS).exists():
                raise BundleError(f"{run_dir / HEAD_WEIGHTS}: missing")
            run = TrainedHead(run_dir, record)
            if names is not None and run.head not in names:
                continue
            if (run.head, run.seed) in seen:
                raise BundleError(
                    f"{task.name}: head {run.head} seed {run.seed} is in both {seen[run.head, run.seed]} "
                    f"and {run_dir}; give each trained head once"
                )
            seen[run.head, run.seed] = run_dir
            runs.append(run)
    if names is not None and not runs:
        raise BundleError(f"{task.name}: none of the heads {', '.join(names)} in {', '.join(map(str, heads_dirs))}")
    stopped = {run.head for run in runs if raced_out(run.record)}
    if stopped:
        log.info("%s: not served, stopped by the race in some job: %s", task.name, ", ".join(sorted(stopped)))
    return [run for run in runs if run.head not in stopped]


def head_level(task: TaskSpec, spec: dict) -> str:
    return "tokens" if task.kind == "span" or is_token_head(spec) else "cls"


def null_threshold(run: TrainedHead) -> float | None:
    threshold = run.record.get("metrics", {}).get("selection", {}).get("null_threshold")
    return None if threshold is None else float(threshold)


def head_entry_json(task: TaskSpec, run: TrainedHead, seeds: list[int], mean: float) -> dict:
    record = run.record
    threshold = null_threshold(run)
    if task.kind == "span" and threshold is None:
        raise BundleError(
            f"{run.dir / HEAD_METRICS}: no metrics.selection.null_threshold (span heads need the "
            "threshold tuned on the selection split)"
        )
    return {
        "path": BUNDLE_HEAD.format(task=task.name, head=run.head),
        "seed": run.seed,
        "seeds": sorted(seeds),
        "spec": record["head_spec"],
        "level": head_level(task, record["head_spec"]),
        "pair": head_pair(record["head_spec"]) if task.two_texts else "joint",
        "parameters": int(record["parameters"]),
        "mean_selection_score": mean if math.isfinite(mean) else None,
        "selection_metrics": record["metrics"].get("selection", {}),
        "eval_metrics": {split: record["metrics"][split] for split in task.eval_splits if split in record["metrics"]},
        "null_threshold": threshold,
        "source": record.get("source", {}),
    }


def ensemble_entry_json(task: TaskSpec, ensemble: dict, heads: dict, kept: dict[str, TrainedHead]) -> tuple[str, dict]:
    """The head entry of ``ensemble`` ({head, how}): the head's files and its ensemble's scores
    (and, for a span task, the null threshold the ensemble's own selection scores tuned)."""
    from bertvision.reporting.results import ensemble_name

    head, how = ensemble.get("head"), ensemble.get("how")
    if head not in heads:
        raise BundleError(f"{task.name}: ensemble of head {head!r}, which is not among its heads {sorted(heads)}")
    scores = kept[head].record.get("ensembles", {}).get(how)
    if not scores:
        raise BundleError(f"{kept[head].dir / HEAD_METRICS}: no ensemble {how!r} (ensembles.{how}) to serve")
    selection = scores.get("selection", {})
    threshold = selection.get("null_threshold")
    if task.kind == "span" and threshold is None:
        raise BundleError(f"{kept[head].dir / HEAD_METRICS}: no ensembles.{how}.selection.null_threshold")
    entry = {
        **heads[head],
        "ensemble": {"head": head, "how": how},
        "selection_metrics": selection,
        "eval_metrics": {split: scores[split] for split in task.eval_splits if split in scores},
        "null_threshold": None if threshold is None else float(threshold),
    }
    return ensemble_name(head, how), entry


def task_json(task: TaskSpec, settings: dict, runs: list[TrainedHead]) -> dict:
    if not runs:
        raise BundleError(f"{task.name}: no head to serve (the race stopped every head of its heads directories)")
    kept = keep_best_seeds(task, runs)
    candidates = {c.name: c for c in head_candidates(task, [run.record for run in runs]) if c.name in kept}
    seeds: dict[str, list[int]] = {}
    for run in runs:
        seeds.setdefault(run.head, []).append(run.seed)
    heads = {
        head: head_entry_json(task, run, seeds[head], candidates[head].selection) for head, run in sorted(kept.items())
    }
    if settings.get("ensemble"):
        apart = (settings["ensemble"].get("head") in heads) and heads[settings["ensemble"]["head"]]["pair"] == "apart"
        if apart:
            raise BundleError(
                f"{task.name}: a head + BERT ensemble is not served for a head that reads a pair apart "
                "(BERT reads it joint)"
            )
        name, entry = ensemble_entry_json(task, settings["ensemble"], heads, kept)
        heads[name] = entry
    top = best(candidates.values())
    picked = settings.get("picked") or (top.name if top else min(heads))
    if picked not in heads:
        raise BundleError(
            f"{task.name}: the picked head {picked!r} is not among its servable heads {sorted(heads)} "
            "(a head the race stopped is never served)"
        )
    span = task.span
    doc_stride = settings.get("doc_stride") or task.doc_stride
    return {
        "kind": task.kind,
        "text_fields": list(task.text_fields),
        "label_names": list(task.label_names),
        "primary_metric": task.primary_metric,
        "eval_splits": list(task.eval_splits),
        "max_length": int(settings.get("max_length") or task.max_length),
        "doc_stride": int(doc_stride) if task.windowed else None,
        "max_answer_length": span.max_answer_length if span else None,
        "n_best": span.n_best if span else None,
        "feature_level": "tokens" if any(e["level"] == "tokens" for e in heads.values()) else "cls",
        "picked": picked,
        "heads": heads,
    }


def save_bare_encoder(
    encoder_dir: Path, tokenizer_source: str, out: Path, task_model: TaskSpec | None = None
) -> tuple[int, int]:
    """The encoder of ``encoder_dir`` (a task model's checkpoint, its encoder's weights under the
    architecture's prefix: "bert.", "roberta.", ...; or a bare encoder) without pooler or task head
    (``task_model``: that task's whole model, its classifier or span head kept), and the
    tokenizer, into ``out``; returns (hidden states, hidden)."""
    from transformers.utils import logging as hf_logging

    from bertvision.models.backbone import load_tokenizer
    from bertvision.models.encoder_io import hidden_state_shape, load_encoder, load_task_model

    check_safetensors_dir(encoder_dir, "encoder checkpoint")
    hf_logging.set_verbosity_error()  # the task head's weights are dropped on purpose
    hf_logging.disable_progress_bar()
    if task_model is not None:
        model = load_task_model(str(encoder_dir), task_model.kind).eval()
    else:
        model = load_encoder(str(encoder_dir)).eval()
    model.save_pretrained(out, safe_serialization=True)
    load_tokenizer(tokenizer_source).save_pretrained(out)
    return hidden_state_shape(model)


def check_head_fits(run: TrainedHead, layers: int, hidden: int, outputs: int) -> None:
    from bertvision.models.head_io import load_head

    try:
        load_head(run.dir, layers, hidden, outputs)
    except RuntimeError as err:  # shape mismatches in load_state_dict
        raise BundleError(
            f"{run.dir / HEAD_WEIGHTS}: does not fit this encoder's states (layers {layers}, hidden "
            f"{hidden}); was it trained on another encoder's features? ({str(err).splitlines()[0]})"
        ) from None


def write_bundle(
    out_dir: Path, encoder_dir: Path, tokenizer_source: str, tasks: dict[str, dict], keys: dict, precision: str
) -> Bundle:
    """Build a bundle in ``out_dir`` (replacing one there). ``tasks``: {task: {"heads_dirs": [train_heads
    output dirs], "max_length": int, "doc_stride": int | None, "picked": the default head (default:
    the best mean selection score among them), "heads": the names of the heads served (default: every
    one the directories hold), "ensemble": {head, how} (a head + BERT ensemble to
    serve too; the bundle then has this one task and keeps its whole model)}} (missing settings: the
    registry's);
    ``precision``: the extraction precision of the heads' features; ``auto`` takes the precision
    the heads' records say their states were computed in (serving then computes states as the
    evaluation did, whatever the serving machine's own auto would pick); where they name several,
    it stays ``auto``, with a warning. Written into a scratch
    directory and renamed into place, so a failed build leaves nothing that looks complete."""
    if precision not in PRECISIONS:
        raise BundleError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if not tasks:
        raise BundleError("no tasks given")
    ensembles = [name for name, settings in tasks.items() if settings.get("ensemble")]
    if ensembles and len(tasks) > 1:
        raise BundleError(f"{ensembles[0]}: a head + BERT ensemble is served from a bundle of its task alone")
    try:
        task_model = get_task(ensembles[0]) if ensembles else None
    except KeyError as err:
        raise BundleError(err.args[0]) from None
    with atomic_dir(out_dir) as scratch:
        layers, hidden = save_bare_encoder(Path(encoder_dir), tokenizer_source, scratch / BUNDLE_ENCODER, task_model)
        described, recorded, backends = {}, set(), set()
        for name, settings in tasks.items():
            try:
                task = get_task(name)
            except KeyError as err:
                raise BundleError(err.args[0]) from None
            runs = collect_runs(task, [Path(d) for d in settings.get("heads_dirs", [])], settings.get("heads"))
            recorded |= {r.record["states_precision"] for r in runs if r.record.get("states_precision")}
            backends |= {r.record.get("states_backend", "torch") for r in runs}
            described[name] = task_json(task, settings, runs)
            kept = keep_best_seeds(task, runs)
            for head, entry in described[name]["heads"].items():
                if entry.get("ensemble"):
                    continue  # the files of its head
                width = len(PAIR_PARTS) * hidden if entry["pair"] == "apart" else hidden
                check_head_fits(kept[head], layers, width, task.num_labels)
                target = scratch / entry["path"]
                target.mkdir(parents=True)
                for file in (HEAD_WEIGHTS, HEAD_METRICS):
                    shutil.copy2(kept[head].dir / file, target / file)
        if precision == "auto" and len(recorded) == 1:
            precision = recorded.pop()
        elif precision == "auto" and len(recorded) > 1:
            log.warning("the heads' states were computed in several precisions (%s): the bundle serves in the "
                        "serving machine's auto, and its answers may differ from the evaluation's (give the "
                        "precision to serve in)", ", ".join(sorted(recorded)))  # fmt: skip
        if len(backends) > 1:
            several = ", ".join(sorted(backends))
            raise BundleError(f"the heads' states came from several backends ({several}): one encoder serves them "
                              "all, so a bundle takes heads of one backend")  # fmt: skip
        atomic_write_json(
            {
                "format": FORMAT,
                "keys": keys,
                "precision": precision,
                # what computed the heads' states (extract.backend): serving runs the same
                "backend": backends.pop() if backends else "torch",
                "layers": layers,
                "hidden": hidden,
                "tasks": described,
                "task_model": ensembles[0] if ensembles else None,
            },
            scratch / BUNDLE_INDEX,
        )
    return load_bundle(out_dir)


def bundle_heads(
    out: Path,
    encoder_dir: Path,
    tokenizer: str,
    task_head_dirs: list[tuple[str, Path]],
    precision: Precision,
    task_settings: dict | None = None,
    provenance: dict | None = None,
) -> None:
    """``bertvision bundle``: the heads directories ``task_head_dirs`` ([(task, dir)], a task may repeat) of
    one encoder, each task tokenized as ``task_settings`` says; what it kept, printed."""
    tasks: dict[str, dict] = {}
    for name, heads_dir in task_head_dirs:
        tasks.setdefault(name, {"heads_dirs": []})["heads_dirs"].append(heads_dir)
    for name, settings in checked_task_settings(task_settings or {}).items():
        if name not in tasks:
            raise SettingsError(f"--task-settings: {name} has no --task-head-dirs {name}=DIR")
        tasks[name].update(settings)
    written = write_bundle(out, encoder_dir, tokenizer, tasks, provenance or {}, precision)
    for name, task in written.tasks.items():
        kept = ", ".join(f"{h} (seed {e.seed})" for h, e in task.heads.items())
        print(f"{name}: heads {kept}; default {task.picked}")
    print(f"wrote {written.root}")
