"""The serving commands of the ``bertvision`` command line: ``bundle`` (rule bundle) writes one
encoder and every task's heads; ``serve`` answers HTTP requests from a bundle."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from bertvision.errors import SettingsError
from bertvision.runtime.precision import PRECISIONS
from bertvision.serving.settings import BUNDLE_TASK_SETTINGS, ServeSettings

# serve's flags that set a ServeSettings field (ServeSettings owns their defaults; --device too)
SERVE_FLAGS = {
    "max_batch_size": ("--max-batch-size", "inputs per encoder pass"),
    "max_wait_ms": ("--max-wait-ms", "how long a batch waits to fill"),
    "max_texts_per_request": ("--max-texts", "inputs per request"),
    "max_body_bytes": ("--max-body-bytes", "request body size"),
    "max_text_chars": ("--max-text-chars", "characters per text, question or context"),
    "max_queued": ("--max-queued", "requests waiting per encoder; more get 503"),
}


def checked_task_settings(given: dict) -> dict:
    """--task-settings as {task: {max_length, doc_stride}} (set ones only), or one line naming the key."""
    try:
        task_settings = BUNDLE_TASK_SETTINGS.validate_python(given)
    except ValidationError as err:
        first = err.errors()[0]
        where, what = "".join(f"{p}: " for p in first["loc"]), first["msg"][0].lower() + first["msg"][1:]
        raise SettingsError(f"--task-settings: {where}{what} (expected {{task: {{max_length, doc_stride}}}})") from None
    return {name: settings.model_dump(exclude_none=True) for name, settings in task_settings.items()}


def cmd_bundle(a):
    from bertvision.serving.bundle_writer import write_bundle

    tasks: dict[str, dict] = {}
    for name, path in a.heads:
        tasks.setdefault(name, {"heads_dirs": []})["heads_dirs"].append(path)
    task_settings = checked_task_settings(a.task_settings)
    for name, settings in task_settings.items():
        if name not in tasks:
            raise SettingsError(f"--task-settings: {name} has no --heads {name}=DIR")
        tasks[name].update(settings)
    bundle = write_bundle(a.out, a.encoder_dir, a.tokenizer, tasks, a.keys, a.precision)
    for name, task in bundle.tasks.items():
        kept = ", ".join(f"{h} (seed {e.seed})" for h, e in task.heads.items())
        print(f"{name}: heads {kept}; default {task.picked}")
    print(f"wrote {bundle.root}")


def cmd_serve_bundles(a):
    from bertvision.serving.picked import CheckpointRun, write_picked_bundles

    try:
        runs = [CheckpointRun.from_json(r) for r in a.runs]
    except (KeyError, TypeError, ValueError) as err:
        raise SettingsError(
            f"--runs: each run is {{task, ftseed, frac, checkpoint_dir, heads_dir}} ({type(err).__name__}: {err})"
        ) from None
    index = write_picked_bundles(
        a.out, a.summary, a.backbone, runs, a.tokenizer, checked_task_settings(a.task_settings), a.keys, a.precision
    )
    for task, pick in index["picks"].items():
        print(
            f"{task}: {pick['model']} at checkpoint {pick['epoch_fraction']:g}, fine-tuning seed {pick['ft_seed']}: "
            f"bundle {pick['bundle']}"
        )
    print(f"wrote {a.out}")


def cmd_serve(a):
    import copy
    import os

    import uvicorn

    from bertvision.serving.app import BUNDLE_ENV, SETTINGS_ENV
    from bertvision.serving.bundle import BundleError, bundle_paths, load_bundle

    # a broken bundle fails here, in one line, before any worker starts; so do two that share a task
    bundles = [load_bundle(path) for path in bundle_paths(a.bundles)]
    served: dict[str, Path] = {}
    for bundle in bundles:
        for task in bundle.tasks:
            if task in served:
                raise BundleError(f"{bundle.root}: task {task} is also served by {served[task]}")
            served[task] = bundle.root
    given = {k: getattr(a, k) for k in SERVE_FLAGS}
    # several workers on one CPU would otherwise each start a thread per core
    threads = a.threads or (max(1, (os.cpu_count() or 1) // a.workers) if a.workers > 1 else None)
    settings = ServeSettings(**given, device=a.device, threads=threads)
    # uvicorn's factory mode: every worker process builds its own app from these
    os.environ[BUNDLE_ENV] = os.pathsep.join(str(b.root) for b in bundles)
    os.environ[SETTINGS_ENV] = settings.to_json()
    # every worker logs bertvision's lines (the JSON access log among them) beside uvicorn's own,
    # whose access log the app's replaces
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["bertvision"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    uvicorn.run(
        "bertvision.serving.app:app_from_env",
        factory=True,
        host=a.host,
        port=a.port,
        workers=a.workers,
        access_log=False,
        log_config=log_config,
        timeout_graceful_shutdown=30,
    )


def add_bundle_arguments(s, json_arg) -> None:
    """What every bundle writer takes: the tokenizer, per-task tokenization, provenance, the
    features' precision and where to write."""
    s.add_argument("--tokenizer", required=True, help="the backbone reference (backbones.<model>.pretrained)")
    s.add_argument(
        "--task-settings",
        type=json_arg,
        default={},
        help='{"task": {"max_length": N, "doc_stride": N}}: the tokenization the features used '
        "(default: the registry's)",
    )
    s.add_argument("--keys", type=json_arg, default={}, help='provenance, e.g. {"backbone", "encoder", "ft_seed"}')
    s.add_argument(
        "--precision",
        required=True,
        choices=PRECISIONS,
        help="extract.precision of the features (serving reproduces it)",
    )
    s.add_argument("--out", type=Path, required=True)


def add_serving_commands(sub, subcommand, json_arg, name_path_arg) -> None:
    """Add ``bundle``, ``serve-bundles`` and ``serve`` to the subparsers ``sub``; ``subcommand``, ``json_arg`` and
    ``name_path_arg`` are the command line's own parser helpers."""
    s = subcommand(
        sub,
        "bundle",
        cmd_bundle,
        "one encoder checkpoint, its tokenizer and every task's best heads, for bertvision serve (rule bundle)",
    )
    s.add_argument(
        "--encoder-dir",
        type=Path,
        required=True,
        help="a checkpoint (model.safetensors + config.json) the heads' features were extracted from",
    )
    s.add_argument(
        "--heads",
        type=name_path_arg,
        nargs="+",
        required=True,
        help="TASK=DIR: a train_heads output of TASK on this encoder (repeat TASK for several)",
    )
    add_bundle_arguments(s, json_arg)

    s = subcommand(
        sub,
        "serve-bundles",
        cmd_serve_bundles,
        "bundles that serve the summary's pick for every task of a run, one per encoder (rule serve_bundles)",
    )
    s.add_argument("--summary", type=Path, required=True, help="the summary table (results/tables/summary.csv)")
    s.add_argument("--backbone", required=True, help="the backbone whose picks to serve")
    s.add_argument(
        "--runs",
        type=json_arg,
        required=True,
        help="[{task, ftseed, frac, checkpoint_dir, heads_dir}]: every checkpoint of the run and its heads",
    )
    add_bundle_arguments(s, json_arg)

    s = subcommand(
        sub,
        "serve",
        cmd_serve,
        "answer every task of one or more bundles over HTTP, one encoder pass per batch and encoder",
    )
    s.add_argument(
        "bundles",
        type=Path,
        nargs="+",
        help="bundle directories (bertvision bundle), or sets of them (bertvision serve-bundles: "
        "bundles/MODEL/picked), each task in one; requests are routed by task",
    )
    s.add_argument("--host", default="127.0.0.1", help="(default %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="(default %(default)s)")
    s.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes, each with its own model (default %(default)s)"
    )
    default = ServeSettings()
    for key, (flag, what) in SERVE_FLAGS.items():
        value, metavar = getattr(default, key), flag.removeprefix("--").upper().replace("-", "_")
        s.add_argument(
            flag, dest=key, type=type(value), default=value, metavar=metavar, help=f"{what} (default %(default)s)"
        )
    s.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default=default.device,
        help="auto: a GPU when there is one (default %(default)s)",
    )
    s.add_argument(
        "--threads", type=int, help="torch threads per worker (default: CPU cores / workers when --workers > 1)"
    )
