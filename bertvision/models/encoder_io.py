"""What an encoder and its tokenizer take and give, asked of them instead of assumed from BERT:
whether token type ids go in, whether the bare model has a pooler to leave out, where the
summary token ([CLS], <s>) sits and how many hidden states come out. Every architecture that
``AutoModel`` loads goes through here (BERT, RoBERTa, DistilBERT, ELECTRA, DeBERTa-v2, ...)."""

from __future__ import annotations

import inspect

from bertvision.errors import BertvisionError
from bertvision.models.backbone import load_pretrained, resolve_pretrained

# Position of the summary token in every tokenized row; summary_position checks that a
# tokenizer puts it there.
SUMMARY_POSITION = 0


class UnsupportedEncoderError(BertvisionError, ValueError):
    """A tokenizer or model breaks a convention the pipeline relies on."""


def load_model_config(ref: str):
    """The ``transformers`` config of the backbone reference ``ref`` (no remote code)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_pretrained(ref), trust_remote_code=False)


def encoder_class(config) -> type:
    """The bare encoder class ``AutoModel`` builds for ``config``."""
    from transformers import AutoModel

    return AutoModel._model_mapping[type(config)]


def _accepts(function, name: str) -> bool:
    return name in inspect.signature(function).parameters


def encoder_kwargs(config) -> dict:
    """``from_pretrained`` keywords for the bare encoder: no pooler, where the class has one
    (BERT, RoBERTa); DistilBERT, ELECTRA and DeBERTa have none and refuse the keyword."""
    return {"add_pooling_layer": False} if _accepts(encoder_class(config).__init__, "add_pooling_layer") else {}


def load_encoder(ref: str):
    """The bare encoder of ``ref`` (a backbone, a task model's checkpoint or a bare encoder's),
    without pooler or task head, from safetensors only."""
    folder = resolve_pretrained(ref)  # a hub reference is looked up once, not for the config and again for the weights
    return load_pretrained("AutoModel", folder, **encoder_kwargs(load_model_config(folder)))


# Task kind -> the Hugging Face auto class of the encoder with that kind's own head (BERT's head).
TASK_MODEL_CLASSES = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "span": "AutoModelForQuestionAnswering",
}


def load_task_model(ref: str, kind: str):
    """The encoder with its own task head as a fine-tuning checkpoint ``ref`` saved it (its config
    holds the labels), from safetensors only."""
    return load_pretrained(TASK_MODEL_CLASSES[kind], ref)


def bare_encoder_parameter_count(model) -> int:
    """Parameters of the encoder as ``load_encoder`` loads it (no pooler), of a bare encoder or
    of a task model's: the count the features record, whichever model computed them."""
    base = getattr(model, model.base_model_prefix, model)
    pooler = getattr(base, "pooler", None)
    pooled = sum(p.numel() for p in pooler.parameters()) if pooler is not None else 0
    return sum(p.numel() for p in base.parameters()) - pooled


def uses_token_types(tokenizer, config) -> bool:
    """Token type ids go into the model: the tokenizer produces them (they are in its
    ``model_input_names``: not RoBERTa's or DistilBERT's) and the encoder's forward takes them."""
    return "token_type_ids" in tokenizer.model_input_names and _accepts(encoder_class(config).forward, "token_type_ids")


def summary_position(tokenizer) -> int:
    """Where the tokenizer puts its summary token (``cls_token``, else ``bos_token``) in a
    sentence pair: first for every BERT-like family. A tokenizer that puts it elsewhere (XLNet:
    last) or has none is refused, since the features and the span's null answer read it there."""
    name = "cls_token" if tokenizer.cls_token is not None else "bos_token"
    token_id = getattr(tokenizer, f"{name}_id")
    ids = tokenizer("a", "b")["input_ids"]
    if token_id is None or token_id not in ids:
        raise UnsupportedEncoderError(
            f"{type(tokenizer).__name__}: its pairs have no cls or bos token to summarise "
            "them; bertvision reads the summary token's states"
        )
    if ids.index(token_id) != SUMMARY_POSITION:
        raise UnsupportedEncoderError(
            f"{type(tokenizer).__name__}: its {name} ({getattr(tokenizer, name)}) is at "
            f"position {ids.index(token_id)} of a pair, not first; bertvision supports "
            "encoders whose summary token comes first"
        )
    return SUMMARY_POSITION


def hidden_state_shape(model) -> tuple[int, int]:
    """(number of hidden states the encoder returns, their width), from a two-token forward pass:
    the embedding output and each layer's for BERT, whatever the architecture returns otherwise."""
    import torch

    param = next(model.parameters())
    ids = torch.full((1, 2), model.config.pad_token_id or 0, dtype=torch.long, device=param.device)
    with torch.inference_mode():
        states = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
    return len(states), int(states[-1].shape[-1])


def pad_id(model) -> int:
    """The id padding is filled with: the model's (RoBERTa's position ids skip it)."""
    return model.config.pad_token_id or 0


# Where each architecture keeps a transformer layer's weights: (layers path, attention q/k/v/out,
# the norm after attention, feed-forward in/out, the norm after the feed-forward). BERT's naming
# is shared by RoBERTa, ELECTRA and their kin; DistilBERT has its own.
_LAYER_NAMES = {
    "bert": (
        "encoder.layer",
        ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"),
        "attention.output.LayerNorm",
        ("intermediate.dense", "output.dense"),
        "output.LayerNorm",
    ),
    "distilbert": (
        "transformer.layer",
        ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
        "sa_layer_norm",
        ("ffn.lin1", "ffn.lin2"),
        "output_layer_norm",
    ),
}


def encoder_layers(model) -> list[dict]:
    """Every transformer layer of a bare (post-norm) encoder as plain tensors: ``q``, ``k``,
    ``v``, ``out``, ``ff_in``, ``ff_out`` (each ``(weight, bias)``, weights (out, in)), the norm
    on the layer's input ``norm_in`` (the embeddings' or the previous layer's output norm; where
    the embeddings are projected to the hidden width after their norm, as ELECTRA-small's are,
    no norm sits on the first layer's input, and its ``norm_in`` is LayerNorm's own start: ones,
    zeros), the norm between attention and feed-forward ``norm_mid``, its output norm ``norm_out``, and
    ``heads``. Architectures laid out otherwise (DeBERTa's disentangled attention) are refused."""
    from operator import attrgetter

    import torch

    for path, attention, norm_mid, feed_forward, norm_out in _LAYER_NAMES.values():
        try:
            layers = attrgetter(path)(model)
            norm_in = model.embeddings.LayerNorm
            for name in (*attention, norm_mid, *feed_forward, norm_out):
                attrgetter(name)(layers[0])
        except AttributeError:
            continue

        def pair(module):
            return module.weight.detach().float(), module.bias.detach().float()

        hidden = int(model.config.hidden_size)
        input_norm = pair(norm_in) if norm_in.weight.shape[0] == hidden else (torch.ones(hidden), torch.zeros(hidden))
        read = []
        for layer in layers:
            q, k, v, out = (pair(attrgetter(name)(layer)) for name in attention)
            ff_in, ff_out = (pair(attrgetter(name)(layer)) for name in feed_forward)
            read.append(
                {
                    **{"q": q, "k": k, "v": v, "out": out, "ff_in": ff_in, "ff_out": ff_out},
                    "norm_in": input_norm,
                    "norm_mid": pair(attrgetter(norm_mid)(layer)),
                    "norm_out": pair(attrgetter(norm_out)(layer)),
                    "heads": int(model.config.num_attention_heads),
                }
            )
            input_norm = pair(attrgetter(norm_out)(layer))
        return read
    raise UnsupportedEncoderError(
        f"{type(model).__name__}: its layers are not laid out as BERT's or DistilBERT's; "
        "a ladder head's init: encoder cannot read them (use init: random)"
    )


_LAYER_CACHE: dict[str, list[dict]] = {}


def checkpoint_layers(checkpoint_dir: str) -> list[dict]:
    """``encoder_layers`` of a checkpoint's encoder, read once per process (every seed and head
    of a job initialises from the same checkpoint)."""
    if checkpoint_dir not in _LAYER_CACHE:
        _LAYER_CACHE[checkpoint_dir] = encoder_layers(load_encoder(checkpoint_dir))
    return _LAYER_CACHE[checkpoint_dir]
