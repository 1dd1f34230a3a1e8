"""A hub backbone pinned to a revision (``ORG/NAME@REVISION``), offline against a stand-in of the
Hugging Face cache laid out as huggingface_hub lays it out: two commits of a tiny BERT with
different weights, ``main`` at the second and a ``v1`` tag at the first. Every loader reads the
pinned commit's files, the unpinned id the default branch's, each from its snapshot folder;
planning reads the cached config without asking the hub; a revision that is not there is one
line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bertvision.errors import MissingError
from bertvision.models.backbone import locate
from tests.conftest import REPO, snakemake_command, tiny_config
from tests.tiny_bert import make_tiny_bert

REPO_ID = "bv-test/tiny-bert"
FIRST, SECOND = "1" * 40, "2" * 40  # the two commits
ONE_LINE_SCRIPT = """
import json, sys
import torch
from bertvision.models.backbone import load_tokenizer, position_limit, resolve_pretrained, uncached_hub_id
from bertvision.models.encoder_io import load_encoder
from bertvision.peers.embedding import encode_texts
from bertvision.peers.pooling import declared_pooling
from bertvision.plan.estimates import EncoderShape
from bertvision.registry.tasks import get_task
from bertvision.training.encoder import load_classifier

def weights(model):
    return float(sum(p.double().abs().sum() for p in model.base_model.parameters()))

refs = sys.argv[1:]
print(json.dumps({
    ref: {
        "encoder": weights(load_encoder(ref)),
        "classifier": weights(load_classifier(get_task("rte"), ref, seed=1)),
        "embedding": encode_texts(ref, ["a pinned revision"], 16, 8)[0].tolist(),
        "pooling": declared_pooling(resolve_pretrained(ref)).modes,
        "vocab": len(load_tokenizer(ref)),
        "shape": [EncoderShape.of(ref).layers, EncoderShape.of(ref).hidden],
        "position_limit": position_limit(ref),
        "uncached": uncached_hub_id(ref),
        "folder": resolve_pretrained(ref),
    }
    for ref in refs
}))
"""


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory) -> Path:
    """HF_HOME holding ``REPO_ID`` at two commits (their weights drawn with seeds 1 and 2; the
    first a sentence-transformers layout pooling [CLS]), as huggingface_hub caches a repository:
    snapshots per commit, refs naming them."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    for commit, seed in ((FIRST, 1), (SECOND, 2)):
        make_tiny_bert(repo / "snapshots" / commit, seed=seed)
    first = repo / "snapshots" / FIRST
    (first / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))  # fmt: skip
    (first / "1_Pooling").mkdir()
    (first / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True})
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SECOND)
    (repo / "refs" / "v1").write_text(FIRST)
    return home


def offline(hub_home: Path) -> dict:
    return {**os.environ, "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "1"}


def run_python(hub_home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=600, env=offline(hub_home)
    )


def test_every_loader_reads_the_pinned_commit_and_the_bare_id_the_default_branch(hub_home):
    refs = [f"{REPO_ID}@v1", f"{REPO_ID}@{FIRST}", REPO_ID, f"{REPO_ID}@main"]
    proc = run_python(hub_home, "-c", ONE_LINE_SCRIPT, *refs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.splitlines()[-1])
    tag, commit, bare, main = (loaded[ref] for ref in refs)
    snapshots = hub_home / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots"
    assert Path(tag["folder"]) == Path(commit["folder"]) == snapshots / FIRST
    assert Path(main["folder"]) == Path(bare["folder"]) == snapshots / SECOND
    assert tag["pooling"] == commit["pooling"] == ["cls"] and bare["pooling"] == main["pooling"] == ["mean"]
    for what in ("encoder", "classifier", "embedding"):
        assert tag[what] == commit[what], what
        assert bare[what] == main[what], what
        assert tag[what] != bare[what], f"{what}: the pinned commit's weights are the default branch's"
    for each in loaded.values():
        assert each["vocab"] == 30522 and each["shape"] == [2, 32] and each["position_limit"] == 512
        assert each["uncached"] is False


def test_a_revision_that_is_not_there_is_one_line_naming_it(hub_home, tmp_path):
    settings = json.dumps({"backbone": f"{REPO_ID}@v9", "max_length": 16, "doc_stride": None})
    proc = run_python(
        hub_home, "-m", "bertvision", "tokenize", "--task", "sst2", "--settings", settings,
        "--raw-dir", str(tmp_path), "--out-dir", str(tmp_path / "tokens"),
    )  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert f"bertvision tokenize: error: {REPO_ID}@v9: no snapshot from the hub or its cache (" in errors[0]
    for ref, problem in ((f"{REPO_ID}@", "no revision after '@'"), ("./nowhere@v1", "no such local directory")):
        with pytest.raises(MissingError, match=problem):
            locate(ref)


def test_a_pinned_backbone_is_planned_from_the_cache_and_its_revision_is_in_every_job(hub_home, tiny_bert, tmp_path):
    """The plan reads the cached config (the jobs' memory from its shape) without asking the hub;
    the reference, revision included, is in every job's settings, so a new revision reruns them;
    a revision not cached is still planned (its jobs fetch it) and validate-config notes it."""
    config = tiny_config(tiny_bert)
    config["tasks"] = {"mrpc": config["tasks"]["mrpc"]}
    config.pop("experiments"), config.pop("shared")
    commands = {}
    for revision in ("v1", "v2"):
        config["backbones"] = {"tiny": {"pretrained": f"{REPO_ID}@{revision}"}}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        cmd = snakemake_command(tmp_path, "-n", "-p", "--cores", "2", timeout=300)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=offline(hub_home))
        assert proc.returncode == 0, proc.stderr[-3000:]
        commands[revision] = [line for line in proc.stdout.splitlines() if "bertvision finetune " in line]
        assert commands[revision] and all(f'"backbone": "{REPO_ID}@{revision}"' in c for c in commands[revision])
        validate = run_python(hub_home, "-m", "bertvision", "validate-config", str(tmp_path / "config.yaml"))
        assert validate.returncode == 0, validate.stderr
        assert ("is not in this machine's Hugging Face cache" in validate.stdout) is (revision == "v2")
    assert commands["v1"] != commands["v2"]


@pytest.mark.slow
def test_a_pinned_revision_reaches_the_jobs_snakemake_runs(hub_home, tiny_bert, tmp_path):
    """Through the workflow, offline: the untouched checkpoint that fine-tuning saves holds the
    pinned commit's encoder weights, tensor for tensor."""
    from safetensors.numpy import load_file

    config = tiny_config(tiny_bert)
    config["tasks"] = {"mrpc": config["tasks"]["mrpc"]}
    config.pop("experiments"), config.pop("shared")
    config["backbones"] = {"tiny": {"pretrained": f"{REPO_ID}@v1"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    target = "models/tiny/mrpc/ft1/ckpt-0/model.safetensors"
    proc = subprocess.run(
        snakemake_command(tmp_path, "--cores", "2", target, timeout=600),
        capture_output=True, text=True, env=offline(hub_home),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = load_file(tmp_path / target)
    snapshots = hub_home / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots"
    for commit, same in ((FIRST, True), (SECOND, False)):
        pinned = load_file(snapshots / commit / "model.safetensors")
        # LayerNorm starts at ones and zeros in every commit: the drawn weights tell them apart
        matches = [(name, next(k for k in saved if k.endswith(name))) for name in pinned if "LayerNorm" not in name]
        assert matches
        assert all((pinned[name] == saved[key]).all() for name, key in matches) is same, commit


def test_a_snapshot_fetches_every_file_a_job_reads_and_no_pickle():
    """What ``resolve_pretrained`` asks the hub for, over a sentence-transformers repository's files
    (all-MiniLM-L6-v2's): its configs, pooling, tokenizer and safetensors, never a pickle,
    TensorFlow, Rust or ONNX export."""
    from huggingface_hub.utils import filter_repo_objects

    from bertvision.models.backbone import SNAPSHOT_FILES

    wanted = ["1_Pooling/config.json", "config.json", "config_sentence_transformers.json", "model.safetensors",
              "modules.json", "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json",
              "tokenizer_config.json", "vocab.txt", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
              "spiece.model", "merges.txt", "vocab.json"]  # fmt: skip
    unwanted = ["pytorch_model.bin", "tf_model.h5", "rust_model.ot", "onnx/model.onnx", "openvino/openvino_model.bin",
                "flax_model.msgpack", "train_script.py", ".gitattributes"]  # fmt: skip
    assert sorted(filter_repo_objects(wanted + unwanted, allow_patterns=SNAPSHOT_FILES)) == sorted(wanted)
