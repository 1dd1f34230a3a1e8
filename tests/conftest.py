from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTVISION_SHARED_DATA", REPO.parent / "shared" / "data"))
SHIPPED_GLUE = REPO / "resources" / "glue"
SNAKEFILE = REPO / "workflow" / "Snakefile"


def workflow_settings(**sections):
    """WorkflowSettings of a minimal config (the default backbone, MRPC from the shipped GLUE
    files) with ``sections`` replacing its top-level sections: the typed settings of every
    stage, with every default from the schema."""
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings
    from tests.tiny_bert import DEFAULT_BACKBONE

    config = {
        "backbones": {"m": {"pretrained": DEFAULT_BACKBONE}},
        "tasks": {"mrpc": None},
        "data": {"glue_dir": str(SHIPPED_GLUE), "squad_dir": str(REPO / "resources" / "squad2")},
        **sections,
    }
    return WorkflowSettings(validate_config(config))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    from tests.tiny_bert import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def shared_glue() -> Path:
    path = SHARED_DATA / "glue"
    if not path.exists():
        pytest.skip(f"{path} not present (the shared benchmark data is not part of the project)")
    return path


# --- end-to-end runs through Snakemake ------------------------------------------------------------
def snakemake_command(workdir: Path, *args: str, snakefile: Path = SNAKEFILE, timeout: int | None = None) -> list[str]:
    """The command line of the workflow in ``workdir`` on its config.yaml, killed (SIGKILL)
    after ``timeout`` seconds when one is given."""
    guard = ["timeout", "-s", "KILL", str(timeout)] if timeout else []
    workflow = ["-s", str(snakefile), "-d", str(workdir), "--configfile", str(workdir / "config.yaml")]
    return [*guard, sys.executable, "-m", "snakemake", *workflow, *args]


def snakemake(workdir: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    """The workflow in ``workdir`` on its config.yaml (2 cores); a failure shows the last logs."""
    cmd = snakemake_command(workdir, "--cores", "2", *args, timeout=timeout)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in sorted((workdir / "logs").rglob("*.log"))[-3:])
        raise AssertionError(
            f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs}"
        )
    return proc


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Rule -> job count from a dry run's 'Job stats' table."""
    block = dry_run_output.split("Job stats:")[1]
    counts = {}
    for line in block.splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        counts[match.group(1)] = int(match.group(2))
    counts.pop("total", None)
    return counts


# SQuAD 2.0 as the shipped data has it: its dev file alone, split by article (no train file is shipped)
SHIPPED_SQUAD = {"article_split": {"from": "dev", "train": 0.6, "selection": 0.1, "dev": 0.3}}


def squad_slice(train: int, selection: int, evaluate: int, **options) -> dict:
    """A SQuAD 2.0 task entry of a test config: that many questions from the shipped dev file,
    split by article, plus ``options`` (max_length, doc_stride, heads, ...)."""
    return {
        **SHIPPED_SQUAD,
        "train_size": train,
        "selection_size": selection,
        "eval_size": evaluate,
        **options,
    }


def tiny_config(tiny_bert: Path) -> dict:
    """The tiny end-to-end config: a few dozen examples per task on the tiny random BERT, every
    stage and experiment of the workflow (tests/test_workflow.py reads its run)."""
    return {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {
            "glue_dir": str(SHIPPED_GLUE),
            "squad_dir": str(REPO / "resources" / "squad2"),
            "selection_fraction": 0.2,
        },
        "tasks": {
            # every token's states, so mrpc also trains the token-level head (stsb leaves it out)
            "mrpc": {
                "train_size": 50,
                "eval_size": 30,
                "token_features": True,
                "peers": ["embedding", "lora"],
                "heads": ["lp", "adapter8", "tokpool", "ladder"],
            },
            # states streamed into its head jobs (store: false): search, data fraction and
            # transfer run on them too
            "stsb": {
                "train_size": 50,
                "eval_size": 30,
                "search_heads": ["adapter8"],
                "store": False,
                "peers": ["embedding", "cosine", "bitfit"],
            },
            "squad2": squad_slice(30, 20, 30, max_length=128, doc_stride=64, heads=["lp", "ladder"], peers=["lora"]),
            # the same questions' answerability, from each window's [CLS] states
            "squad2-answerable": squad_slice(30, 20, 30, max_length=128, doc_stride=64, peers=["bitfit"]),
            # RTE and WNLI share their labels: RTE's heads answer WNLI as they are (head_transfer);
            # heads of their pairs as one sequence and encoded apart (each text alone), on every
            # encoder, shared ones included
            "rte": {"train_size": 40, "eval_size": 30, "peers": [], "heads": ["lp", "adapter8", "lp-apart", "cos"]},
            "wnli": {"train_size": 40, "eval_size": 30, "peers": [], "heads": ["lp", "adapter8", "lp-apart", "cos"]},
        },
        "shared": {
            "tasks": ["rte", "wnli", "squad2"],
            "heads": ["lp", "lp-apart"],
            "mixtures": {"mix": {"tasks": ["rte", "squad2"], "epochs": 1}},
        },
        "finetune": {"epoch_fractions": [0, 1.0], "settings": {"batch_size": 8}},
        "baseline": {"epochs": 2, "seeds": [1, 2]},
        # every peer but SetFit (single-text classification: tests/test_honest_choices.py), each on
        # the tasks that name it; LoRA and BitFit choose between two learning rates on selection
        "peers": {
            "lora": {"rank": 2, "learning_rates": [1e-3, 1e-2], "epochs": 2},
            "bitfit": {"learning_rates": [1e-3, 1e-2], "epochs": 2},
        },
        "extract": {"shards": 2, "batch_size": 16},
        # one thread per fine-tuning job too (2 by default), so that two jobs share the 2 cores
        "resources": {"threads": 1},
        "search": {
            "trials": 3,
            "workers": 2,
            "space": {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}, "width": {"choices": [4, 8]}},
        },
        "experiments": {
            "data_fraction": {"tasks": ["stsb"], "heads": ["lp"], "fractions": [0.5], "checkpoints": [1.0]},
            "transfer": {"tasks": ["mrpc", "stsb"]},
        },
        "heads": {
            "seeds": [1, 2],
            "training": {"max_epochs": 3, "patience": 2, "batch_size": 16},
            # every head, seed and checkpoint, so the tables' rows can be checked whole; the race
            # (the default) runs end to end in tests/test_race.py and tests/test_honest_choices.py
            "race": {"protocol": "grid"},
            "models": {
                "lp": {"type": "lp"},
                "adapter8": {"type": "adapter", "width": 8, "skip": True},
                "tokpool": {"type": "token-pool"},
                "ladder": {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 1, "init": "encoder"},
                # pairs encoded apart (rte, wnli list them; bands, a pair of its own, takes every head)
                "lp-apart": {"type": "lp", "pair": "apart"},
                "cos": {"type": "cosine", "reads": "mean"},
            },
        },
    }


def copy_workdir(src: Path, dst: Path) -> Path:
    """A copy of a finished run's working directory that Snakemake takes for the same finished
    run: every file and folder keeps its modification time (copy2, then copystat on folders),
    and Snakemake's records (.snakemake: each output's params, code and inputs) come along. A
    test that changes anything in a shared run works on such a copy."""
    return Path(shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copy2))


@dataclass(frozen=True)
class WorkflowRun:
    """A finished Snakemake run: its working directory (read it, never write to it: copy it
    with ``copy_to``) and the config it ran (``config`` is a fresh copy at every call)."""

    workdir: Path
    _config: dict

    @property
    def config(self) -> dict:
        return copy.deepcopy(self._config)

    def copy_to(self, dst: Path) -> Path:
        return copy_workdir(self.workdir, dst)


@pytest.fixture(scope="session")
def tiny_workflow(tiny_bert, tmp_path_factory) -> WorkflowRun:
    """ONE Snakemake run of ``tiny_config`` for the whole session, shared by the end-to-end
    tests that read its outputs."""
    workdir = tmp_path_factory.mktemp("tiny-workflow")
    config = tiny_config(tiny_bert)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    snakemake(workdir)
    return WorkflowRun(workdir, config)
