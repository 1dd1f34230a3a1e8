"""The service's own API: the request and response bodies of ``POST /predict`` and how a request
becomes the service's items (its tasks, heads and sizes checked, each problem a ``RequestError``
naming the field)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from bertvision.data.text import readable
from bertvision.serving.items import QuestionItem, RequestError, TextItem
from bertvision.serving.service import Service
from bertvision.serving.settings import ServeSettings


# --- request and response bodies ---------------------------------------------------------------
def _text_input(value: Any) -> str | tuple[str, str]:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return (value[0], value[1])
    raise ValueError("a text is a string, or a pair [a, b] of two strings for pair tasks")


TextInput = Annotated[str | tuple[str, str], PlainValidator(_text_input, json_schema_input_type=str | tuple[str, str])]


class QAInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(description="The question.")
    context: str = Field(description="The passage the answer is taken from (long ones span several windows).")


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[TextInput] | None = Field(
        None,
        description=(
            "Inputs of the classification and regression tasks: each a string (single-text tasks such as sst2) or "
            "a pair [a, b] (pair tasks such as mrpc, stsb). Each is tokenized once and encoded once for all tasks."
        ),
    )
    qa: list[QAInput] | None = Field(
        None,
        description=(
            "Inputs of the question tasks: span extraction (squad2) and answerability (squad2-answerable, one "
            "label per question from its best context window)."
        ),
    )
    tasks: list[str] | None = Field(
        None,
        description=(
            "Tasks to answer (GET /tasks lists them). Default: for each text, every example task that takes its "
            "number of texts; for qa items, every question task."
        ),
    )
    heads: dict[str, str] | None = Field(
        None, description=("task -> head to use instead of the task's default head (the best on the selection split).")
    )


class ExampleAnswer(BaseModel):
    head: str = Field(description="The head that answered.")
    label: str | None = Field(None, description="Classification: the predicted label's name.")
    label_id: int | None = None
    probabilities: dict[str, float | None] | None = Field(None, description="Classification: softmax per label.")
    score: float | None = Field(None, description="Regression: the predicted value.")
    outputs: list[float | None] = Field(description="The head's raw outputs (logits, or the regression value).")


class SpanAnswer(BaseModel):
    head: str
    answer: str = Field(description='The answer, "" when the question is judged unanswerable.')
    has_answer: bool
    best_span: str = Field(description="The best span, whatever the null threshold says.")
    score_diff: float | None = Field(description="Best span score - null score (null: no valid span).")
    null_threshold: float = Field(description="Answered when score_diff exceeds it (tuned on the selection split).")


class PredictResponse(BaseModel):
    predictions: list[dict[str, ExampleAnswer]] = Field(description="Per text (in order): task -> answer.")
    answers: list[dict[str, SpanAnswer | ExampleAnswer]] = Field(
        description=(
            "Per qa item (in order): question task -> answer (span tasks: the answer; answerability: the label "
            "and the outputs of the question's most confident window)."
        )
    )


def request_examples(service: Service) -> dict[str, dict]:
    """The docs page's example requests, one per kind of input that the served tasks take."""
    named = {
        "a single text": ("texts", ["A gripping, beautifully acted film."], lambda t: len(t.text_fields) == 1),
        "a pair of texts": ("texts", [["The cat sat.", "A cat was sitting."]], lambda t: len(t.text_fields) == 2),
        "a question": ("qa", [{"question": "Who sat?", "context": "The cat sat on the mat."}], lambda t: True),
    }
    examples = {}
    for summary, (field, value, fits) in named.items():
        tasks = [n for n, t in service.tasks.items() if t.takes_questions == (field == "qa") and fits(t)]
        if tasks:
            examples[summary] = {"summary": summary, "value": {field: value, "tasks": tasks}}
    return examples


# --- checking a request --------------------------------------------------------------------------
def check_not_empty(body: PredictRequest) -> None:
    if body.texts is not None and not body.texts:
        raise RequestError("texts", "empty list; give at least one text (or leave it out and give qa)")
    if body.qa is not None and not body.qa:
        raise RequestError("qa", "empty list; give at least one question/context item (or leave it out)")


def strings(body: PredictRequest):
    """(field, string) of every text, question and context of the request."""
    for i, text in enumerate(body.texts or []):
        if isinstance(text, str):
            yield f"texts[{i}]", text
        else:
            yield from ((f"texts[{i}][{k}]", part) for k, part in enumerate(text))
    for i, item in enumerate(body.qa or []):
        yield f"qa[{i}].question", item.question
        yield f"qa[{i}].context", item.context


def check_sizes(body: PredictRequest, settings: ServeSettings) -> None:
    texts, qa = body.texts, body.qa
    if not texts and not qa:
        raise RequestError("texts", "no inputs: give texts (classification / regression) or qa (question tasks)")
    n = len(texts or []) + len(qa or [])
    if n > settings.max_texts:
        raise RequestError(
            "texts" if texts else "qa", f"{n} inputs, at most {settings.max_texts} per request", status=413
        )
    for field, text in strings(body):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON may carry lone surrogates ("\ud800"); the tokenizer cannot read them
            raise RequestError(field, "not valid Unicode (a lone surrogate)") from None
        if not readable(text):  # as a task's own files refuse it: nothing to read, yet it was answered
            raise RequestError(field, "empty (no letter, digit, punctuation mark or symbol)")
        if len(text) > settings.max_text_chars:
            raise RequestError(field, f"{len(text)} characters, at most {settings.max_text_chars}", status=413)


def chosen_tasks(body: PredictRequest, service: Service) -> tuple[list[str] | None, list[str]]:
    """(example tasks asked by name, or None for each text's default; question tasks)."""
    if body.tasks is None:
        asked = [n for n, t in service.tasks.items() if t.takes_questions] if body.qa else []
        if body.qa and not asked:
            raise RequestError(
                "qa",
                f"this service has no task that answers questions; its tasks ({', '.join(service.tasks)}) take texts",
            )
        return None, asked
    if not body.tasks:
        raise RequestError("tasks", "empty list; leave it out to answer every task that fits the inputs")
    names = list(dict.fromkeys(body.tasks))
    for i, name in enumerate(body.tasks):
        service.task(name, f"tasks[{i}]")
    example = [n for n in names if not service.tasks[n].takes_questions]
    questions = [n for n in names if service.tasks[n].takes_questions]
    if example and not body.texts:
        raise RequestError("texts", f"tasks {', '.join(example)} need texts")
    if questions and not body.qa:
        raise RequestError(
            "qa",
            f"{', '.join(questions)} {'reads' if len(questions) == 1 else 'read'} questions and contexts: "
            "give question/context items in qa",
        )
    if body.texts and not example:
        raise RequestError(
            "texts", f"none of the tasks asked ({', '.join(names)}) takes texts (question tasks take qa)"
        )
    if body.qa and not questions:
        raise RequestError("qa", f"none of the tasks asked ({', '.join(names)}) answers questions (they take texts)")
    return example, questions


def head_choices(body: PredictRequest, service: Service, asked: set[str] | None) -> dict[str, str]:
    """task -> head for every task the request names in ``heads`` (checked)."""
    chosen = {}
    for name, head in (body.heads or {}).items():
        task = service.task(name, f"heads.{name}")
        if asked is not None and name not in asked:
            raise RequestError(
                f"heads.{name}", f"task {name} is not among the tasks asked ({', '.join(sorted(asked))})"
            )
        chosen[name] = service.head(task, head, f"heads.{name}")
    return chosen


def default_tasks(service: Service, arity: int, field: str) -> list[str]:
    names = [n for n, t in service.tasks.items() if not t.takes_questions and len(t.text_fields) == arity]
    if not names:
        kind = "a pair of texts" if arity == 2 else "a single text"
        takers = [f"{n} ({len(t.text_fields)} text(s))" for n, t in service.tasks.items() if not t.takes_questions]
        questions = [n for n, t in service.tasks.items() if t.takes_questions]
        others = [f"its example tasks take {', '.join(takers)}"] if takers else []
        others += [f"{', '.join(questions)} take(s) qa: [{{question, context}}]"] if questions else []
        raise RequestError(field, f"no task of this service takes {kind}; " + "; ".join(others))
    return names


def build_items(
    body: PredictRequest, service: Service, settings: ServeSettings
) -> tuple[list[TextItem], list[QuestionItem]]:
    """The request as service inputs, every check done (RequestError names the field at fault)."""
    check_not_empty(body)
    example, question_tasks = chosen_tasks(body, service)
    check_sizes(body, settings)
    asked = None if example is None and body.texts else set((example or []) + question_tasks)
    heads = head_choices(body, service, asked)
    texts = []
    for i, text in enumerate(body.texts or []):
        parts = (text,) if isinstance(text, str) else tuple(text)
        names = example if example is not None else default_tasks(service, len(parts), f"texts[{i}]")
        item = TextItem(parts, {n: heads.get(n, service.tasks[n].picked) for n in names})
        service.check_text(item, f"texts[{i}]")
        texts.append(item)
    questions = []
    for i, qa in enumerate(body.qa or []):
        item = QuestionItem(qa.question, qa.context, {n: heads.get(n, service.tasks[n].picked) for n in question_tasks})
        service.check_question(item, f"qa[{i}]")
        questions.append(item)
    answered = {name for item in [*texts, *questions] for name in item.heads}
    for name in heads:
        if name not in answered:
            task = service.tasks[name]
            takes = "qa items" if task.takes_questions else f"{len(task.text_fields)} text(s) per input"
            raise RequestError(f"heads.{name}", f"task {name} answers none of the inputs: it takes {takes}")
    return texts, questions


# --- limits and errors ---------------------------------------------------------------------------
