"""The serving commands: ``bundle`` (one encoder and every task's heads; rule bundle and by hand),
``serve-bundles`` (the summary's pick for every task; rule serve_bundles) and ``serve`` (HTTP)."""

from __future__ import annotations

from pathlib import Path

from bertvision.commands.arguments import PATH, TASK, THREADS, Arg, Command, command, json_arg, name_path_arg, path
from bertvision.runtime.precision import BACKENDS, PRECISIONS
from bertvision.serving.settings import ServeSettings

# serve's flags that set a ServeSettings field (ServeSettings owns their defaults; --device too)
SERVE_FLAGS = {
    "max_batch_size": "inputs per encoder pass",
    "max_wait_ms": "how long a batch waits to fill",
    "max_texts": "inputs per request",
    "max_body_bytes": "request body size",
    "max_text_chars": "characters per text, question or context",
    "max_queued": "requests waiting per encoder; more get 503",
    "max_chunk_rows": "sequences per encoder forward call, sorted by length (0: the whole batch in one)",
    "pad_multiple": "pad each forward call's width to a multiple of this",
}


# what every bundle writer takes: the tokenizer, per-task tokenization, provenance, the features'
# precision and where to write
BUNDLE = dict(
    tokenizer=Arg("the backbone reference (backbones.<model>.pretrained)"),
    task_settings=Arg('{"task": {"max_length": N, "doc_stride": N}}: the tokenization the features used (default: '
                      "the registry's)", type=json_arg, required=False, default={}),
    keys=Arg('provenance, e.g. {"backbone", "encoder", "ft_seed"}', type=json_arg, required=False, default={}),
    precision=Arg("extract.precision of the features (serving reproduces it)", choices=tuple(PRECISIONS)),
    out=PATH,
)  # fmt: skip


def serve_args() -> dict[str, Arg]:
    """serve's flags; ServeSettings, read when the parser is built, owns their defaults."""
    default = ServeSettings()
    option = lambda help, value, **kw: Arg(help, type=type(value), required=False, default=value, **kw)  # noqa: E731
    limits = {key: option(what, getattr(default, key)) for key, what in SERVE_FLAGS.items()}
    return dict(
        bundles=Arg("bundle directories (bertvision bundle), or sets of them (bertvision serve-bundles: "
                    "bundles/MODEL/picked), each task in one; requests are routed by task", type=Path, nargs="+",
                    positional=True),
        host=option("", "127.0.0.1"),
        port=option("", 8000),
        workers=option("uvicorn worker processes, each with its own model", 1),
        **limits,
        device=option("auto: a GPU when there is one", default.device, choices=("auto", "cpu", "cuda")),
        backend=Arg("the encoder's runtime: torch, or ONNX Runtime on the CPU (fp32, or int8 weights); default: the "
                    "one each bundle's heads were trained on", choices=BACKENDS, required=False),
        threads=Arg("torch threads per worker (default: CPU cores / workers when --workers > 1)", type=int,
                    required=False),
    )  # fmt: skip


COMMANDS = [
    command("bundle",
            "one encoder checkpoint, its tokenizer and every task's best heads, for bertvision serve (rule bundle)",
            encoder_dir=path("a checkpoint (model.safetensors + config.json) the heads' states came from"),
            heads=Arg("TASK=DIR: a train_heads output of TASK on this encoder (repeat TASK for several)",
                      type=name_path_arg, nargs="+"),
            **BUNDLE),
    command("serve-bundles",
            "bundles that serve the summary's pick for every task of a run, one per encoder (rule serve_bundles)",
            picks=path("the tables stage's picks record (results/tables/picks.json)"),
            backbone=Arg("the backbone whose picks to serve"),
            runs=Arg("[{task, ftseed, frac, checkpoint_dir, heads_dir}]: every checkpoint of the run and its heads",
                     type=json_arg),
            **BUNDLE),
    command("predict",
            "a task's unlabelled file answered by the summary's picked path, as served (rule predict)",
            task=TASK, bundles=path("the picked bundles (serve-bundles' output) or a bundle serving the task"),
            raw_dir=path("the task's canonical splits (download's output, with the unlabelled split)"),
            out=path("the predictions CSV to write"), threads=THREADS),
    Command("serve", "answer every task of one or more bundles over HTTP, one encoder pass per batch and encoder",
            serve_args),
]  # fmt: skip
