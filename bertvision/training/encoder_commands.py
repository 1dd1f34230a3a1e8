"""The encoder-training commands of the ``bertvision`` command line: ``finetune`` (partial
fine-tuning, rule finetune), ``baseline`` (full fine-tuning, rule baseline) and
``finetune-mixture`` (one encoder on several tasks, rule finetune_mixture)."""

from __future__ import annotations

from pathlib import Path

from bertvision.arguments import (
    micro_batches_arg,
    name_path_arg,
    retry_on_out_of_memory,
    settings_arg,
    subcommand,
    task_arg,
)
from bertvision.config import settings as typed


def cmd_finetune(a):
    from bertvision.stages.finetune import finetune

    task = task_arg(a.task)
    settings = typed.FinetuneSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("finetune", a.micro_batches):
        finetune(
            task, a.model, settings, compute, a.tokens_dir, a.raw_dir, a.out_dir, a.seed, a.threads, a.micro_batches
        )


def cmd_baseline(a):
    from bertvision.stages.baseline import full_finetune

    task = task_arg(a.task)
    settings = typed.BaselineSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("baseline", a.micro_batches):
        full_finetune(
            task, a.model, settings, compute, a.tokens_dir, a.raw_dir, a.out_dir, a.seed, a.threads, a.micro_batches
        )


def cmd_finetune_mixture(a):
    from bertvision.stages.finetune_mixture import finetune_mixture

    settings = typed.MixtureSettings.from_json(a.settings)
    compute = typed.FinetuneCompute.from_json(a.compute, "--compute")
    with retry_on_out_of_memory("finetune-mixture", a.micro_batches):
        finetune_mixture(
            a.encoder, a.model, settings, compute, dict(a.tokens_dirs), a.out_dir, a.seed, a.threads, a.micro_batches
        )


def add_encoder_commands(sub) -> None:
    """Add ``finetune``, ``baseline`` and ``finetune-mixture`` to the subparsers ``sub``."""
    for name, command, settings, what in (
        (
            "finetune",
            cmd_finetune,
            typed.FinetuneSettings,
            "partial fine-tuning with checkpoints at epoch fractions (rule finetune)",
        ),
        (
            "baseline",
            cmd_baseline,
            typed.BaselineSettings,
            "full fine-tuning, the epoch kept chosen on the selection split (rule baseline)",
        ),
    ):
        s = subcommand(sub, name, command, what)
        s.add_argument("--task", required=True)
        s.add_argument("--model", required=True, help="the backbone's name in the config (recorded with the results)")
        settings_arg(s, "--settings", settings)
        settings_arg(s, "--compute", typed.FinetuneCompute)
        s.add_argument("--tokens-dir", type=Path, required=True)
        s.add_argument("--raw-dir", type=Path, required=True, help="the task's canonical splits (span decoding)")
        s.add_argument("--out-dir", type=Path, required=True)
        s.add_argument("--seed", type=int, required=True)
        micro_batches_arg(s, "gradient accumulation steps per batch")
        s.add_argument("--threads", type=int)

    s = subcommand(
        sub,
        "finetune-mixture",
        cmd_finetune_mixture,
        "fine-tune one encoder on a mixture of tasks, a shared encoder (rule finetune_mixture)",
    )
    s.add_argument("--encoder", required=True, help="the mixture's name in the config (recorded)")
    s.add_argument("--model", required=True, help="the backbone's name in the config (recorded)")
    settings_arg(s, "--settings", typed.MixtureSettings)
    settings_arg(s, "--compute", typed.FinetuneCompute)
    s.add_argument("--tokens-dirs", type=name_path_arg, nargs="+", required=True, help="TASK=DIR, every mixed task")
    s.add_argument("--out-dir", type=Path, required=True)
    s.add_argument("--seed", type=int, required=True)
    micro_batches_arg(s, "gradient accumulation steps per batch")
    s.add_argument("--threads", type=int)
