"""The model side of serving, no HTTP: the bundle's encoder, tokenizer and heads, and one call
that answers a batch of requests for any of the bundle's tasks from ONE encoder forward pass.

The features are computed exactly as the pipeline computed the heads' training features:
texts tokenized as ``stages.tokenize`` does (span tasks: ``build_windows``), padded batches from
``collate``, the encoder under the extraction precision's autocast, every hidden state stored
as float16 and read back as float32; a per-example head sees (layers, hidden) per example (the
[CLS] states or the mean over real tokens, as it ``reads``), a token head
every real token with a padding mask, a span head every window's tokens, and span answers are
decoded with the evaluation's functions and the null threshold tuned on the selection split
(``serving.answers`` reads a batch's outputs as answers).

Each text is tokenized once per distinct ``max_length`` among its tasks (in the common case,
tasks of equal max_length, once) and identical token sequences are encoded once, for every task
that reads them; the batch's sequences, span windows included, sorted by length, go through the
encoder in chunks of at most ``max_chunk_rows`` sequences and ``max_batch_tokens`` padded tokens
(so that short texts are not padded to the batch's longest, and the memory that every layer's
states take stays bounded).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertvision.data.squad_windows import build_windows
from bertvision.data.token_ids import tokenize_frame
from bertvision.data.tokenized import TokenizedSplit, collate, length_batches
from bertvision.features.encode import pair_features, per_example_states
from bertvision.models.encoder_io import (
    load_encoder,
    load_task_model,
    pad_id,
    summary_position,
    uses_token_types,
)
from bertvision.models.head_io import load_head
from bertvision.models.heads import span_logits
from bertvision.registry.heads import head_reads
from bertvision.registry.states import READS
from bertvision.runtime.backend import backend_of, with_backend
from bertvision.runtime.device import autocast, pick_device, set_threads, to_device
from bertvision.serving.answers import answerability, bert_outputs, example_result, span_answer, with_bert
from bertvision.serving.backend_check import heads_served_on
from bertvision.serving.bundle import Bundle, BundleError, TaskEntry, load_bundle
from bertvision.serving.checks import RequestChecks
from bertvision.serving.items import (
    PAIR,
    SINGLE,
    Encoded,
    ExampleResult,
    QuestionItem,
    Sequences,
    SpanGroup,
    SpanResult,
    TextItem,
)
from bertvision.serving.settings import DEFAULTS

log = logging.getLogger(__name__)


class Engine:
    """Loads a bundle's encoder (eval mode), tokenizer and every head; ``predict`` answers a batch.
    ``encoder_passes`` counts encoder forward calls: one per ``predict`` call unless it holds more
    than ``max_chunk_rows`` sequences (0: no bound) or ``max_batch_tokens`` padded tokens."""

    def __init__(
        self,
        bundle: Bundle | Path,
        device: str = "auto",
        max_windows: int = DEFAULTS.max_windows,
        threads: int | None = None,
        max_batch_tokens: int = DEFAULTS.max_batch_tokens,
        pad_multiple: int = DEFAULTS.pad_multiple,
        backend: str | None = None,
        max_chunk_rows: int = DEFAULTS.max_chunk_rows,
    ):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        set_threads(threads)
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(Path(bundle))
        self.device = pick_device(device)
        self.precision = self.bundle.precision
        self.max_batch_tokens, self.pad_multiple = max_batch_tokens, pad_multiple
        self.max_chunk_rows = max_chunk_rows or None
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        encoder_dir = str(self.bundle.encoder_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(encoder_dir, use_fast=True)
        if not self.tokenizer.is_fast:
            raise BundleError(f"{encoder_dir}: no fast tokenizer (tokenizer.json)")
        summary_position(self.tokenizer)
        if self.bundle.task_model:  # ensembles: the task's whole model gives states and BERT's outputs
            model = load_task_model(encoder_dir, self.bundle.tasks[self.bundle.task_model].kind)
        else:
            model = load_encoder(encoder_dir)
        # the bundle's backend unless told otherwise: states computed as the heads' were
        self.encoder = with_backend(
            model.to(self.device).eval(), backend or self.bundle.backend, threads, self.precision
        )
        self.backend = backend_of(self.encoder)
        self.pad_id = pad_id(self.encoder)
        self.token_types = uses_token_types(self.tokenizer, self.encoder.config)
        layers, hidden = self.bundle.layers, self.bundle.hidden
        self.heads = {
            (task.name, name): load_head(entry.dir, layers, entry.state_width(hidden), task.outputs).to(self.device)
            for task in self.bundle.tasks.values()
            for name, entry in task.heads.items()
        }
        self.encoder_passes = 0
        self.sequences_encoded = 0
        if self.backend != self.bundle.backend:  # states unlike the heads': measured before anything is served
            reference = with_backend(model, self.bundle.backend, threads)
            self.bundle = heads_served_on(self, reference, self.bundle.precision, self.backend)
            self.encoder_passes = self.sequences_encoded = 0
        # A second instance for the request checks, which run beside a batch: one fast tokenizer
        # changing its truncation settings from two threads at once fails ("Already borrowed").
        self.checks = RequestChecks(
            self.bundle.tasks, AutoTokenizer.from_pretrained(encoder_dir, use_fast=True), max_windows
        )
        log.info(
            "serving %s on %s (%s): %s",
            self.bundle.root,
            self.device,
            self.backend,
            {t: list(e.heads) for t, e in self.bundle.tasks.items()},
        )

    # --- what it serves -----------------------------------------------------------------------
    @property
    def tasks(self) -> dict[str, TaskEntry]:
        return self.bundle.tasks

    # --- answering ------------------------------------------------------------------------------
    def predict(
        self, texts: list[TextItem], questions: list[QuestionItem] | None = None
    ) -> tuple[list[dict[str, ExampleResult]], list[dict[str, SpanResult]]]:
        """Per text, task -> its result; per question, question task -> its answer (span tasks: a
        SpanResult; answerability: an ExampleResult from its best window); from one encoder pass."""
        questions = questions or []
        sequences = Sequences()
        text_rows = self._tokenize_texts(texts, sequences)
        span_groups = self._tokenize_questions(questions, sequences)
        if not len(sequences):
            return [{} for _ in texts], [{} for _ in questions]
        encoded = self._encode(sequences, self._token_readers(texts, text_rows, questions, span_groups))
        return (
            self._example_results(texts, text_rows, encoded),
            self._question_results(questions, span_groups, encoded),
        )

    def _token_readers(
        self,
        texts: list[TextItem],
        text_rows: list[dict[str, int]],
        questions: list[QuestionItem],
        span_groups: list[SpanGroup],
    ) -> dict[int, set[tuple[str, str]]]:
        """Row -> the (task, head) pairs that read every token of it."""
        readers: dict[int, set[tuple[str, str]]] = {}
        for i, item in enumerate(texts):
            for task, head in item.heads.items():
                if self.tasks[task].heads[head].level == "tokens":
                    readers.setdefault(text_rows[i][task], set()).add((task, head))
        for group in span_groups:
            for row, q in zip(group.rows, group.windows.idx):
                item = questions[group.questions[int(q)]]
                pairs = {(t, item.heads[t]) for t in group.tasks if t in item.heads}
                pairs = {(t, h) for t, h in pairs if self.tasks[t].heads[h].level == "tokens"}
                if pairs:
                    readers.setdefault(row, set()).update(pairs)
        return readers

    def _sequence_rows(self, values: list[tuple[str, ...]], fields, max_length: int, sequences: Sequences) -> list[int]:
        """The rows in ``sequences`` of these texts (a tuple of ``fields`` each), tokenized as the
        tokenize stage does."""
        frame = pd.DataFrame({name: [v[k] for v in values] for k, name in enumerate(fields.text_fields)})
        frame["idx"], frame["label"] = np.arange(len(values)), 0
        encoded = tokenize_frame(frame, fields, self.tokenizer, max_length)
        return [sequences.add(ids, types) for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"])]

    def _tasks_at(self, item: TextItem, max_length: int, apart: bool) -> list[str]:
        """``item``'s tasks of this max_length whose asked head reads its texts encoded apart
        (``apart``) or not."""
        pair = len(item.texts) == 2
        return [
            t
            for t, head in item.heads.items()
            if self.tasks[t].max_length == max_length and (pair and self.tasks[t].heads[head].pair == "apart") == apart
        ]

    def _tokenize_texts(self, texts: list[TextItem], sequences: Sequences) -> list[dict[str, int | tuple[int, int]]]:
        """Per item, task -> its row in ``sequences`` (a pair encoded apart: its two texts' rows);
        each text tokenized once per distinct max_length and form."""
        rows: list[dict] = [{} for _ in texts]
        lengths = sorted({self.tasks[t].max_length for item in texts for t in item.heads})
        for max_length in lengths:
            for fields, arity in ((SINGLE, 1), (PAIR, 2)):
                joint = [
                    i
                    for i, item in enumerate(texts)
                    if len(item.texts) == arity and self._tasks_at(item, max_length, False)
                ]
                if joint:
                    found = self._sequence_rows([tuple(texts[i].texts) for i in joint], fields, max_length, sequences)
                    for i, row in zip(joint, found):
                        rows[i].update({t: row for t in self._tasks_at(texts[i], max_length, False)})
            apart = [i for i, item in enumerate(texts) if self._tasks_at(item, max_length, True)]
            if apart:
                sides = [(text,) for i in apart for text in texts[i].texts]
                found = self._sequence_rows(sides, SINGLE, max_length, sequences)
                for k, i in enumerate(apart):
                    pair_rows = (found[2 * k], found[2 * k + 1])
                    rows[i].update({t: pair_rows for t in self._tasks_at(texts[i], max_length, True)})
        return rows

    def _tokenize_questions(self, questions: list[QuestionItem], sequences: Sequences) -> list[SpanGroup]:
        groups: dict[tuple[int, int], list[str]] = {}
        for name in dict.fromkeys(t for item in questions for t in item.heads):
            task = self.tasks[name]
            groups.setdefault((task.max_length, task.doc_stride), []).append(name)
        out = []
        for (max_length, stride), tasks in groups.items():
            items = [i for i, item in enumerate(questions) if any(t in item.heads for t in tasks)]
            frame = pd.DataFrame(
                {
                    "question": [questions[i].question for i in items],
                    "context": [questions[i].context for i in items],
                    "answer_texts": [[] for _ in items],
                    "answer_starts": [[] for _ in items],
                }
            )
            windows = TokenizedSplit(build_windows(frame, self.tokenizer, max_length, stride))
            rows = [sequences.add(ids, types) for ids, types in zip(windows.input_ids, windows.token_type_ids)]
            out.append(SpanGroup(tasks, items, windows, rows))
        return out

    def _encode(self, sequences: Sequences, readers: dict[int, set[tuple[str, str]]]) -> Encoded:
        """The forward pass over every sequence of the batch (in length-sorted chunks of at most
        ``max_chunk_rows`` sequences and ``max_batch_tokens`` padded tokens): every hidden state,
        float16 as stored; the token-level heads are applied chunk by chunk, so a batch of long
        contexts never holds every token's states at once."""
        split = sequences.split(self.token_types)
        states = {reads: np.empty((len(split), self.bundle.layers, self.bundle.hidden), np.float16) for reads in READS}
        bert: dict[int, np.ndarray] = {}
        outputs: dict[tuple[str, str], dict[int, np.ndarray]] = {}
        for rows in length_batches(split.lengths, self.max_batch_tokens, self.max_chunk_rows, self.pad_multiple):
            batch = to_device(collate(split, rows, self.pad_id, multiple_of=self.pad_multiple), self.device)
            with torch.inference_mode():
                with autocast(self.device, self.precision):
                    out = self.encoder(**batch, output_hidden_states=True)
                hidden = out.hidden_states
                if self.bundle.task_model:
                    bert.update(bert_outputs(out, rows, split.lengths))
                for reads, pooled in per_example_states(hidden, batch["attention_mask"]).items():
                    states[reads][rows] = pooled.to("cpu", torch.float16).numpy()
                reading = [j for j, row in enumerate(rows) if int(row) in readers]
                if reading:
                    self._apply_token_heads(
                        hidden,
                        rows[reading],
                        split.lengths,
                        readers,
                        outputs,
                        torch.as_tensor(reading, device=self.device),
                    )
            self.encoder_passes += 1
        self.sequences_encoded += len(split)
        return Encoded(states, outputs, bert)

    def _apply_token_heads(
        self, hidden, rows: np.ndarray, lengths: np.ndarray, readers: dict, outputs: dict, index: torch.Tensor
    ) -> None:
        """Heads reading every token of ``rows`` (at ``index`` in the chunk): the states of the
        real tokens, float16 as stored, read back as float32, padding zeroed as training pads."""
        real = torch.as_tensor(lengths[rows])
        width = int(real.max())
        x = torch.stack([h[index, :width] for h in hidden], dim=2).to("cpu", torch.float16).float()
        mask = torch.arange(width)[None, :] < real[:, None]
        x = x.masked_fill(~mask[..., None, None], 0.0)
        for task, head in sorted({pair for row in rows for pair in readers[int(row)]}):
            sel = [k for k, row in enumerate(rows) if (task, head) in readers[int(row)]]
            span = self.tasks[task].is_span
            out = self._run_head(task, head, x[sel], mask[sel], span=span)
            target = outputs.setdefault((task, head), {})
            for k, values in zip(sel, out):
                target[int(rows[k])] = values[: int(real[k])] if span else values

    def _run_head(
        self, task: str, head: str, x: torch.Tensor, mask: torch.Tensor | None = None, span: bool = False
    ) -> np.ndarray:
        """Outputs per example ([CLS] heads: no mask; token heads pool the real tokens), or per
        token for span heads (as in training: ``span_logits``)."""
        module = self.heads[task, head]
        with torch.inference_mode():
            args = (x.to(self.device),) if mask is None else (x.to(self.device), mask.to(self.device))
            return (span_logits(module, *args) if span else module(*args)).float().cpu().numpy()

    def _example_results(
        self, texts: list[TextItem], text_rows: list[dict[str, int]], encoded: Encoded
    ) -> list[dict[str, ExampleResult]]:
        results: list[dict[str, ExampleResult]] = [{} for _ in texts]
        for task_name, head in dict.fromkeys((t, h) for item in texts for t, h in item.heads.items()):
            task = self.tasks[task_name]
            items = [i for i, item in enumerate(texts) if item.heads.get(task_name) == head]
            rows = [text_rows[i][task_name] for i in items]
            entry = task.heads[head]
            if entry.level == "tokens":
                outputs = [encoded.token_outputs[task_name, head][row] for row in rows]
            else:
                outputs = self._run_head(task_name, head, self._example_input(entry, encoded, rows))
            ensemble = task.heads[head].ensemble
            if ensemble:
                outputs = with_bert(task, ensemble["how"], outputs, [encoded.bert_logits[row] for row in rows])
            for i, out in zip(items, outputs):
                results[i][task_name] = example_result(task, head, out)
        # the order the tasks were asked in
        return [{t: results[i][t] for t in item.heads} for i, item in enumerate(texts)]

    @staticmethod
    def _example_input(entry, encoded: Encoded, rows: list) -> torch.Tensor:
        """What a per-example head reads for ``rows``, as its training read it: the stored states it
        ``reads``, or for a pair encoded apart the ``pair_features`` of its two texts' rows, rounded as stored."""
        states = encoded.example_states[head_reads(entry.spec)]
        if entry.pair != "apart":
            return torch.from_numpy(states[rows].astype(np.float32))
        a, b = (torch.from_numpy(states[[row[side] for row in rows]]) for side in (0, 1))
        return pair_features(a, b).to(torch.float16).float()

    def _question_results(
        self, questions: list[QuestionItem], groups: list[SpanGroup], encoded: Encoded
    ) -> list[dict[str, SpanResult | ExampleResult]]:
        """Per question, its windows' outputs read as evaluation reads them: span logits decoded
        with the null threshold; answerability labels from the best window (``best_window``)."""
        results: list[dict] = [{} for _ in questions]
        for group in groups:
            by_question: dict[int, list[int]] = {}
            for w, q in enumerate(group.windows.idx):
                by_question.setdefault(int(q), []).append(w)
            for task_name in group.tasks:
                task = self.tasks[task_name]
                for head in dict.fromkeys(
                    questions[i].heads[task_name] for i in group.questions if task_name in questions[i].heads
                ):
                    window_outputs = self._window_outputs(task_name, head, group, encoded)
                    for q, i in enumerate(group.questions):
                        if questions[i].heads.get(task_name) != head:
                            continue
                        windows = by_question.get(q, [])
                        if task.is_span:
                            spans = [
                                (window_outputs[w][:, 0], window_outputs[w][:, 1], group.windows.offsets[w])
                                for w in windows
                            ]
                            results[i][task_name] = span_answer(task, head, questions[i].context, spans)
                        else:
                            results[i][task_name] = answerability(task, head, [window_outputs[w] for w in windows])
        return [{t: results[i][t] for t in item.heads} for i, item in enumerate(questions)]

    def _window_outputs(self, task: str, head: str, group: SpanGroup, encoded: Encoded) -> list[np.ndarray]:
        """The head's outputs for every window of the group: read from the token pass (span and
        token-level heads), or the per-example head run over the windows' states; a head + BERT
        ensemble combines them window by window with BERT's, as the evaluation does."""
        entry = self.tasks[task]
        if entry.heads[head].level == "tokens":
            computed = encoded.token_outputs.get((task, head), {})
            outputs = [computed.get(row) for row in group.rows]
        else:
            x = encoded.example_states[head_reads(entry.heads[head].spec)][group.rows]
            states = torch.from_numpy(x.astype(np.float32))
            outputs = list(self._run_head(task, head, states))
        ensemble = entry.heads[head].ensemble
        if not ensemble or not outputs:
            return outputs
        return with_bert(entry, ensemble["how"], outputs, [encoded.bert_logits[row] for row in group.rows])
