"""The warm pool of a local run (``runtime.warm``): what it imports ahead of the jobs (torch,
transformers with each backbone's model and tokenizer modules, the data libraries and the stage
of every command, registered in ``commands.stages.COMMANDS``) and the ``main`` its children run.

    python -m bertvision.commands.warm SOCKET BACKBONE...   (started by ``start``)"""

from __future__ import annotations

import sys
from pathlib import Path

from bertvision.runtime.warm import serve_pool
from bertvision.runtime.warm_start import WarmPool, start_pool


def start(backbones: list[str], log_path: Path) -> WarmPool:
    """The warm pool for a run on ``backbones`` (the Snakefile's onstart hook)."""
    return start_pool(__name__, backbones, log_path)


def preload(backbones: list[str]) -> None:
    """Import what the commands use. Nothing here runs a tensor operation."""
    import h5py  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    from bertvision.commands.stages import COMMANDS, stage_of

    import_model_modules(backbones)
    for command in COMMANDS:
        if command != "serve":  # the server runs in a process of its own
            stage_of(command)


def import_model_modules(backbones: list[str]) -> None:
    """Import transformers' model and tokenizer modules of each backbone (transformers' lazy
    module imports each class's module on first access). Nothing here runs a tensor operation."""
    import transformers
    from transformers.models.auto import modeling_auto, tokenization_auto

    from bertvision.models.backbone import config_json
    from bertvision.models.random_encoder import is_random

    for backbone in backbones:
        if is_random(backbone):  # a BERT, built by the first job that needs it (not here: no threads)
            model_type = "bert"
        else:
            try:
                model_type = config_json(backbone).get("model_type")
            except Exception:  # a backbone that is not there: its job says so when it runs
                continue
        for mapping in (modeling_auto.MODEL_MAPPING_NAMES, tokenization_auto.TOKENIZER_MAPPING_NAMES):
            for class_name in _names(mapping.get(model_type)):
                try:
                    getattr(transformers, class_name)
                except (AttributeError, ImportError):
                    pass


def _names(entry) -> list[str]:
    if entry is None:
        return []
    return [n for n in (entry if isinstance(entry, (list, tuple)) else [entry]) if n]


if __name__ == "__main__":
    from bertvision.commands.main import main

    serve_pool(sys.argv[1], lambda: preload(sys.argv[2:]), main)
