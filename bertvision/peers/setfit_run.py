"""SetFit (the setfit library) on a single-text classification task: contrastive fine-tuning of
the sentence encoder on pairs drawn from the training rows (a bounded number of steps), then its
logistic-regression head on the tuned embeddings."""

from __future__ import annotations

import numpy as np

from bertvision.config.settings import SetfitPeer
from bertvision.models.encoder_io import bare_encoder_parameter_count
from bertvision.peers.embedding import in_label_columns


def train_setfit(source: str, settings: SetfitPeer, learning_rate: float, texts: list[str], labels: np.ndarray,
                 seed: int):  # fmt: skip
    """A trained SetFitModel from the sentence-transformers folder (or hub id) ``source``."""
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = SetFitModel.from_pretrained(source)
    model.model_body.max_seq_length = settings.max_length
    args = TrainingArguments(
        batch_size=settings.batch_size,
        num_iterations=settings.pairs_per_example // 2,  # setfit draws two pairs per example an iteration
        num_epochs=1,
        max_steps=settings.max_pair_steps,
        body_learning_rate=learning_rate,
        seed=seed,
        show_progress_bar=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
    )
    data = Dataset.from_dict({"text": list(texts), "label": [int(x) for x in labels]})
    Trainer(model=model, args=args, train_dataset=data).train()
    return model


def setfit_outputs(model, texts: list[str], num_labels: int) -> np.ndarray:
    """(N, num_labels) log-probabilities of the model's head (its logistic regression's columns are
    the labels its training rows held)."""
    proba = model.predict_proba(list(texts), as_numpy=True)
    return in_label_columns(proba, model.model_head.classes_, num_labels)


def setfit_parameters(model) -> int:
    """The sentence encoder's parameters that its embedding reads (all tuned; BERT's pooler, which
    a sentence embedding never runs, gets no gradient) and the head's weights and intercepts."""
    body = bare_encoder_parameter_count(model.model_body[0].auto_model)
    head = model.model_head
    return int(body + np.size(head.coef_) + np.size(head.intercept_))
