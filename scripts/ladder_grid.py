"""A small grid of ladder heads, scored on the SELECTION split only (never dev): every variant
trains in lockstep on one streamed encoder pass per epoch of a run's checkpoint, with one seed,
and the selection score of every epoch is printed. It reads the run's config for the
extraction and head-training settings. Checkpoint 0 is the untouched backbone: read from the
backbone itself when the run has not fine-tuned yet (only the task's tokens are needed).

    python scripts/ladder_grid.py RUN_DIR CONFIG TASK FT_SEED CHECKPOINT OUT_DIR [MAX_EPOCHS [GRID]]

GRID: ``shape`` (side width, blocks, layers, pooling; docs/results/ladder-grid.md) or ``init``
(random vs the encoder's own layers, at three learning rates; docs/results/ladder-init-grid.md).
"""

import json
import sys
import time
from pathlib import Path

import yaml

from bertvision.config.schema import validate_config
from bertvision.config.settings import HeadSettings
from bertvision.config.workflow import WorkflowSettings
from bertvision.features.source import StreamSource
from bertvision.layout import CHECKPOINT_DIR, RAW_DIR, TOKENS_DIR, Checkpoint, Run
from bertvision.models.backbone import resolve_pretrained
from bertvision.registry.tasks import get_task
from bertvision.stages.train_heads import train_heads

root, config = Path(sys.argv[1]), Path(sys.argv[2])
task, ftseed, checkpoint, out = sys.argv[3], int(sys.argv[4]), Checkpoint.named(sys.argv[5]), Path(sys.argv[6])
max_epochs = int(sys.argv[7]) if len(sys.argv) > 7 else 12
grid_name = sys.argv[8] if len(sys.argv) > 8 else "shape"
S = WorkflowSettings(validate_config(yaml.safe_load(config.read_text())))
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
heads = {k: {**base, **v} for k, v in grid.items()}
settings = S.head_training(task).replace(max_epochs=max_epochs, patience=3)
t0 = time.time()
train_heads(
    get_task(task),
    {
        name: HeadSettings(
            spec={k: v for k, v in spec.items() if k != "training"},
            training=settings.replace(**spec.get("training", {})),
        )
        for name, spec in heads.items()
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
    r = json.loads((out / name / "seed1" / "metrics.json").read_text())
    sel = [round(h["selection"][get_task(task).primary_metric], 3) for h in r["history"]]
    print(
        f"{name:14s} params {r['parameters']:7d} best epoch {r['best_epoch']:2d} selection {max(sel):.3f} curve {sel}"
    )
