"""No choice reads the reported split. The workflow runs twice on the same data except for the
dev labels (MRPC's classes flipped, STS-B's scores mirrored, SQuAD's dev questions made
unanswerable); every choice must come out the same: the baseline's and the peers' kept epochs
and settings, each head's epoch, the race's survivors and checkpoints, the search's best trial,
the null thresholds, the cost table's BERT reference, the path the summary picks and every
bundle's served heads and seeds. The run covers two fine-tuning seeds, the ladder and token-pool
(MRPC's every token), a pair encoded apart with mean and cosine heads (STS-B), a streamed task
(SST-2), answerability and spans (SQuAD 2.0) and a task of the config's own. The dev scores must
differ, or the test would prove nothing; a choice planted to read dev must be caught."""

from __future__ import annotations

import gzip
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, SHIPPED_GLUE, snakemake, squad_slice

pytestmark = pytest.mark.slow


def config(tiny_bert: Path, glue_dir: Path, squad_dir: Path) -> dict:
    return {
        "backbones": {"tiny": {"pretrained": str(tiny_bert)}},
        "data": {"glue_dir": str(glue_dir), "squad_dir": str(squad_dir), "selection_fraction": 0.3},
        "tasks": {
            # every token's states: the ladder and token-pool choose their epochs too
            "mrpc": {
                "train_size": 60,
                "eval_size": 40,
                "search_heads": ["adapter8"],
                "peers": ["lora"],
                "token_features": True,
                "heads": ["lp", "adapter8", "tokpool", "ladder"],
            },
            # the pair as one sequence and each text encoded alone: selection chooses among the forms
            "stsb": {
                "train_size": 60,
                "eval_size": 40,
                "peers": ["embedding", "cosine"],
                "heads": ["lp", "lp-mean-apart", "cos"],
            },
            "squad2": squad_slice(30, 20, 30, max_length=128, doc_stride=64, heads=["lp"], peers=[]),
            "squad2-answerable": squad_slice(30, 20, 30, max_length=128, doc_stride=64, heads=["lp"], peers=[]),
            # single texts: SetFit's task kind, no heads of its own beyond lp; its states streamed
            # into the head jobs (store: false)
            "sst2": {
                "train_size": 60,
                "eval_size": 40,
                "heads": ["lp"],
                "peers": ["setfit", "embedding"],
                "store": False,
            },
            # a task of the config's own, three classes from a CSV in the run's folder (own_files)
            "bands": {
                "files": {"train": "own/bands-train.csv", "dev": "own/bands-dev.csv"},
                "text": ["first", "second"],
                "label": "band",
                "kind": "classification",
                "labels": list(BANDS),
                "peers": ["bitfit"],
            },
        },
        # two fine-tuning seeds: the pick averages over them and a bundle serves one
        "finetune": {"epoch_fractions": [0, 0.5, 1.0], "seeds": [1, 2], "settings": {"batch_size": 8}},
        "baseline": {"epochs": 3, "seeds": [1, 2]},
        # every peer chooses among two settings on selection (the embedding: features x strengths)
        "peers": {
            "lora": {"rank": 2, "learning_rates": [1e-3, 1e-2], "epochs": 2},
            "bitfit": {"learning_rates": [1e-3, 1e-2], "epochs": 2},
            "setfit": {"learning_rates": [1e-4, 1e-3], "pairs_per_example": 2, "max_pair_steps": 4, "batch_size": 8},
        },
        "extract": {"batch_size": 16},
        "resources": {"threads": 1},  # one thread per fine-tuning job too: two jobs share the 2 cores
        # one worker: the trials run in order, so the study is a function of its objective values
        "search": {"trials": 4, "workers": 1, "space": {"learning_rate": {"low": 1e-3, "high": 3e-2, "log": True}}},
        "heads": {
            "seeds": [1, 2],
            "training": {"max_epochs": 4, "patience": 2, "batch_size": 16},
            "models": {
                "lp": {"type": "lp"},
                "adapter8": {"type": "adapter", "width": 8},
                "lp-mean": {"type": "lp", "reads": "mean"},
                "lp-mean-apart": {"type": "lp", "reads": "mean", "pair": "apart"},
                "cos": {"type": "cosine", "reads": "mean"},
                "tokpool": {"type": "token-pool"},
                "ladder": {"type": "ladder", "reduction": 4, "attention_heads": 2, "blocks": 1},
            },
            # the heads and the checkpoints race (on the selection split): who goes on is a choice too
            "race": {"protocol": "racing", "rungs": [1, 2], "keep": 0.5},
        },
        # cross-task picks and the served heads are choices too
        "shared": {"tasks": ["mrpc", "stsb"], "mixtures": {"mix": {"tasks": ["mrpc", "stsb"], "epochs": 0.5}}},
    }


BANDS = ("low", "mid", "high")


def own_files(workdir: Path, rotate_dev: bool) -> None:
    """The ``bands`` task's CSV files from STS-B's shipped rows (scores cut into three bands); with
    ``rotate_dev``, every dev label moved to the next band."""
    from bertvision.data.glue_files import locate, parse_split
    from bertvision.registry.tasks import get_task

    stsb = get_task("stsb")
    (workdir / "own").mkdir(parents=True)
    for split, n in (("train", 80), ("dev", 40)):
        rows = parse_split(locate(SHIPPED_GLUE, stsb, split), stsb, split).head(n)
        bands = [BANDS[0] if x < 2 else BANDS[1] if x < 3.5 else BANDS[2] for x in rows["label"]]
        if split == "dev" and rotate_dev:
            bands = [BANDS[(BANDS.index(b) + 1) % 3] for b in bands]
        frame = pd.DataFrame({"first": rows["sentence1"], "second": rows["sentence2"], "band": bands})
        frame.to_csv(workdir / "own" / f"bands-{split}.csv", index=False)


def rewrite_gz_tsv(src: Path, dst: Path, change) -> None:
    lines = gzip.decompress(src.read_bytes()).decode("utf-8").splitlines(keepends=True)
    out = [lines[0]] + [change(line.rstrip("\n").split("\t")) + "\n" for line in lines[1:]]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(gzip.compress("".join(out).encode("utf-8")))


def flip_mrpc(fields):
    fields[0] = str(1 - int(fields[0]))
    return "\t".join(fields)


def mirror_stsb(fields):
    fields[-1] = f"{5.0 - float(fields[-1]):.3f}"
    return "\t".join(fields)


def flip_sst2(fields):
    fields[-1] = str(1 - int(fields[-1]))
    return "\t".join(fields)


def changed_glue(root: Path) -> Path:
    rewrite_gz_tsv(SHIPPED_GLUE / "SST-2" / "dev.tsv.gz", root / "SST-2" / "dev.tsv.gz", flip_sst2)
    shutil.copy(SHIPPED_GLUE / "SST-2" / "train.tsv.gz", root / "SST-2" / "train.tsv.gz")
    for folder in ("MRPC", "STS-B"):
        (root / folder).mkdir(parents=True)
        shutil.copy(SHIPPED_GLUE / folder / "train.tsv.gz", root / folder / "train.tsv.gz")
    rewrite_gz_tsv(SHIPPED_GLUE / "MRPC" / "dev.tsv.gz", root / "MRPC" / "dev.tsv.gz", flip_mrpc)
    rewrite_gz_tsv(SHIPPED_GLUE / "STS-B" / "dev.tsv.gz", root / "STS-B" / "dev.tsv.gz", mirror_stsb)
    return root


def changed_squad(root: Path, dev_titles: set[str]) -> Path:
    """The SQuAD file with every question of the articles that form the dev split made
    unanswerable (the train and selection articles untouched)."""
    src = REPO / "resources" / "squad2" / "dev-v2.0.json.gz"
    data = json.loads(gzip.decompress(src.read_bytes()))
    for article in data["data"]:
        if article["title"] in dev_titles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qa["plausible_answers"], qa["answers"], qa["is_impossible"] = qa["answers"], [], True
    root.mkdir(parents=True)
    (root / "dev-v2.0.json.gz").write_bytes(gzip.compress(json.dumps(data).encode("utf-8")))
    return root


def run(workdir: Path, cfg: dict, rotate_dev: bool) -> Path:
    own_files(workdir, rotate_dev)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(workdir)
    return workdir


def records(workdir: Path, pattern: str) -> dict[str, dict]:
    return {str(p.relative_to(workdir)): json.loads(p.read_text()) for p in sorted(workdir.glob(pattern))}


# Left out of the comparison: dev scores, times, and the study's name (its digest covers the
# feature manifest, whose checksums include the dev shards: a new name, not a new choice).
IGNORED = {"dev", "data_wait_share", "study"}


def selection_view(record) -> object:
    """Everything in a record except dev scores, times and names: what the choices were made from."""
    if isinstance(record, dict):
        return {k: selection_view(v) for k, v in record.items() if k not in IGNORED and "seconds" not in k}
    if isinstance(record, list):
        return [selection_view(v) for v in record]
    return record


def dev_scores(recs: dict[str, dict]) -> list:
    return [r["metrics"]["dev"] for r in recs.values() if r["metrics"] is not None]  # checkpoint 0: not scored


def squad_dev_titles(cfg: dict, out_dir: Path) -> set[str]:
    """The titles of the articles that form SQuAD's dev split under ``cfg`` (its download stage)."""
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings
    from bertvision.registry.tasks import get_task
    from bertvision.stages.download import download_task

    squad_only = {**cfg, "tasks": {"squad2": cfg["tasks"]["squad2"]}, "shared": {}}
    download_task(get_task("squad2"), WorkflowSettings(validate_config(squad_only)).download("squad2"), out_dir)
    return set(pd.read_parquet(out_dir / "dev.parquet")["title"])


@pytest.fixture(scope="module")
def two_runs(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("honest")
    shipped = config(tiny_bert, SHIPPED_GLUE, REPO / "resources" / "squad2")
    dev_titles = squad_dev_titles(shipped, root / "squad-split")
    changed = config(tiny_bert, changed_glue(root / "glue"), changed_squad(root / "squad", dev_titles))
    # the two runs side by side (neither reads the other), each on 2 cores: they fill each other's gaps
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run, root / name, cfg, changed_labels)
            for name, cfg, changed_labels in (("as-shipped", shipped, False), ("dev-labels-changed", changed, True))
        ]
        first, second = (r.result() for r in runs)
    assert set(pd.read_parquet(first / "data/raw/squad2/dev.parquet")["title"]) == dev_titles
    return first, second


def test_the_dev_labels_did_change(two_runs):
    first, second = two_runs
    for task in ("mrpc", "stsb", "squad2", "squad2-answerable", "bands", "sst2"):
        a, b = (pd.read_parquet(w / f"data/raw/{task}/dev.parquet") for w in two_runs)
        assert not a.equals(b), task
        for split in ("train", "selection"):
            assert pd.read_parquet(first / f"data/raw/{task}/{split}.parquet").equals(
                pd.read_parquet(second / f"data/raw/{task}/{split}.parquet")
            ), (task, split)


@pytest.mark.parametrize(
    "pattern",
    [
        "baselines/tiny/*/seed*/metrics.json",  # the kept epoch and its selection history
        "peers/tiny/*/*/seed*/metrics.json",  # each peer's settings and epoch, every one it tried
        "models/tiny/*/ft*/ckpt-*/eval_metrics.json",  # BERT's selection scores and null thresholds
        "heads/tiny/*/ft*/ckpt-*/*/seed*/metrics.json",  # each head's epoch, history, threshold, search params
        "search/tiny/*/ft*/ckpt-*/*/best.json",  # the best trial
        "race/tiny/*/ckpt-*.json",  # the race between checkpoints: where fine-tuning stopped
        "shared/tiny/*/ft*/heads/*/*/seed*/metrics.json",  # heads on the other tasks' and the mixture's encoders
        "bundles/tiny/**/bundle.json",  # the seed kept per head and the head served per task, picked ones too
    ],
)
def test_no_choice_changes_with_the_dev_labels(two_runs, pattern):
    first, second = (records(w, pattern) for w in two_runs)
    assert first and first.keys() == second.keys()
    for name in first:
        assert selection_view(first[name]) == selection_view(second[name]), name
    if "metrics" in next(iter(first.values())):
        assert dev_scores(first) != dev_scores(second)  # the dev scores did move


def test_summary_and_cost_picks_do_not_change(two_runs):
    summaries = [pd.read_csv(w / "results/tables/summary.csv") for w in two_runs]
    keys = ["backbone", "task", "row", "checkpoint", "model", "n", "selection_mean", "trainable_params"]
    assert summaries[0][keys].equals(summaries[1][keys])
    assert not summaries[0]["dev_mean"].equals(summaries[1]["dev_mean"])
    assert {"full fine-tuning", "BERTVision (picked)", "frozen encoder (best head)"} <= set(summaries[0]["row"])
    cross = [pd.read_csv(w / "results/tables/cross_task.csv") for w in two_runs]
    keys = ["backbone", "task", "encoder", "role", "head", "n", "selection_mean", "parameters"]
    assert len(cross[0]) == 2 * 4 and cross[0][keys].equals(cross[1][keys])  # 2 tasks x 4 encoders
    costs = [pd.read_csv(w / "results/tables/cost.csv") for w in two_runs]
    assert costs[0]["bert_pick_checkpoint"].equals(costs[1]["bert_pick_checkpoint"])
    # the null threshold of every SQuAD model comes from the selection split
    heads = [records(w, "heads/tiny/squad2/ft*/ckpt-*/lp/seed*/metrics.json") for w in two_runs]
    thresholds = [[r["metrics"]["dev"]["null_threshold"] for r in h.values()] for h in heads]
    assert thresholds[0] == thresholds[1]


def best_by_dev(recs: dict[str, dict]) -> dict[str, tuple]:
    """Per task, the (checkpoint's heads, head, seed) with the best dev score: a choice made on
    the reported split, as a leak would make it."""
    from bertvision.registry.tasks import get_task

    best: dict[str, tuple] = {}
    for name, record in recs.items():
        task = get_task(record["task"])
        score = task.primary_score(record["metrics"], "dev")
        if record["task"] not in best or score > best[record["task"]][0]:
            best[record["task"]] = (score, str(Path(name).parent.parent.parent), record["head"], record["seed"])
    return {task: choice[1:] for task, choice in best.items()}


def test_a_choice_that_reads_dev_is_caught(two_runs, monkeypatch):
    """The comparison is not blind: the head each task would keep by its dev score differs
    between the two runs, and the view the tests above compare sees the difference; kept by the
    selection score, the same choice is the same in both."""
    from bertvision.config.schema import validate_config
    from bertvision.config.workflow import WorkflowSettings

    monkeypatch.chdir(two_runs[0])  # the config's own task (bands) is declared from its files there
    WorkflowSettings(validate_config(yaml.safe_load(Path("config.yaml").read_text())))
    pattern = "heads/tiny/*/ft*/ckpt-*/*/seed*/metrics.json"
    first, second = (records(w, pattern) for w in two_runs)
    leaked = [{"kept": best_by_dev(recs)} for recs in (first, second)]
    assert selection_view(leaked[0]) != selection_view(leaked[1])

    def best_by_selection(recs):
        swapped = {n: {**r, "metrics": {**r["metrics"], "dev": r["metrics"]["selection"]}} for n, r in recs.items()}
        return best_by_dev(swapped)

    assert selection_view({"kept": best_by_selection(first)}) == selection_view({"kept": best_by_selection(second)})
