"""A small grid of ladder heads, scored on the SELECTION split only (never dev): every variant
trains in lockstep on one streamed encoder pass per epoch of a run's checkpoint, with one seed,
and the selection score of every epoch is printed. It reads the run's config for the
extraction and head-training settings. Checkpoint 0 is the untouched backbone: read from the
backbone itself when the run has not fine-tuned yet (only the task's tokens are needed).

    python scripts/ladder_grid.py RUN_DIR CONFIG TASK FT_SEED CHECKPOINT OUT_DIR [MAX_EPOCHS [GRID]]

GRID: ``shape`` (side width, blocks, layers, pooling; docs/results/ladder-grid.md) or ``init``
(random vs the encoder's own layers, at three learning rates; docs/results/ladder-init-grid.md).
"""

import argparse
import time
from pathlib import Path

from bertvision.config.settings import HeadSettings
from bertvision.features.source import StreamSource
from bertvision.files import read_json
from bertvision.layout import CHECKPOINT_DIR, HEAD_METRICS, RAW_DIR, TOKENS_DIR, Run, head_run_dir
from bertvision.models.backbone import resolve_pretrained
from bertvision.script_support import (
    checkpoint_argument,
    declare_config_tasks,
    known_task,
    run_directory,
    run_script,
)
from bertvision.stages.train_heads import train_heads


def grid_heads(grid_name: str) -> dict[str, dict]:
    base = {"type": "ladder"}
    shape_grid = {
        "r8b2-mean": {},
        "r8b2-attn": {"pool": "attention"},
        "r8b2-summary": {"pool": "summary"},
        "r8b1": {"blocks": 1},
        "r8b3": {"blocks": 3},
        "r4b2": {"reduction": 4},
        "r8b2-top4": {"top_layers": 4},
        "r16b2": {"reduction": 16},
    }
    init_grid = {
        f"{init}-lr{lr:g}": {"init": init, "training": {"learning_rate": lr}}
        for lr in (1e-3, 3e-4, 1e-4)
        for init in ("random", "encoder")
    }
    grid = {"shape": shape_grid, "init": init_grid}[grid_name]
    return {k: {**base, **v} for k, v in grid.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, metavar="RUN_DIR")
    parser.add_argument("config", type=Path, metavar="CONFIG")
    parser.add_argument("task", metavar="TASK")
    parser.add_argument("ftseed", type=int, metavar="FT_SEED")
    parser.add_argument("checkpoint", type=checkpoint_argument, metavar="CHECKPOINT")
    parser.add_argument("out", type=Path, metavar="OUT_DIR")
    parser.add_argument("max_epochs", type=int, nargs="?", default=12, metavar="MAX_EPOCHS")
    parser.add_argument("grid_name", nargs="?", default="shape", choices=("shape", "init"), metavar="GRID")
    args = parser.parse_args()
    root, task, ftseed, checkpoint, out = args.root, args.task, args.ftseed, args.checkpoint, args.out
    S = declare_config_tasks([args.config], run_directory(root))
    spec = known_task(task)
    model = S.models[0]
    run = Run(model, task, ftseed, checkpoint)
    encoder_dir = root / run.format(CHECKPOINT_DIR)
    if checkpoint.fraction == 0 and not encoder_dir.exists():
        encoder_dir = Path(resolve_pretrained(S.finetune(model, task).backbone))
    source = StreamSource(
        str(encoder_dir),
        str(root / TOKENS_DIR.format(model=model, task=task)),
        S.extract(),
        S.extract_compute(),
        S.extract_attrs(run),
    )
    heads = grid_heads(args.grid_name)
    settings = S.head_training(task).replace(max_epochs=args.max_epochs, patience=3)
    t0 = time.time()
    train_heads(
        spec,
        {
            name: HeadSettings(
                spec={k: v for k, v in head.items() if k != "training"},
                training=settings.replace(**head.get("training", {})),
            )
            for name, head in heads.items()
        },
        S.head_runtime(),
        source,
        [1],
        out,
        threads=1,
        raw_dir=root / RAW_DIR.format(task=task),
    )
    print(f"{task} ft{ftseed} checkpoint {checkpoint}: {time.time() - t0:.0f} s")
    for name in heads:
        r = read_json(head_run_dir(out, name, 1) / HEAD_METRICS)
        sel = [round(h["selection"][spec.primary_metric], 3) for h in r["history"]]
        print(f"{name:14s} params {r['parameters']:7d} best epoch {r['best_epoch']:2d} selection {max(sel):.3f} "
              f"curve {sel}")  # fmt: skip


if __name__ == "__main__":
    run_script(main)
