"""The frozen encoder run by ONNX Runtime on the CPU (``backend: onnx`` or ``onnx-int8``).

The checkpoint's model (bare encoder, or the task model with BERT's head) is exported once with
every hidden state as one output, (states, batch, tokens, hidden), and its head's outputs beside
it; ``onnx-int8`` quantizes that export's weights to int8 (ONNX Runtime's dynamic quantization:
activations quantized per batch at run time). The exports are cached (``$BERTVISION_CACHE``, else
``~/.cache/bertvision``) under a key of the checkpoint's weights file, size and time, the model
kind and the torch version, each written to a temporary name and renamed into place, so that
concurrent jobs never read a half-written file. Where the cache cannot be written (a service in a
container whose home is read-only), the export goes to a scratch folder, removed once ONNX
Runtime has read it, and a warning says so: it only costs a new export next time.

``OnnxEncoder`` answers the calls the pipeline makes of a Hugging Face model
(``model(**batch, output_hidden_states=True)`` gives ``hidden_states`` and ``logits`` or
``start_logits``/``end_logits``); its ``config`` and ``parameters()`` stay the PyTorch model's,
so every record counts the same encoder. Why ONNX Runtime: on a CPU it fuses the attention and
layer-norm kernels PyTorch's eager mode runs one op at a time, and runs int8 matrix products
(docs/results/onnx-backend-*.md holds what it gave on our CPUs)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from bertvision.errors import SettingsError
from bertvision.files import atomic_path
from bertvision.models.random_encoder import cache_root

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
# The attention the export traces. Scaled-dot-product attention exports as a masked softmax
# (IsNaN, Where) that ONNX Runtime runs as it is; the eager attention's plain MatMul-Softmax-MatMul
# graph ran 1.18x faster in int8 on the Intel Xeon with AMX, the same states (§6 of
# docs/results/onnx-backend-xeon-amx.md).
EXPORT_ATTENTION = "eager"

log = logging.getLogger(__name__)


class _Exported(nn.Module):
    """What the export traces: the hidden states stacked into one tensor, the head's outputs
    (logits, or start/end logits stacked on the last axis) beside them."""

    def __init__(self, model, token_types: bool):
        super().__init__()
        self.model, self.token_types = model, token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kwargs = {"token_type_ids": token_type_ids} if self.token_types else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **kwargs)
        states = torch.stack(out.hidden_states)
        if getattr(out, "logits", None) is not None:
            return states, out.logits
        if getattr(out, "start_logits", None) is not None:
            return states, torch.stack([out.start_logits, out.end_logits], dim=-1)
        return (states,)


def _weights_key(model) -> str:
    """What names one set of weights: the files the model was loaded from (size and time), its
    class and the torch version that exports it."""
    source = Path(model.config._name_or_path or ".")
    parts = [type(model).__name__, torch.__version__, EXPORT_ATTENTION, str(source.resolve())]
    for weights in sorted(source.glob("*.safetensors")) if source.is_dir() else []:
        stat = weights.stat()
        parts.append(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


EXPORT_FILES = {"onnx": "fp32.onnx", "onnx-int8": "int8-per-channel-7bit.onnx"}


def export_dir(model) -> Path:
    """Where ``model``'s exports are cached (``EXPORT_FILES``)."""
    return cache_root() / "onnx" / _weights_key(model)


def export_folder(model) -> tuple[Path, bool]:
    """The folder ``model``'s exports go to, and whether it is the cache's (kept) or, where the
    cache cannot be written, a scratch folder its reader removes (``OnnxEncoder``)."""
    folder = export_dir(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(folder, os.W_OK) else "not writable"
    except OSError as err:
        problem = err.strerror
    if not problem:
        return folder, True
    log.warning(
        "the ONNX export cache %s cannot be written (%s): exporting into a scratch folder, removed once "
        "loaded; set BERTVISION_CACHE to a writable folder to keep the export", folder, problem,
    )  # fmt: skip
    return Path(tempfile.mkdtemp(prefix="bertvision-onnx-")), False


def _token_types(model) -> bool:
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters


@contextlib.contextmanager
def traced_attention(model):
    """``model`` with EXPORT_ATTENTION's attention for the trace, its own again afterwards."""
    own = model.config._attn_implementation
    model.set_attn_implementation(EXPORT_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


def export(model, out: Path) -> Path:
    """``model`` (eval mode, CPU) exported to ``out`` with dynamic batch and length."""
    token_types = _token_types(model)
    names = list(INPUTS if token_types else INPUTS[:2])
    ids = torch.ones((2, 8), dtype=torch.long)
    sample = (ids, torch.ones_like(ids), torch.zeros_like(ids))[: len(names)]
    wrapped = _Exported(model, token_types).eval()
    with torch.inference_mode(False), torch.no_grad():
        probe = wrapped(*sample)
    outputs = ["hidden_states", "head_outputs"][: len(probe)]
    axes = {name: {0: "batch", 1: "tokens"} for name in names}
    axes["hidden_states"] = {1: "batch", 2: "tokens"}
    if len(probe) > 1:
        axes["head_outputs"] = {0: "batch", **({1: "tokens"} if probe[1].dim() == 3 else {})}
    # the tracer's warnings name branches on shapes (padding, causality) that every input of an
    # encoder takes the same way: the export is checked against PyTorch's states by the tests
    with atomic_path(out) as tmp, traced_attention(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped,
            sample,
            str(tmp),
            input_names=names,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return out


def quantize(fp32: Path, out: Path) -> Path:
    """The int8 copy of ``fp32``: weights int8 per output channel in 7 bits (``reduce_range``:
    no overflow in the int16 sums of CPUs without VNNI), activations quantized per batch at run
    time. Per channel, the default backbone's mean-pooled last layer stays at cosine 0.990 of
    fp32's on SST-2 sentences, against 0.957 per tensor, at about the same speed."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # ONNX Runtime logs to the root logger: a hint to its pre-processing (the int8 states' fidelity
    # was measured without it, docs/results/onnx-int8-fidelity.md) and a line per node it quantizes,
    # about 70 at the start of every service; its warnings stay
    def hint(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and "pre-processing before quantization" not in record.getMessage()

    logging.getLogger().addFilter(hint)
    try:
        with atomic_path(out) as tmp:
            quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    finally:
        logging.getLogger().removeFilter(hint)
    return out


def exported(model, backend: str, folder: Path | None = None) -> Path:
    """The export of ``model`` for ``backend`` in ``folder`` (the cache's), made on first use; an
    encoder the exporter cannot trace is a SettingsError naming the backend to use instead."""
    folder = folder or export_dir(model)
    fp32 = folder / EXPORT_FILES["onnx"]
    if not fp32.exists():
        log.info("backend %s: exporting the encoder to %s", backend, fp32)
        try:
            export(model, fp32)
        except Exception as err:  # the exporter's errors have no common base: a tracer's, an operator's, onnx's
            raise SettingsError(
                f"backend {backend}: this encoder could not be exported to ONNX ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); run it with backend torch"
            ) from err
    if backend != "onnx" and not (folder / EXPORT_FILES[backend]).exists():
        quantize(fp32, folder / EXPORT_FILES[backend])
    path = folder / EXPORT_FILES[backend]
    log.info("backend %s: %s", backend, path)
    return path


def onnx_runtime():
    """``onnxruntime``, or a SettingsError saying it is not installed."""
    try:
        import onnxruntime
    except ImportError as err:
        raise SettingsError(f"the ONNX backends need onnxruntime, which does not import here ({err}): "
                            "install it (pip install onnxruntime) or run with backend torch") from None  # fmt: skip
    return onnxruntime


class OnnxEncoder:
    """``model``'s forward pass run by ONNX Runtime (CPU), with ``threads`` intra-op threads
    (torch's own count when None)."""

    def __init__(self, model, backend: str, threads: int | None = None):
        ort = onnx_runtime()
        if backend not in ("onnx", "onnx-int8"):
            raise ValueError(f"backend {backend!r}: not an ONNX backend (onnx, onnx-int8)")
        self.model, self.backend = model.eval(), backend
        self.config = model.config
        folder, kept = export_folder(model)
        self.path = exported(model, backend, folder)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # idle threads sleep instead of spinning: beside a service's own threads (tokenizing,
        # batching, the heads) or a second encoder's session, spinning takes the cores they need
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        if not kept:  # the session holds the model; a scratch export is not left behind
            shutil.rmtree(folder, ignore_errors=True)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.head_kind = "start_end" if hasattr(model, "qa_outputs") else "logits"

    # the parts of nn.Module's interface the pipeline uses
    def parameters(self):
        return self.model.parameters()

    def to(self, device):
        if torch.device(device).type != "cpu":
            raise ValueError(f"the ONNX backends run on the CPU, not {device}")
        return self

    def eval(self):
        return self

    def requires_grad_(self, flag: bool = True):
        return self

    def __getattr__(self, name):  # base_model_prefix, the base model's modules: the PyTorch model's
        return getattr(self.__dict__["model"], name)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, output_hidden_states=True, **_):
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feed = {}
        for name in self.inputs:
            value = given[name]
            if value is None:  # a tokenizer without token types: segment 0 everywhere, as BERT's default
                value = torch.zeros_like(input_ids)
            feed[name] = np.ascontiguousarray(value.detach().cpu().numpy().astype(np.int64))
        outputs = self.session.run(None, feed)
        states = torch.from_numpy(outputs[0])
        hidden_states = tuple(states.unbind(0))
        answer = SimpleNamespace(
            hidden_states=hidden_states, last_hidden_state=hidden_states[-1], logits=None, start_logits=None
        )
        if len(outputs) > 1:
            head = torch.from_numpy(outputs[1])
            if self.head_kind == "start_end":
                answer.start_logits, answer.end_logits = head[..., 0], head[..., 1]
            else:
                answer.logits = head
        return answer
