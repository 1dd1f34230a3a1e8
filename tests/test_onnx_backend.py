"""The encoder run by ONNX Runtime (``extract.backend``, ``bertvision serve --backend``): the same
states and head outputs as PyTorch's on every real token, in extraction as in a forward pass,
exported once per set of weights; int8 weights close to them; the config refuses what cannot run."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from bertvision.config.settings import ExtractCompute, ExtractSettings
from bertvision.errors import ConfigError
from bertvision.features.store import read_shard, write_manifest
from bertvision.models.encoder_io import load_encoder, load_task_model
from bertvision.models.onnx_encoder import EXPORT_ATTENTION, EXPORT_FILES, OnnxEncoder, export_dir
from bertvision.runtime.backend import with_backend
from tests.test_pairs_apart import tokens_apart  # noqa: F401 (a fixture)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path_factory.getbasetemp() / "onnx-cache"))


def batch_of(tiny_bert, texts):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    return tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")


TEXTS = ["a man plays the guitar", "stocks fell sharply on friday after the report", "yes", ("a b c", "d e")]


def real_token_difference(a, b, mask) -> float:
    return max(float((x[mask] - y[mask]).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", [None, "classification", "span"])
def test_onnx_states_and_head_outputs_equal_pytorchs_on_every_real_token(tiny_bert, kind):
    torch.manual_seed(0)
    model = (load_encoder(str(tiny_bert)) if kind is None else load_task_model(str(tiny_bert), kind)).eval()
    onnx = with_backend(model, "onnx", threads=1)
    assert isinstance(onnx, OnnxEncoder) and onnx.config is model.config
    # a batch of another size and length than the export's sample: the axes are dynamic
    texts = [t if isinstance(t, str) else t[0] for t in TEXTS]
    batch = batch_of(tiny_bert, texts)
    with torch.inference_mode():
        want = model(**batch, output_hidden_states=True)
        got = onnx(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].bool()
    assert len(got.hidden_states) == len(want.hidden_states)
    assert real_token_difference(want.hidden_states, got.hidden_states, mask) < 1e-4
    if kind == "classification":
        np.testing.assert_allclose(got.logits.numpy(), want.logits.numpy(), atol=1e-4)
    if kind == "span":
        for side in ("start_logits", "end_logits"):
            np.testing.assert_allclose(getattr(got, side)[mask].numpy(), getattr(want, side)[mask].numpy(), atol=1e-4)
    if kind is None:  # no token types given (a tokenizer without them): segment 0, as the model's own default
        pair = batch_of(tiny_bert, [TEXTS[-1]])
        with torch.inference_mode():
            want = model(pair["input_ids"], pair["attention_mask"], output_hidden_states=True)
            got = onnx(pair["input_ids"], pair["attention_mask"], output_hidden_states=True)
        assert real_token_difference(want.hidden_states, got.hidden_states, pair["attention_mask"].bool()) < 1e-4


def test_int8_weights_give_states_close_to_fp32s(tiny_bert):
    model = load_encoder(str(tiny_bert)).eval()
    int8 = with_backend(model, "onnx-int8", threads=1)
    batch = batch_of(tiny_bert, [t for t in TEXTS if isinstance(t, str)])
    with torch.inference_mode():
        want = model(**batch, output_hidden_states=True).hidden_states[-1]
        got = int8(**batch, output_hidden_states=True).hidden_states[-1]
    mask = batch["attention_mask"].bool()
    a, b = want[mask].flatten().numpy(), got[mask].flatten().numpy()
    assert not np.allclose(a, b, atol=1e-4)  # quantized: not the fp32 computation
    assert np.corrcoef(a, b)[0, 1] > 0.99


def test_quantizing_logs_no_hint_the_run_does_not_follow(tiny_bert, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))  # a fresh cache: the export is quantized here
    with caplog.at_level("INFO"):
        int8 = with_backend(load_encoder(str(tiny_bert)).eval(), "onnx-int8", threads=1)
    assert int8.path.is_relative_to(tmp_path) and int8.path.exists()
    assert "pre-processing" not in caplog.text
    # nor a line per node it quantizes (about 70 at a service's start)
    assert not [r for r in caplog.records if r.name == "root" and r.levelno < logging.WARNING], caplog.text


def test_each_set_of_weights_is_exported_once(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))
    model = load_encoder(str(tiny_bert)).eval()
    first = with_backend(model, "onnx", threads=1)
    stamp = first.path.stat().st_mtime_ns
    assert first.path == export_dir(model) / EXPORT_FILES["onnx"] and first.path.is_relative_to(tmp_path)
    again = with_backend(load_encoder(str(tiny_bert)).eval(), "onnx", threads=1)
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp
    task_model = with_backend(load_task_model(str(tiny_bert), "classification").eval(), "onnx", threads=1)
    assert task_model.path != first.path  # another graph (the head's outputs too)
    # weights replaced in place by others of the same size: a new export, not the stale one
    copy = tmp_path / "bert"
    shutil.copytree(tiny_bert, copy)
    before = with_backend(load_encoder(str(copy)).eval(), "onnx", threads=1).path
    weights = copy / "model.safetensors"
    tensors = load_file(weights)
    first_name = sorted(tensors)[0]
    tensors[first_name] += 1.0
    save_file(tensors, weights, metadata={"format": "pt"})
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert (copy / "model.safetensors").stat().st_size == (tiny_bert / "model.safetensors").stat().st_size
    assert with_backend(load_encoder(str(copy)).eval(), "onnx", threads=1).path != before


def test_a_cache_that_cannot_be_written_costs_only_a_new_export(tiny_bert, tmp_path, monkeypatch, caplog):
    """A service in a container whose home is read-only: the export goes to a scratch folder,
    removed once loaded, with a warning naming the cache and the setting, and the encoder runs."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path / "a-file" / "cache"))
    model = load_encoder(str(tiny_bert)).eval()
    with caplog.at_level("WARNING"):
        encoder = with_backend(model, "onnx", threads=1)
    assert not encoder.path.is_relative_to(tmp_path) and not encoder.path.parent.exists()
    assert "cannot be written" in caplog.text and "BERTVISION_CACHE" in caplog.text
    ids = torch.ones((1, 5), dtype=torch.long)
    states = encoder(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    assert len(states) == model.config.num_hidden_layers + 1


def test_the_export_traces_the_plain_attention_and_leaves_the_models_own(tiny_bert):
    import onnx as onnx_format

    model = load_encoder(str(tiny_bert)).eval()
    own = model.config._attn_implementation
    assert own != EXPORT_ATTENTION  # else this test proves nothing
    exported = with_backend(model, "onnx", threads=1)
    ops = {node.op_type for node in onnx_format.load(str(exported.path)).graph.node}
    assert "Softmax" in ops and "IsNaN" not in ops  # scaled-dot-product attention's masked softmax is not
    assert model.config._attn_implementation == own


def test_the_torch_backend_is_the_model_itself(tiny_bert):
    model = load_encoder(str(tiny_bert)).eval()
    assert with_backend(model, "torch") is model


def test_auto_off_the_cpu_runs_pytorch_unmeasured(tiny_bert, tmp_path, monkeypatch):
    """ONNX Runtime runs the encoder on the CPU only: an encoder on another device (the meta device
    here, as a GPU's) takes PyTorch, with nothing measured or cached."""
    from bertvision.runtime import precision_probe

    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "probe.json"))
    model = load_encoder(str(tiny_bert)).eval().to("meta")
    assert with_backend(model, "auto", threads=1) is model and not (tmp_path / "probe.json").exists()


def test_extraction_on_onnx_stores_pytorchs_states(tiny_bert, tokens_apart, tmp_path):  # noqa: F811
    """A pair task encoded apart (each distinct text alone): the stored [CLS] and mean states of
    every row, and the shard records which backend computed them."""
    import h5py

    from bertvision.stages.extract import extract_shard

    _, tokens = tokens_apart
    attrs = {"model": "tiny", "task": "stsb", "checkpoint": "0", "ft_seed": 1, "label_kind": "regression"}
    attrs["pair"] = "apart"
    stored = {}
    for backend in ("torch", "onnx"):
        out = tmp_path / backend
        extract_shard(
            tiny_bert,
            tokens,
            out,
            0,
            1,
            ["dev"],
            ExtractSettings(batch_size=4, block_rows=8, block_tokens=256),
            ExtractCompute(device="cpu", precision="fp32", backend=backend),
            attrs,
            threads=1,
        )
        stored[backend] = {reads: read_shard(out / "dev.h5", reads)[0].astype(np.float32) for reads in ("cls", "mean")}
        with h5py.File(out / "dev.h5", "r") as f:
            assert f.attrs["backend"] == backend and f.attrs["precision"] == "fp32"
        assert write_manifest([out], tmp_path / f"{backend}.json", ["dev"])["backend"] == backend
    for reads in ("cls", "mean"):
        # stored as float16: equal up to its rounding
        np.testing.assert_allclose(stored["onnx"][reads], stored["torch"][reads], rtol=2e-3, atol=2e-3)


def test_the_config_takes_a_backend_and_refuses_onnx_on_a_gpu(tiny_bert):
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings

    def settings(extract: dict):
        config = {"backbones": {"tiny": {"pretrained": str(tiny_bert)}}, "tasks": {"sst2": {}}, "extract": extract}
        return WorkflowSettings(validate_config(config, source="c.yaml"), source="c.yaml")

    assert settings({"backend": "onnx-int8"}).extract_compute().backend == "onnx-int8"
    assert settings({}).extract_compute().backend == "torch"
    assert settings({"backend": "auto", "device": "cuda"}).extract_compute().backend == "auto"  # PyTorch on a GPU
    with pytest.raises(ConfigError, match="extract.backend"):
        settings({"backend": "tensorrt"})
    with pytest.raises(ConfigError, match=r"extract\.backend: onnx runs on the CPU.*extract\.device: cuda"):
        settings({"backend": "onnx", "device": "cuda"})
    # a precision they would ignore is refused, not left to the schema's description
    with pytest.raises(ConfigError, match=r"extract\.backend: onnx-int8 computes in fp32 .*extract\.precision: bf16"):
        settings({"backend": "onnx-int8", "precision": "bf16"})
    assert settings({"backend": "onnx", "precision": "fp32"}).extract_compute().precision == "fp32"


def test_the_tables_name_the_runtime_that_computed_the_states():
    from bertvision.reporting.timing import stage_precisions

    streamed = {"task": "sst2", "features_stored": False, "states_precision": "fp32", "device": "cpu"}
    manifests = [
        {"source": {"task": "stsb"}, "precision": "fp32", "backend": "onnx", "device": "cpu"},
        {"source": {"task": "mrpc"}, "precision": "bf16", "backend": "torch", "device": "cpu"},
        {"source": {"task": "rte"}, "precision": "fp32", "device": "cpu"},  # from before backends were recorded
    ]
    found = stage_precisions([], [], [{**streamed, "states_backend": "onnx-int8"}], manifests)
    assert found[("sst2", "train_heads")] == "fp32 (ONNX Runtime, int8 weights) on cpu"
    assert found[("stsb", "extract")] == "fp32 (ONNX Runtime) on cpu"
    assert found[("mrpc", "extract")] == "bf16 on cpu" and found[("rte", "extract")] == "fp32 on cpu"


def test_auto_takes_onnx_only_where_it_measures_clearly_faster_and_measures_once(tiny_bert, tmp_path, monkeypatch):
    from bertvision.runtime import backend as backend_module
    from bertvision.runtime import precision_probe
    from bertvision.runtime.backend import AUTO_MARGIN, backend_of, forward_seconds

    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "probe.json"))
    model = load_encoder(str(tiny_bert)).eval()
    assert forward_seconds(model, "torch") > 0 and forward_seconds(model, "onnx") > 0  # both really run

    def timed(torch_s: float, onnx_s: float):
        return lambda m, backend, precision: {"torch": torch_s, "onnx": onnx_s}[backend]

    monkeypatch.setattr(backend_module, "forward_seconds", timed(1.0, 0.99 / AUTO_MARGIN))
    chosen = with_backend(model, "auto", threads=1)
    assert backend_of(chosen) == "onnx" and isinstance(chosen, OnnxEncoder)
    # once per machine and shape: the next job reads the cache, even where it would measure otherwise
    monkeypatch.setattr(backend_module, "forward_seconds", lambda *a: pytest.fail("measured twice"))
    assert backend_of(with_backend(model, "auto", threads=1)) == "onnx"

    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "other.json"))
    monkeypatch.setattr(backend_module, "forward_seconds", timed(1.0, 1.01 / AUTO_MARGIN))  # within the margin
    chosen = with_backend(model, "auto", threads=1)
    assert chosen is model and backend_of(chosen) == "torch"
    # 5% is within the noise the two forwards showed on one machine (8%): not clearly faster
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "noise.json"))
    monkeypatch.setattr(backend_module, "forward_seconds", timed(1.0, 0.95))
    assert backend_of(with_backend(model, "auto", threads=1)) == "torch"

    # PyTorch is timed in the precision its passes will take (bf16 autocast, where auto resolves to
    # it), ONNX Runtime in fp32; each precision is measured and cached apart
    monkeypatch.setenv(precision_probe.CACHE_ENV, str(tmp_path / "third.json"))
    asked = []
    monkeypatch.setattr(
        backend_module, "forward_seconds", lambda m, backend, precision: asked.append((backend, precision)) or 1.0
    )
    with_backend(model, "auto", threads=1, precision="bf16")
    with_backend(model, "auto", threads=1, precision="fp32")
    assert asked == [("torch", "bf16"), ("onnx", "bf16"), ("torch", "fp32"), ("onnx", "fp32")]
    slowed = []
    real = backend_module.autocast
    monkeypatch.setattr(
        backend_module, "autocast", lambda device, precision: slowed.append(precision) or real(device, precision)
    )
    forward_seconds(model, "torch", "bf16", repeats=1), forward_seconds(model, "onnx", "bf16", repeats=1)
    assert slowed == ["bf16", "fp32"]  # ONNX Runtime takes no autocast


def test_no_onnxruntime_is_one_line_and_auto_runs_pytorch(tiny_bert, monkeypatch, caplog):
    from bertvision.errors import SettingsError

    model = load_encoder(str(tiny_bert)).eval()
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # as where it is not installed
    wanted = (
        r"^the ONNX backends need onnxruntime, which does not import here .*: install it \(pip install onnxruntime\)"
    )
    with pytest.raises(SettingsError, match=wanted + " or run with backend torch$"):
        with_backend(model, "onnx")
    caplog.set_level(logging.WARNING, logger="bertvision.runtime.backend")
    assert with_backend(model, "auto") is model
    assert "backend auto: the ONNX backends need onnxruntime" in caplog.text and caplog.text.rstrip().endswith(
        "running PyTorch"
    )


def test_an_encoder_the_exporter_cannot_trace_is_one_line(tiny_bert, tmp_path, monkeypatch):
    from bertvision.errors import SettingsError
    from bertvision.models import onnx_encoder

    monkeypatch.setenv("BERTVISION_CACHE", str(tmp_path))  # no export cached by another test

    def untraceable(model, out):
        raise RuntimeError("Exporting the operator 'aten::weird' to ONNX opset version 17 is not supported.\nmore")

    monkeypatch.setattr(onnx_encoder, "export", untraceable)
    model = load_encoder(str(tiny_bert)).eval()
    with pytest.raises(SettingsError) as raised:
        with_backend(model, "onnx-int8")
    assert str(raised.value) == (
        "backend onnx-int8: this encoder could not be exported to ONNX (RuntimeError: Exporting the operator "
        "'aten::weird' to ONNX opset version 17 is not supported.); run it with backend torch"
    )
    assert with_backend(model, "auto") is model
