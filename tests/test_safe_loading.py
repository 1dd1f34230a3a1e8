"""Backbones and checkpoints load from safetensors only: a folder that holds only a pickle
checkpoint is one clear error naming it, at fine-tuning and at extraction, never an unpickling."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bertvision.errors import MissingError
from bertvision.features.encode import frozen_encoder
from bertvision.models.backbone import load_pretrained
from bertvision.registry.tasks import get_task
from bertvision.training.encoder import load_classifier
from tests.stages import BERTVISION, extract_args


@pytest.fixture(scope="module")
def pickle_only(tiny_bert, tmp_path_factory) -> Path:
    """The tiny BERT re-saved as pytorch_model.bin (a pickle) with no safetensors beside it."""
    import torch
    from transformers import BertModel

    out = tmp_path_factory.mktemp("pickle-only")
    for f in tiny_bert.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    torch.save(BertModel.from_pretrained(tiny_bert).state_dict(), out / "pytorch_model.bin")
    assert not (out / "model.safetensors").exists()
    # a plain from_pretrained would unpickle it: the refusal below is ours
    assert BertModel.from_pretrained(out).config.num_hidden_layers == 2
    return out


def test_the_safetensors_model_loads(tiny_bert):
    model = load_pretrained("AutoModel", str(tiny_bert), add_pooling_layer=False)
    assert model.config.num_hidden_layers == 2


def test_fine_tuning_refuses_a_pickle_checkpoint_naming_the_folder(pickle_only):
    with pytest.raises(MissingError, match=rf"^{pickle_only}: holds only pickle weights \(pytorch_model.bin\)"):
        load_classifier(get_task("mrpc"), str(pickle_only), seed=1)


def test_extraction_refuses_a_pickle_checkpoint(pickle_only):
    import torch

    with pytest.raises(MissingError, match="safetensors only"):
        frozen_encoder(pickle_only, torch.device("cpu"))


@pytest.mark.slow  # over 10 s on 2 cores (processes, a workflow's plan): make test-all, CI
def test_the_command_line_prints_one_line_and_exits_2(pickle_only, tmp_path):
    settings = {"batch_size": 8, "block_rows": 64, "block_tokens": 1024}
    command = [*BERTVISION, *extract_args(pickle_only, tmp_path, settings, {}, out_dir=tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(pickle_only) in errors[0] and "pickle" in errors[0]
