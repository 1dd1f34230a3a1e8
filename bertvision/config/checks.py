"""The checks across config keys that the schema cannot express (a head a task lists must be in
heads.models, a shared task must be configured, ...), run when ``WorkflowSettings`` is built so
that a bad config fails the dry run with the key at fault. ``workflow``: the
``WorkflowSettings`` being built."""

from __future__ import annotations

import math
import os

import jsonschema

from bertvision.config.schema import schema_node
from bertvision.data.hub import dataset_problem
from bertvision.errors import ConfigError, MissingError
from bertvision.layout import Checkpoint
from bertvision.models.backbone import check_pretrained, declared_shape, position_limit
from bertvision.registry.heads import (
    BERT_HEAD,
    HEAD_TYPES,
    SEARCHABLE_TRAINING,
    head_pair,
    searched_parameters,
    shape_problem,
    trains_on,
)
from bertvision.registry.peers import inapplicable
from bertvision.registry.states import PAIR_PARTS
from bertvision.registry.tasks import get_task

# numpy's generators take seeds below 2**32 (the schema's seeds have this maximum too)
MAX_SEED = 2**32 - 1


def check(workflow) -> None:
    """Raise one ConfigError listing every problem, one line each, naming the config file and the key."""
    problems, broken = [], set()  # broken: tasks whose heads cannot be listed
    found = []  # the backbones that are there
    for model in workflow.models:
        try:
            check_pretrained(workflow.pretrained(model))
        except MissingError as err:
            problems.append(f"backbones.{model}.pretrained: {err}")
            continue
        found.append(model)
        limit = position_limit(workflow.pretrained(model))
        for task in workflow.tasks if limit else []:
            if workflow.max_length(task) > limit:
                problems.append(
                    f"tasks.{task}.max_length: {workflow.max_length(task)} tokens, but {model} "
                    f"({workflow.pretrained(model)}) takes at most {limit} in one sequence"
                )
    data, no_folder = workflow.config["data"], set()
    for key in ("glue_dir", "squad_dir") if data["source"] == "local" else ():
        if data[key] is not None and not os.path.isdir(data[key]):
            problems.append(f"data.{key}: {data[key]}: no such folder")
            no_folder.add(key)
    datasets = {"data.hub_repo": data["hub_repo"]} if data["source"] == "hub" and data["hub_repo"] else {}
    datasets |= {f"tasks.{t}.hub.id": get_task(t).hub_id for t in workflow.tasks if get_task(t).hub}
    problems += [f"{key}: {problem}" for key, repo in datasets.items() if (problem := dataset_problem(repo))]
    # each registered task's files in the local data folders, where its folder is there (else the dry
    # run's traceback); a hub dataset or a task's own files have nothing to locate (a local dataset
    # folder's files are listed by the download's input function, not twice on every parse)
    local = [t for t in workflow.tasks if data["source"] == "local" and not get_task(t).declared]
    for task in local:
        spec = get_task(task)
        if ("squad_dir" if spec.squad else "glue_dir") not in no_folder:
            try:
                workflow.download(task).source_files(spec)
            except MissingError as err:
                problems.append(f"tasks.{task}: {err}")
    extract = workflow.config["extract"]
    if extract["backend"] in ("onnx", "onnx-int8") and extract["device"] == "cuda":
        problems.append(
            f"extract.backend: {extract['backend']} runs on the CPU (ONNX Runtime's CPU provider), "
            "but extract.device: cuda; set extract.device: cpu or auto, or extract.backend: torch"
        )
    if extract["backend"] in ("onnx", "onnx-int8") and extract["precision"] in ("bf16", "fp16"):
        problems.append(
            f"extract.backend: {extract['backend']} computes in fp32 (int8 weights or not), but extract.precision: "
            f"{extract['precision']}; set extract.precision: fp32 or auto, or extract.backend: torch"
        )
    models = workflow.config["heads"]["models"]
    if BERT_HEAD in models:
        problems.append(f"heads.models.{BERT_HEAD}: the tables' name of BERT's own head; name this head otherwise")
    for task in workflow.tasks:
        spec, over = get_task(task), workflow.task_overrides(task)
        # a task's own list names its peers on purpose: one that cannot run on it is a mistake
        # (peers.methods applies each where it can, the summary saying why not elsewhere)
        for name, why in inapplicable(over.get("peers") or [], spec).items():
            problems.append(f"tasks.{task}.peers: {name} does not apply to {task}: {why}")
        if spec.squad and (problem := article_split_problem(over.get("article_split"))):  # else misplaced, below
            problems.append(f"tasks.{task}.article_split: {problem}")
        listed = over.get("heads") or []
        unknown = [n for n in listed if n not in models]
        if unknown:
            problems.append(f"tasks.{task}.heads: {unknown} are not in heads.models ({workflow.heads})")
            broken.add(task)
            continue
        misplaced = [
            key for key, ok in (("doc_stride", spec.windowed), ("article_split", spec.squad)) if key in over and not ok
        ]
        if misplaced:
            problems.append(f"tasks.{task}: {misplaced} only apply to tasks over SQuAD context windows")
        apart, why = [n for n in listed if head_pair(models[n]) == "apart"], workflow.why_not_apart(task)
        if apart and why:
            problems.append(f"tasks.{task}.heads: {apart} read a pair's two texts encoded apart, but {why}")
            broken.add(task)
            continue
        if over.get("token_features") and spec.kind == "span":
            problems.append(
                f"tasks.{task}.token_features: span tasks always store every token; token-level "
                "example heads are for classification / regression tasks"
            )
            continue
        features, apart = workflow.token_features(task), why is None
        unfit = [n for n in listed if not trains_on(models[n], spec.kind, features, apart)]
        if unfit and spec.kind == "span":
            problems.append(
                f"tasks.{task}.heads: {unfit} pool an example's tokens into one output (token-level "
                "heads, or reads: mean); span tasks need per-token outputs (a per-token head, or a "
                "sequence head such as ladder)"
            )
            continue
        if unfit:
            problems.append(
                f"tasks.{task}.heads: {unfit} are token-level heads; they need every token's "
                f"features, which {task} does not store (set tasks.{task}.token_features: true to extract them)"
            )
            continue
        if not workflow.task_heads(task):
            token = [n for n in workflow.heads if HEAD_TYPES[models[n]["type"]].token_level]
            apart_only = [n for n in workflow.heads if n not in token and head_pair(models[n]) == "apart"]
            reasons = [f"{token} are token-level (set tasks.{task}.token_features: true)"] if token else []
            reasons += [f"{apart_only} read a pair's two texts encoded apart, but {why}"] if apart_only else []
            problems.append(f"tasks.{task}: no head in heads.models trains on it: {'; '.join(reasons)}")
            continue
        unsearched = [n for n in workflow.search_heads(task) if n not in workflow.task_heads(task)]
        if unsearched:
            problems.append(
                f"tasks.{task}.search_heads: {unsearched} are not among the task's heads "
                f"({list(workflow.task_heads(task))})"
            )
        models = workflow.config["heads"]["models"]
        for name in set(workflow.search_heads(task)) - set(unsearched):
            if not searched_parameters(workflow.config["search"]["space"], models[name]["type"]):
                problems.append(
                    f"tasks.{task}.search_heads: {name} ({models[name]['type']}) has none of search.space's "
                    f"parameters ({', '.join(workflow.config['search']['space'])}): its trials would all be one"
                )
    if any(workflow.search_heads(task) for task in workflow.tasks):
        problems += space_problems(workflow.config["search"]["space"])
    search = workflow.config["search"]
    if search["seed"] + search["workers"] - 1 > MAX_SEED:  # numpy's generators take seeds below 2**32
        problems.append(f"search.seed: worker {search['workers'] - 1} would seed its sampler past {MAX_SEED}")
    for model in found:
        problems += misfit_heads(workflow, model, [t for t in workflow.tasks if t not in broken])
    for name in ("data_fraction", "transfer", "bert_curve"):
        unknown = [t for t in workflow.config["experiments"][name]["tasks"] if t not in workflow.tasks]
        if unknown:
            problems.append(f"experiments.{name}.tasks: {unknown} are not configured tasks ({workflow.tasks})")
    wanted = workflow.config["experiments"]["data_fraction"]["heads"] or []
    for task in set(workflow.data_fraction_tasks()) & set(workflow.tasks) - broken:
        missing = [n for n in wanted if n not in workflow.task_heads(task)]
        if missing:
            problems.append(f"experiments.data_fraction.heads: {missing} are not among {task}'s heads")
    if workflow.config["experiments"]["transfer"]["tasks"] and len(workflow.checkpoints) < 2:
        problems.append(
            "experiments.transfer.tasks: a transfer evaluates heads on other checkpoints' states; "
            f"finetune.epoch_fractions names one ({workflow.checkpoints[0].fraction:g})"
        )
    unknown = [c.name for c in workflow.data_fraction_checkpoints() if c not in workflow.checkpoints]
    if unknown:
        problems.append(f"experiments.data_fraction.checkpoints: {unknown} are not in finetune.epoch_fractions")
    problems += schedule_problems(workflow)
    problems += shared_problems(workflow, broken)
    if problems:
        raise ConfigError("\n".join(f"{workflow.source}: {p}" for p in problems))


def article_split_problem(shares: dict | None) -> str | None:
    """Shares of the articles (each above 0: the schema) that do not sum to 1; None when they do."""
    if not shares:
        return None
    total = shares["train"] + shares["selection"] + shares["dev"]
    if math.isclose(total, 1, abs_tol=1e-9):
        return None
    given = " + ".join(f"{part} {shares[part]:g}" for part in ("train", "selection", "dev"))
    return f"the shares of the articles, {given}, sum to {total:g}, not 1"


def schedule_problems(workflow) -> list[str]:
    """A learning-rate schedule shorter than the last checkpoint would train past it at rate 0."""
    last = max(float(f) for f in workflow.config["finetune"]["epoch_fractions"])
    problems = []
    for task in workflow.tasks:
        own = (workflow.task_overrides(task).get("finetune") or {}).get("schedule_epochs")
        schedule = workflow.layered("finetune.settings", task)["schedule_epochs"]
        if schedule is not None and schedule < last:
            key = f"tasks.{task}.finetune.schedule_epochs" if own is not None else "finetune.settings.schedule_epochs"
            problems.append(
                f"{key}: {schedule:g} epochs of learning-rate schedule end before the last checkpoint "
                f"({last:g} epochs in finetune.epoch_fractions); set it to at least {last:g}, or null"
            )
    return sorted(set(problems))


def shared_problems(workflow, broken: set) -> list[str]:
    """The problems of the ``shared`` section (``broken``: tasks whose heads cannot be listed)."""
    shared, problems = workflow.config["shared"], []
    unknown = [t for t in workflow.shared_tasks if t not in workflow.tasks]
    if unknown:
        problems.append(f"shared.tasks: {unknown} are not configured tasks ({workflow.tasks})")
    streamed = [t for t in workflow.shared_tasks if t in workflow.tasks and not workflow.store(t)]
    if streamed:
        problems.append(
            f"shared.tasks: {streamed} stream their states (store: false); shared encoders read "
            "stored features, so list only stored tasks"
        )
    windowed = [t for t in workflow.shared_tasks if t in workflow.tasks and get_task(t).answerability]
    if windowed:
        problems.append(
            f"shared.tasks: {windowed} classify questions from several context windows; the cross-task "
            "table scores one row per example, so answerability tasks are not shared (the run's picked "
            "bundles serve them)"
        )
    taken = [t for t in workflow.shared_tasks if t in ("frozen", "picked")]
    if taken:
        problems.append(
            f"shared.tasks: {taken}: the name is taken (frozen names the untouched encoder, bundles/MODEL/picked "
            "holds the picked bundles); give the task another name"
        )
    for name, mixture in shared["mixtures"].items():
        missing = [t for t in mixture["tasks"] if t not in workflow.tasks]
        if missing:
            problems.append(f"shared.mixtures.{name}.tasks: {missing} are not configured tasks ({workflow.tasks})")
        if name in ("frozen", "picked") or name in workflow.tasks:
            problems.append(
                f"shared.mixtures.{name}: the name is taken (frozen and task names name encoders; "
                "bundles/MODEL/picked holds the picked bundles)"
            )
        if len(set(mixture["tasks"])) == 1:
            problems.append(
                f"shared.mixtures.{name}.tasks: one task ({mixture['tasks'][0]}) is no mixture: its own fine-tuned "
                "encoder is shared already (shared.checkpoint)"
            )
        if not workflow.shared_tasks:
            problems.append(f"shared.mixtures.{name}: shared.tasks is empty, so no task's heads would read it")
    unknown_heads = [h for h in shared["heads"] or [] if h not in workflow.heads]
    if unknown_heads:
        problems.append(f"shared.heads: {unknown_heads} are not in heads.models ({workflow.heads})")
    if not workflow.shared_tasks or problems:
        return problems
    if shared["frozen"] and Checkpoint(0) not in workflow.checkpoints:
        problems.append(
            "shared.frozen: needs 0 in finetune.epoch_fractions (the frozen encoder's features are "
            "the main pipeline's checkpoint 0)"
        )
    if shared["checkpoint"] is not None and Checkpoint(shared["checkpoint"]) not in workflow.checkpoints:
        names = [c.name for c in workflow.checkpoints]
        problems.append(f"shared.checkpoint: {shared['checkpoint']} is not in finetune.epoch_fractions ({names})")
    unknown = [s for s in workflow.shared_ft_seeds if s not in workflow.ft_seeds]
    if unknown:
        problems.append(f"shared.ft_seeds: {unknown} are not in finetune.seeds ({workflow.ft_seeds})")
    if not workflow.shared_encoders():
        problems.append("shared: no encoder (frozen false, checkpoint null and no mixtures)")
    elif shared["serve"] is not None and shared["serve"] not in workflow.shared_encoders():
        problems.append(
            f"shared.serve: {shared['serve']!r} is not a shared encoder ({list(workflow.shared_encoders())})"
        )
    for task in set(workflow.shared_tasks) - broken:
        if shared["heads"] is not None and not workflow.shared_heads(task):
            problems.append(
                f"shared.heads: none of {shared['heads']} is among {task}'s heads ({list(workflow.task_heads(task))})"
            )
    return problems


def misfit_heads(workflow, model: str, tasks: list[str]) -> list[str]:
    """Each head of ``tasks`` whose options cannot be built on ``model``'s states (``HeadType.misfit``),
    where the backbone's width is known here: its job would fail after fine-tuning and extraction."""
    shape, models = declared_shape(workflow.pretrained(model)), workflow.config["heads"]["models"]
    if shape is None:
        return []
    hidden, space, on = shape.hidden, workflow.config["search"]["space"], f"on {model} ({workflow.pretrained(model)})"
    problems = {}
    searched = {name for task in tasks for name in workflow.search_heads(task)}
    for name in sorted({name for task in tasks for name in workflow.task_heads(task)}):
        spec = {k: v for k, v in models[name].items() if k != "training"}
        width = len(PAIR_PARTS) * hidden if head_pair(spec) == "apart" else hidden
        if problem := shape_problem(spec, width):
            problems[name] = f"heads.models.{name}: {problem} {on}"
            continue
        # each value the search may draw, with the head's other options as configured
        for parameter in searched_parameters(space, spec["type"]) if name in searched else []:
            if parameter in SEARCHABLE_TRAINING:
                continue
            for value in _drawn_values(space[parameter]):
                if problem := shape_problem({**spec, parameter: value}, width):
                    problems[name] = f"search.space.{parameter}: {value} for {name}: {problem} {on}"
                    break
    return list(problems.values())


def _drawn_values(dist: dict) -> list:
    """The values of a search range or choice to check: every choice, every integer of an integer
    range up to a few thousand of them, else the range's ends."""
    if "choices" in dist:
        return list(dist["choices"])
    low, high = dist["low"], dist["high"]
    if isinstance(low, int) and isinstance(high, int) and high - low <= 4096:
        return list(range(low, high + 1))
    return [low, high]


def parameter_schema(name: str) -> dict:
    """The range a searchable parameter takes: a training setting's from the schema, a head
    option's from its registered type."""
    if name in SEARCHABLE_TRAINING:
        node = schema_node(f"heads.training.{name}")
    else:
        node = next(t.options[name] for t in HEAD_TYPES.values() if name in t.options).json_schema()
    return {k: v for k, v in node.items() if k not in ("default", "description")}


def space_problems(space: dict) -> list[str]:
    """Each range or choice of ``search.space`` that optuna would refuse, or that the parameter
    does not take, as one line naming its key (else a search job fails mid-run)."""
    problems = []
    for name, dist in space.items():
        key, node = f"search.space.{name}", parameter_schema(name)
        values = dist.get("choices") or [dist["low"], dist["high"]]
        for value in values:
            for err in jsonschema.Draft202012Validator(node).iter_errors(value):
                problems.append(f"{key}: {err.message}")
        if "low" in dist and dist["low"] > dist["high"]:
            problems.append(f"{key}: low {dist['low']} is above high {dist['high']}")
        if dist.get("log") and "low" in dist and dist["low"] <= 0:
            problems.append(f"{key}: log: true needs low > 0, not {dist['low']}")
    return problems
