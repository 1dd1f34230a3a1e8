"""SQuAD 2.0 answerability (task squad2-answerable): windows as classification rows on the real
dev file, the two ways a question's windows become one prediction, and the config checks."""

import numpy as np
import pandas as pd
import pytest

from bertvision.data.squad_files import parse_squad
from bertvision.data.squad_windows import build_windows
from bertvision.errors import ConfigError
from bertvision.models.backbone import load_tokenizer
from bertvision.registry.metrics import any_window_says_no, best_window, question_gold, question_labels, score
from bertvision.registry.tasks import get_task
from bertvision.stages.tokenize import answer_in_no_window, answerability_windows
from tests.conftest import REPO, SHIPPED_SQUAD, workflow_settings
from tests.tiny_bert import DEFAULT_BACKBONE

TASK = get_task("squad2-answerable")


@pytest.fixture(scope="module")
def questions():
    dev = parse_squad(REPO / "resources" / "squad2" / "dev-v2.0.json.gz")
    # long contexts first, so that most questions need several 96-token windows
    return dev.iloc[np.argsort(-dev["context"].str.len().to_numpy(), kind="stable")[:120]].reset_index(drop=True)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_BACKBONE)


def test_windows_are_labelled_by_whether_they_hold_the_answer(questions, tokenizer):
    rows = answerability_windows(questions, build_windows(questions, tokenizer, max_length=96, stride=48))
    assert rows["idx"].nunique() == len(questions)  # every question keeps its windows
    assert rows.groupby("idx").size().max() >= 3
    impossible = questions.set_index("idx")["is_impossible"]
    for idx, windows in rows.groupby("idx"):
        if impossible[idx]:
            assert (windows["label"] == 1).all()
        else:
            assert (windows["label"] == 0).any() and len(windows) > 1  # the others hold no answer
    held = rows[rows["label"] == 0]
    for _, row in held.head(20).iterrows():
        text = tokenizer.decode(row["input_ids"]).lower()
        answer = questions.set_index("idx").loc[row["idx"], "answer_texts"][0].lower()
        assert tokenizer.decode(tokenizer(answer, add_special_tokens=False)["input_ids"]) in text
    assert answer_in_no_window(questions, rows) == 0
    # a stride shorter than the answers leaves some answerable questions without a whole-answer window
    narrow = answerability_windows(questions, build_windows(questions, tokenizer, max_length=96, stride=2))
    assert answer_in_no_window(questions, narrow) > 0


def test_the_best_window_answers_where_the_original_rule_says_no():
    # question 7: window 1 holds the answer, window 2 does not; question 3: one unsure window
    # each way; question 9: one window, no answer.
    outputs = np.array([[2.0, 0.0], [0.0, 3.0], [0.0, 1.0], [1.0, 0.0], [0.0, 5.0]])
    idx = np.array([7, 7, 3, 3, 9])
    labels = np.array([0, 1, 1, 1, 1])
    assert best_window(outputs, idx).tolist() == [0, 0, 1]
    assert any_window_says_no(outputs, idx).tolist() == [1, 1, 1]
    assert question_labels(labels, idx).tolist() == [0, 1, 1]
    questions = pd.DataFrame({"idx": [3, 7, 9], "answer_texts": [[], ["an answer"], []]})
    metrics = score(TASK, outputs, labels, idx, questions)
    assert metrics["accuracy"] == pytest.approx(2 / 3)  # q3 wrong
    assert metrics["accuracy_any_no"] == pytest.approx(2 / 3)  # q7 wrong
    assert metrics["f1"] == pytest.approx(2 / 3)  # no-answer F1: tp 1 (q9), fn 1 (q3)
    assert metrics["f1_any_no"] == pytest.approx(0.8)  # tp 2, fp 1
    assert metrics["questions"] == 3 and metrics["answerable_no_window"] == 0
    assert metrics["constant_score"] == pytest.approx(2 / 3)  # "no answer" for all three


def test_a_question_is_answerable_when_the_data_says_so_whatever_its_windows_hold():
    # question 3 has an answer that neither of its windows wholly holds (both labelled "no answer"):
    # still answerable, and counted; the best window (margin 1) rightly calls it answerable
    outputs = np.array([[2.0, 0.0], [0.0, 3.0], [0.0, 1.0], [1.0, 0.0], [0.0, 5.0]])
    idx = np.array([7, 7, 3, 3, 9])
    labels = np.array([0, 1, 1, 1, 1])
    questions = pd.DataFrame({"idx": [3, 7, 9], "answer_texts": [["a long answer"], ["an answer"], []]})
    assert question_gold(questions) == {3: 0, 7: 0, 9: 1}
    assert question_labels(labels, idx).tolist() == [0, 1, 1]  # the windows' view: q3 has none
    metrics = score(TASK, outputs, labels, idx, questions)
    assert metrics["answerable_no_window"] == 1
    assert metrics["accuracy"] == pytest.approx(1.0)  # q7 and q3 answerable, q9 not
    assert metrics["accuracy_any_no"] == pytest.approx(1 / 3)  # says "no" for q7 and q3
    with pytest.raises(ValueError, match="needs the split's questions"):
        score(TASK, outputs, labels, idx)
    with pytest.raises(ValueError, match="not in the split's questions"):
        score(TASK, outputs, labels, idx, questions[questions["idx"] != 9])


def test_on_real_windows_the_gold_labels_are_the_datas(questions, tokenizer):
    """Windows too narrow for some answers: those questions stay answerable in the gold labels,
    and the record counts them as the tokenize stage does."""
    narrow = answerability_windows(questions, build_windows(questions, tokenizer, max_length=96, stride=2))
    missed = answer_in_no_window(questions, narrow)
    assert missed > 0
    idx, labels = narrow["idx"].to_numpy(), narrow["label"].to_numpy()
    says_answerable = np.tile([1.0, 0.0], (len(narrow), 1))  # every window: "it holds the answer"
    metrics = score(TASK, says_answerable, labels, idx, questions)
    answerable_share = float((~questions["is_impossible"]).mean())
    assert metrics["accuracy"] == pytest.approx(answerable_share)  # the data's share, not the windows'
    assert metrics["answerable_no_window"] == missed and metrics["questions"] == len(questions)
    assert metrics["constant_score"] == pytest.approx(max(answerable_share, 1 - answerable_share))


def test_a_tie_counts_as_answerable_and_order_follows_first_windows():
    outputs = np.array([[0.0, 1.0], [1.0, 1.0], [0.0, 2.0]])
    assert best_window(outputs, np.array([5, 2, 5])).tolist() == [1, 0]
    # questions 9, 2, 5 in that order of first windows (a permutation that is not its own inverse)
    outputs = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 1.0]])
    idx = np.array([9, 2, 5, 9, 2])
    assert best_window(outputs, idx).tolist() == [0, 0, 1]
    assert any_window_says_no(outputs, idx).tolist() == [1, 1, 1]
    assert question_labels(np.array([1, 0, 1, 1, 1]), idx).tolist() == [1, 0, 1]


def test_registry_and_config_checks():
    assert TASK.windowed and TASK.doc_stride == 128 and TASK.kind == "classification"
    assert TASK.label_names == ("answerable", "no_answer")  # f1 is no-answer's
    with pytest.raises(ConfigError, match=r"tasks.mrpc: \['doc_stride'\] only apply"):
        workflow_settings(tasks={"mrpc": {"doc_stride": 64}})
    with pytest.raises(ConfigError, match="answerability tasks are not shared"):
        workflow_settings(
            tasks={"mrpc": None, "squad2-answerable": SHIPPED_SQUAD},
            shared={"tasks": ["mrpc", "squad2-answerable"], "heads": ["lp"]},
        )
    settings = workflow_settings(tasks={"squad2-answerable": {**SHIPPED_SQUAD, "doc_stride": 64}})
    assert settings.tokenize("m", "squad2-answerable").doc_stride == 64
