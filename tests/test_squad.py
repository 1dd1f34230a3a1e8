"""SQuAD 2.0 building blocks on the real dev file (shipped gzip copy): parsing, the official
metric, window construction and n-best decoding."""

import numpy as np
import pandas as pd
import pytest

from bertvision.data.squad_files import parse_squad, split_by_article
from bertvision.data.squad_windows import build_windows
from bertvision.evaluation.squad_decode import Candidate, apply_threshold, decode_question, tune_threshold
from bertvision.evaluation.squad_metric import normalize_answer, squad_v2_metrics
from bertvision.models.backbone import load_tokenizer
from tests.conftest import REPO
from tests.tiny_bert import DEFAULT_BACKBONE

DEV = REPO / "resources" / "squad2" / "dev-v2.0.json.gz"


@pytest.fixture(scope="module")
def dev():
    return parse_squad(DEV)


def test_dev_counts(dev):
    assert len(dev) == 11873
    assert int((~dev["is_impossible"]).sum()) == 5928 and int(dev["is_impossible"].sum()) == 5945
    assert dev["title"].nunique() == 35 and dev["id"].is_unique


def test_official_metric_on_the_full_dev_file(dev):
    golds = dev["answer_texts"].tolist()
    empty = squad_v2_metrics(golds, [""] * len(dev))
    assert round(empty["exact"], 2) == 50.07 and round(empty["f1"], 2) == 50.07
    assert empty["NoAns_exact"] == 100.0 and empty["HasAns_exact"] == 0.0
    gold = squad_v2_metrics(golds, [t[0] if len(t) else "" for t in golds])
    assert gold["exact"] == 100.0 and gold["f1"] == 100.0


def test_normalisation_and_partial_credit():
    assert normalize_answer("The  Normans!") == "normans"
    assert normalize_answer("an apple, a pear") == "apple pear"
    m = squad_v2_metrics([["Denver Broncos"], []], ["the Broncos", "something"])
    assert m["HasAns_exact"] == 0.0 and m["HasAns_f1"] == pytest.approx(100 * 2 / 3)
    assert m["NoAns_f1"] == 0.0


def test_article_split_is_disjoint_and_complete(dev):
    parts = split_by_article(dev, {"selection": 0.1, "dev": 0.3}, seed=13, source="dev", key="article_split")
    titles = [set(p["title"]) for p in parts.values()]
    assert not (titles[0] & titles[1] or titles[0] & titles[2] or titles[1] & titles[2])
    assert sum(len(p) for p in parts.values()) == len(dev)
    assert [p["title"].nunique() for p in parts.values()] == [21, 4, 10]


def squad_layout(questions: pd.DataFrame) -> dict:
    """Parsed questions back in SQuAD 2.0's file layout: data > paragraphs > qas."""
    data = []
    for title, article in questions.groupby("title", sort=False):
        paragraphs = []
        for context, rows in article.groupby("context", sort=False):
            qas = [
                {"id": q.id, "question": q.question, "is_impossible": q.is_impossible,
                 "answers": [{"text": t, "answer_start": int(a)} for t, a in zip(q.answer_texts, q.answer_starts)]}
                for q in rows.itertuples()
            ]  # fmt: skip
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": paragraphs})
    return {"data": data}


def squad_dir(root, dev, articles: int):
    """A data.squad_dir whose train file holds the shipped dev file's first ``articles`` articles
    and whose dev file its next one."""
    import json

    titles = dev["title"].unique()
    root.mkdir()
    for name, chosen in (("train-v2.0.json", titles[:articles]), ("dev-v2.0.json", titles[articles : articles + 1])):
        (root / name).write_text(json.dumps(squad_layout(dev[dev["title"].isin(chosen)])))
    return root


@pytest.mark.parametrize("articles", [2, 3, 4])
def test_a_train_file_of_few_articles_gives_selection_one(tmp_path, dev, articles):
    """Train took round(0.9 n) articles first and selection what was left: under five articles,
    nothing, and a 23-line traceback. Now selection takes max(1, round(0.1 n)), as GLUE's carve."""
    from bertvision.registry.tasks import get_task
    from bertvision.stages.download import download_task
    from tests.conftest import workflow_settings

    settings = workflow_settings(
        tasks={"squad2": None}, data={"squad_dir": str(squad_dir(tmp_path / "sq", dev, articles))}
    )
    counts = download_task(get_task("squad2"), settings.download("squad2"), tmp_path / "out")
    titles = {split: set(pd.read_parquet(tmp_path / "out" / f"{split}.parquet")["title"]) for split in counts}
    assert len(titles["selection"]) == 1 and len(titles["train"]) == articles - 1
    assert not titles["selection"] & titles["train"]


def test_a_train_file_of_one_article_is_refused_in_one_line_naming_it(tmp_path, dev):
    from bertvision.errors import DataFormatError
    from bertvision.registry.tasks import get_task
    from bertvision.stages.download import download_task
    from tests.conftest import workflow_settings

    folder = squad_dir(tmp_path / "sq", dev, 1)
    settings = workflow_settings(tasks={"squad2": None}, data={"squad_dir": str(folder)})
    with pytest.raises(DataFormatError) as err:
        download_task(get_task("squad2"), settings.download("squad2"), tmp_path / "out")
    assert str(err.value) == (
        f"{folder / 'train-v2.0.json'}: 1 article(s), too few to split by article: data.selection_fraction "
        "gives selection 1 (0.1 of them), leaving none to train on"
    )
    assert not (tmp_path / "out").exists()


def test_an_article_split_gives_each_part_its_share_and_records_every_draw(tmp_path):
    """dev got the articles train and selection left, whatever its share said, and the rows
    record drew nothing ({}), so an eval_size was never mentioned in the summary."""
    import json

    from bertvision.layout import rows_record
    from bertvision.registry.tasks import get_task
    from bertvision.reporting.summary_page import drawn_line
    from bertvision.stages.download import download_task
    from tests.conftest import workflow_settings

    shares = {"from": "dev", "train": 0.5, "selection": 0.1, "dev": 0.4}
    block = {"article_split": shares, "train_size": 300, "eval_size": 200}
    settings = workflow_settings(tasks={"squad2": block})
    counts = download_task(get_task("squad2"), settings.download("squad2"), tmp_path)
    articles = {split: pd.read_parquet(tmp_path / f"{split}.parquet")["title"].nunique() for split in counts}
    # of 35 articles: round(0.4 x 35) for dev (it got 13, train round(0.5 x 35) first), round(0.1 x 35) for selection
    assert articles == {"train": 17, "selection": 4, "dev": 14}
    record = json.loads(rows_record(tmp_path).read_text())
    assert record["drawn"]["dev"]["rows"] == 200 and record["drawn"]["dev"]["asked"] == 200
    assert record["drawn"]["train"]["before_selection"] is False
    line = drawn_line(record)
    assert line.startswith("Drawn with data.seed: 300 of the ") and " train rows (after the article split)" in line
    assert line.endswith(f"200 of the {record['drawn']['dev']['of']:,} dev rows.")


@pytest.mark.parametrize("max_length, stride", [(384, 128), (96, 32)])
def test_every_answer_is_recoverable_from_a_window(dev, max_length, stride):
    tok = load_tokenizer(DEFAULT_BACKBONE)
    sample = dev if max_length == 384 else dev.sample(1500, random_state=0).reset_index(drop=True)
    windows = build_windows(sample, tok, max_length, stride)
    assert windows["length"].max() <= max_length
    exact_hits = 0
    answerable = sample.index[~sample["is_impossible"]]
    found = windows[windows["start"] > 0].groupby("example").first()
    for row in answerable:
        assert row in found.index, f"question {sample['id'][row]}: no window holds its answer"
        w = found.loc[row]
        offsets = w["offsets"].reshape(-1, 2)
        text = sample["context"][row][offsets[w["start"], 0] : offsets[w["end"], 1]]
        answer = sample["answer_texts"][row][0]
        assert answer in text  # the token span covers the answer
        exact_hits += text == answer
    assert exact_hits / len(answerable) > 0.98
    # Unanswerable questions point at [CLS] in every window.
    impossible = set(sample.index[sample["is_impossible"]])
    assert (windows[windows["example"].isin(impossible)][["start", "end"]] == 0).all().all()


def window(start, end, offsets):
    return np.asarray(start, float), np.asarray(end, float), np.asarray(offsets)


CONTEXT = "abcdefghij"
# tokens: [CLS] q [SEP] then context chars 0..9 one per token, [SEP]
OFFSETS = [(-1, -1)] * 3 + [(i, i + 1) for i in range(10)] + [(-1, -1)]


def test_decoding_respects_context_mask_order_and_length():
    s = np.zeros(14)
    e = np.zeros(14)
    s[1] = e[1] = 100  # highest logits on a question token: outside the context
    s[5], e[4] = 10, 10  # end before start: invalid
    s[6], e[8] = 5, 5
    # Valid pairs: (5, 8) scores 15 ("cdef"); (5, 5), (6, 8), (3 or 4, 4) score 10. Null = 0.
    c = decode_question([window(s, e, OFFSETS)], CONTEXT, n_best=20, max_answer_length=30)
    assert c.text == "cdef" and c.score_diff == pytest.approx(15.0)
    c = decode_question([window(s, e, OFFSETS)], CONTEXT, n_best=20, max_answer_length=2)
    assert 1 <= len(c.text) <= 2 and c.score_diff == pytest.approx(10.0)  # ties: "ab", "b", "c"


def test_null_score_is_the_minimum_over_windows_and_threshold_applies():
    s1, e1 = np.zeros(14), np.zeros(14)
    s1[0] = e1[0] = 4  # window 1 strongly null
    s1[5] = e1[5] = 3
    s2, e2 = np.zeros(14), np.zeros(14)
    s2[0] = e2[0] = -1  # window 2 weakly null: the minimum, -2
    c = decode_question([window(s1, e1, OFFSETS), window(s2, e2, OFFSETS)], CONTEXT)
    assert c.text == "c" and c.score_diff == pytest.approx(6 - (-2))
    assert apply_threshold([c], 7.9) == ["c"] and apply_threshold([c], 8.1) == [""]


def test_threshold_tuning_maximises_f1():
    golds = [["a"], ["b"], [], []]
    cands = [Candidate("a", 5.0), Candidate("b", 1.0), Candidate("x", 3.0), Candidate("y", -2.0)]
    t = tune_threshold(cands, golds)
    preds = apply_threshold(cands, t)
    best = max(squad_v2_metrics(golds, apply_threshold(cands, th))["f1"] for th in (-3, -1, 0, 2, 4, 6))
    assert squad_v2_metrics(golds, preds)["f1"] == best == 75.0


def squad_repo(root, dev, train_titles, dev_titles):
    """A dataset directory laid out like rajpurkar/squad_v2 (its config squad_v2 in the card,
    answers as {text, answer_start}) holding the shipped dev file's questions of those articles."""
    repo = root / "squad_v2"
    repo.mkdir(parents=True, exist_ok=True)
    for hub_split, chosen in (("train", train_titles), ("validation", dev_titles)):
        part = dev[dev["title"].isin(chosen)]
        pd.DataFrame(
            {
                "id": part["id"],
                "title": part["title"],
                "context": part["context"],
                "question": part["question"],
                "answers": [
                    {"text": list(t), "answer_start": list(s)}
                    for t, s in zip(part["answer_texts"], part["answer_starts"])
                ],
            }
        ).to_parquet(repo / f"{hub_split}-00000-of-00001.parquet")
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: squad_v2\n  data_files:\n  - split: train\n    path: squad_v2/train-*\n"
        "  - split: validation\n    path: squad_v2/validation-*\n---\n"
    )
    return root


def squad_hub_settings(repo):
    from bertvision.config.settings import DownloadSettings

    return DownloadSettings(
        source="hub",
        hub_repo=str(repo),
        glue_dir=None,
        squad_dir=None,
        seed=1,
        selection_fraction=0.34,
        train_size=None,
        selection_size=None,
        eval_size=None,
        article_split=None,
    )


def test_hub_path_with_a_local_repository(tmp_path, dev, monkeypatch):
    """rajpurkar/squad_v2's layout (answers as {text, answer_start}) from a local dataset repo."""
    pytest.importorskip("datasets")
    from bertvision.registry.tasks import get_task
    from bertvision.stages.download import download_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    titles = dev["title"].unique()
    repo = squad_repo(tmp_path / "squad-repo", dev, titles[:3], titles[3:4])
    counts = download_task(get_task("squad2"), squad_hub_settings(repo), tmp_path / "out")
    assert counts["dev"] == int(dev["title"].isin(titles[3:4]).sum())
    assert counts["train"] + counts["selection"] == int(dev["title"].isin(titles[:3]).sum())
    got = pd.read_parquet(tmp_path / "out" / "dev.parquet")
    assert list(got["answer_texts"].iloc[0]) == list(dev[dev["title"] == titles[3]]["answer_texts"].iloc[0])
    # the folder's rows rewritten: read anew (datasets' cache of a folder with a card gave the old ones)
    squad_repo(repo, dev, titles[:3], titles[4:5])
    download_task(get_task("squad2"), squad_hub_settings(repo), tmp_path / "again")
    assert set(pd.read_parquet(tmp_path / "again" / "dev.parquet")["title"]) == {titles[4]}


def test_extraction_refuses_when_the_disk_is_too_small(tmp_path):
    from bertvision.features.disk_plan import check_disk_space

    check_disk_space(tmp_path, 1000)
    with pytest.raises(OSError, match=r"needs about .* GiB of features but only .* GiB is free"):
        check_disk_space(tmp_path, 10**18)


def test_span_records_carry_what_abstaining_everywhere_scores(dev):
    """``constant_score``: the all-abstain F1 (the share of unanswerable questions), the bar a
    model that learned nothing sits at; the summary flags tasks where every model is near it."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.span_eval import evaluate_span
    from bertvision.registry.tasks import get_task

    tok = load_tokenizer(DEFAULT_BACKBONE)
    parts = {"selection": dev.iloc[:30].reset_index(drop=True), "dev": dev.iloc[30:70].reset_index(drop=True)}
    windows = {s: TokenizedSplit(build_windows(q, tok, 128, 64)) for s, q in parts.items()}
    rng = np.random.default_rng(0)
    logits = {s: [rng.normal(size=(n, 2)).astype(np.float32) for n in w.lengths] for s, w in windows.items()}
    metrics, _ = evaluate_span(get_task("squad2"), logits, windows, parts)
    for split, questions in parts.items():
        assert 0 < questions["is_impossible"].mean() < 1
        assert metrics[split]["constant_score"] == pytest.approx(100 * float(questions["is_impossible"].mean()))


def test_the_null_threshold_every_split_is_scored_at_is_tuned_on_selection(dev):
    """Dev is only reported: a mutant tuning the threshold on dev's own questions passed every test."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.span_eval import candidates, evaluate_span
    from bertvision.registry.tasks import get_task

    task, tok = get_task("squad2"), load_tokenizer(DEFAULT_BACKBONE)
    parts = {"selection": dev.iloc[:30].reset_index(drop=True), "dev": dev.iloc[30:70].reset_index(drop=True)}
    windows = {s: TokenizedSplit(build_windows(q, tok, 128, 64)) for s, q in parts.items()}
    rng = np.random.default_rng(1)
    logits = {s: [rng.normal(size=(n, 2)).astype(np.float32) for n in w.lengths] for s, w in windows.items()}
    tuned = {
        s: tune_threshold(candidates(logits[s], windows[s], q, task), q["answer_texts"].tolist())
        for s, q in parts.items()
    }
    assert tuned["selection"] != tuned["dev"]  # the two splits call for different thresholds
    metrics, _ = evaluate_span(task, logits, windows, parts)
    assert metrics["selection"]["null_threshold"] == metrics["dev"]["null_threshold"] == tuned["selection"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("a,b\n1,2\n", "line 1: undecodable JSON (Expecting value, column 1)"),
        ("[1, 2]", "no top-level 'data' list (not a SQuAD file)"),
        ({"data": [{"title": "t"}]}, "data[0]: no field 'paragraphs'"),
        ({"data": [{"paragraphs": []}]}, "data[0]: no field 'title'"),
        ({"data": [{"title": "t", "paragraphs": [{"qas": []}]}]}, "data[0].paragraphs[0]: no field 'context'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [{"question": "q"}]}]}]},
         "data[0].paragraphs[0].qas[0]: no field 'id'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": [{"text": "b", "answer_start": "1"}]}]}]}]},
         "question q1: field 'answer_start' is not an integer, got '1'"),
        ({"data": []}, "no questions"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": " \n", "answers": []}]}]}]}, "question q1: empty question"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "", "qas": [
            {"id": "q1", "question": "q", "answers": []}]}]}]}, "question q1: empty context"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": [{"text": "b", "answer_start": 2}]}]}]}]},
         "question q1: answer 'b' is not at character 2 of its context"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": []}, {"id": "q1", "question": "r", "answers": []}]}]}]},
         "duplicated question id 'q1'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "is_impossible": True, "answers": [{"text": "b", "answer_start": 1}]}]}]}]},
         "question q1: is_impossible but has answers"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "is_impossible": False, "answers": []}]}]}]},
         "question q1: answerable but has no answers"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": []}, {"id": ["q2"], "question": "r", "answers": []}]}]}]},
         "data[0].paragraphs[0].qas[1]: field 'id' is not a string or an integer, got ['q2']"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": True, "question": "q", "answers": []}]}]}]},
         "data[0].paragraphs[0].qas[0]: field 'id' is not a string or an integer, got True"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": [{"text": "b", "answer_start": True}]}]}]}]},
         "question q1: field 'answer_start' is not an integer, got True"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "is_impossible": "false", "answers": []}]}]}]},
         "question q1: field 'is_impossible' is not true or false, got 'false'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
            {"id": "q1", "question": "q", "answers": [{"text": "", "answer_start": 0}]}]}]}]},
         "question q1: answer '' holds no text"),
        ('{"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [{"id": "a", "question": "q"}],'
         ' "qas": [{"id": "b", "question": "r"}]}]}]}', "key 'qas' given twice in one object"),
        (b"\xef\xbb\xbf" + "{\"data\": [{\"title\": \"caf\u00e9\"}]}".encode("latin-1"),
         "line 1, byte 28: not UTF-8 text"),  # the BOM's 3 bytes and 24 characters before the é
    ],
)  # fmt: skip
def test_a_file_not_in_squads_layout_is_one_line_naming_the_place(tmp_path, content, message):
    import json

    from bertvision.errors import DataFormatError

    path = tmp_path / "faq.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DataFormatError) as err:
        parse_squad(path)
    assert str(err.value).startswith(f"{path}: {message}") and len(str(err.value).splitlines()) == 1


def test_a_squad_file_may_start_with_a_byte_order_mark_and_number_its_questions(tmp_path):
    """As the table files may: a BOM was refused as undecodable JSON, and an integer id beside a
    string one ended the download in a traceback (the ids are strings, as the hub's are)."""
    import json

    doc = {"data": [{"title": "t", "paragraphs": [{"context": "abc", "qas": [
        {"id": 7, "question": "q", "answers": [{"text": "b", "answer_start": 1}]},
        {"id": "q2", "question": "r", "answers": []}]}]}]}  # fmt: skip
    path = tmp_path / "faq.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    questions = parse_squad(path)
    assert questions["id"].tolist() == ["7", "q2"] and questions["is_impossible"].tolist() == [False, True]


def test_questions_from_the_hub_are_checked_as_a_files_are(dev):
    """A hub split's squad_v2 rows went in unchecked: a shifted answer, a blank question, an id twice."""
    from bertvision.data.squad_files import from_hub_records
    from bertvision.errors import DataFormatError

    rows = dev.head(6).reset_index(drop=True)
    answers = [{"text": t, "answer_start": s} for t, s in zip(rows["answer_texts"], rows["answer_starts"])]
    hub = rows[["id", "title", "context", "question"]].assign(answers=answers)
    source = "org/faq split train"
    assert from_hub_records(hub, source)["id"].tolist() == rows["id"].tolist()
    answered = next(i for i, texts in enumerate(rows["answer_texts"]) if texts)
    shifted = hub.copy()
    starts = [s + 3 for s in rows["answer_starts"][answered]]
    shifted.at[answered, "answers"] = {"text": rows["answer_texts"][answered], "answer_start": starts}
    blank = hub.assign(question=["  ", *hub["question"][1:]])
    twice = hub.assign(id=[hub["id"][1], *hub["id"][1:]])
    for bad, message in ((shifted, "is not at character"), (blank, "empty question"), (twice, "question id")):
        with pytest.raises(DataFormatError, match=rf"^{source}: .*{message}"):
            from_hub_records(bad, source)


def test_an_answer_may_start_at_the_contexts_first_character_and_be_max_answer_length_long():
    """Each at its boundary: the context's first token (offset 0) and a span of exactly
    ``max_answer_length`` tokens are answers like any other."""
    s, e = np.zeros(14), np.zeros(14)
    s[3], e[3] = 10, 10  # token 3 is the context's character 0
    assert decode_question([window(s, e, OFFSETS)], CONTEXT, max_answer_length=30).text == "a"
    s, e = np.zeros(14), np.zeros(14)
    s[3], e[5] = 10, 10  # three tokens: "abc"
    assert decode_question([window(s, e, OFFSETS)], CONTEXT, max_answer_length=3).text == "abc"


def test_where_abstaining_everywhere_scores_best_the_tuned_threshold_answers_nothing():
    golds = [[], [], ["b"]]
    cands = [Candidate("x", 3.0), Candidate("y", 1.0), Candidate("z", -1.0)]
    assert apply_threshold(cands, tune_threshold(cands, golds)) == ["", "", ""]


def test_a_prediction_scores_its_best_gold_answer():
    """SQuAD's F1 is the best over a question's gold answers, not the first one's."""
    from bertvision.evaluation.squad_metric import score_question

    assert score_question(["Denver Broncos", "Broncos"], "Broncos") == (1, 1.0)
    assert squad_v2_metrics([["the Denver Broncos", "Broncos"]], ["Broncos"])["f1"] == 100.0


def test_the_article_split_follows_its_seed(dev):
    """data.seed draws the articles of each part: the same seed the same parts, another seed others."""
    shares = {"selection": 0.1, "dev": 0.3}

    def titles(seed):
        parts = split_by_article(dev, shares, seed=seed, source="dev", key="article_split")
        return {name: set(part["title"]) for name, part in parts.items()}

    assert titles(13) == titles(13) and titles(13) != titles(14)


def test_each_question_is_decoded_with_its_tasks_n_best_and_max_answer_length():
    """SQuAD 2.0's decoding keeps answers of up to 30 tokens from its 20 best starts and ends: a
    25-token answer is one (read with the two settings swapped, it was cut from the candidates)."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.span_eval import candidates
    from bertvision.registry.tasks import get_task

    task = get_task("squad2")
    assert (task.span.n_best, task.span.max_answer_length) == (20, 30)
    context = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # 40 characters, one token each
    offsets = [(-1, -1)] * 3 + [(i, i + 1) for i in range(len(context))] + [(-1, -1)]
    start, end = np.zeros(len(offsets)), np.zeros(len(offsets))
    start[3], end[3 + 24] = 10, 10  # "a" to "y": 25 tokens
    windows = TokenizedSplit(pd.DataFrame({
        "input_ids": [list(range(len(offsets)))], "length": [len(offsets)], "example": [0], "start": [0], "end": [0],
        "offsets": [np.asarray(offsets).ravel()],
    }))  # fmt: skip
    [found] = candidates([np.stack([start, end], axis=1)], windows, pd.DataFrame({"context": [context]}), task)
    assert found.text == context[:25]


def test_span_logits_are_each_windows_own_real_tokens_whatever_the_batch(dev, tiny_bert):
    """``predict_span`` runs windows of different lengths padded together in a batch and keeps
    each window's logits over its own real tokens only: as many rows as the window has tokens,
    equal to the window run alone (its padding's rows cut off, not another window's kept)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.inference import predict_span

    tok = load_tokenizer(str(tiny_bert))
    split = TokenizedSplit(build_windows(dev.iloc[:12].reset_index(drop=True), tok, 96, 32))
    assert len(set(split.lengths)) > 1  # windows of several lengths share batches
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).eval()
    logits = predict_span(model, split, 4, torch.device("cpu"), "fp32", tok.pad_token_id)
    for i in range(len(split)):
        ids = torch.tensor(np.asarray([split.input_ids[i]], dtype=np.int64))
        types = None if split.token_type_ids is None else torch.tensor(np.int64([split.token_type_ids[i]]))
        with torch.no_grad():
            alone = model(input_ids=ids, token_type_ids=types)
        expected = torch.stack([alone.start_logits[0], alone.end_logits[0]], dim=-1).numpy()
        assert logits[i].shape == (split.lengths[i], 2)
        np.testing.assert_allclose(logits[i], expected, atol=1e-4)


def test_a_window_must_hold_one_context_token_more_than_the_stride(dev, tiny_bert):
    """doc_stride fits where the longest question and the special tokens leave more context
    tokens than the stride: at exactly the stride it is refused naming the key; one more, and
    every question is cut into windows."""
    from bertvision.errors import ConfigError
    from bertvision.registry.tasks import get_task
    from bertvision.stages.tokenize import check_windows_fit

    task, tok = get_task("squad2"), load_tokenizer(str(tiny_bert))
    questions = dev.iloc[:20].reset_index(drop=True)
    longest = max(len(tok(q.lstrip(), add_special_tokens=False)["input_ids"]) for q in questions["question"])
    stride = 16
    at_stride = longest + tok.num_special_tokens_to_add(pair=True) + stride
    with pytest.raises(ConfigError, match=r"^tasks.squad2: doc_stride 16 does not fit: .* leaves 16 context tokens"):
        check_windows_fit(task, questions, tok, at_stride, stride, "dev")
    with pytest.raises(BaseException, match="stride"):  # what the check stands for: the tokenizer's own panic
        build_windows(questions, tok, at_stride, stride)
    check_windows_fit(task, questions, tok, at_stride + 1, stride, "dev")
    assert set(build_windows(questions, tok, at_stride + 1, stride)["example"]) == set(range(len(questions)))


def test_the_extraction_keeps_a_span_models_start_and_end_logits_in_that_order(tiny_bert):
    """A task model's head outputs kept beside the states (the head + BERT ensembles read them):
    for a span model, (B, T, 2) with the start logits first, as ``predict_span`` gives them."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    from bertvision.features.encode import encoder_pass

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert).eval()
    batch = {
        "input_ids": torch.tensor([[101, 2054, 2003, 102, 2009, 102]]),
        "attention_mask": torch.ones(1, 6, dtype=torch.long),
    }
    hidden_states, head = encoder_pass(model, batch, torch.device("cpu"), "fp32")
    with torch.no_grad():
        out = model(**batch)
    assert len(hidden_states) == model.config.num_hidden_layers + 1 and head.shape == (1, 6, 2)
    torch.testing.assert_close(head[..., 0], out.start_logits)
    torch.testing.assert_close(head[..., 1], out.end_logits)


def test_windows_cut_the_context_in_order_behind_the_whole_question(dev):
    """Each window is [CLS] question [SEP] a slice of the context [SEP], the question never cut
    (the longest dev questions at a max_length that leaves them just the stride and a few tokens),
    type ids 0 then 1, offsets only on the context side; the slices start at the context's first
    token, each repeats exactly ``stride`` tokens of the one before, and the last ends the context;
    windows are numbered from 0. A window's answer is its own token span where the gold answer
    lies wholly inside its context slice, else [CLS]."""
    tok = load_tokenizer(DEFAULT_BACKBONE)
    lengths = np.array(
        [len(ids) for ids in tok([q.lstrip() for q in dev["question"]], add_special_tokens=False)["input_ids"]]
    )
    sample = dev.iloc[np.argsort(-lengths, kind="stable")[:40]].reset_index(drop=True)
    stride = 8
    max_length = int(lengths.max()) + tok.num_special_tokens_to_add(pair=True) + stride + 4
    windows = build_windows(sample, tok, max_length, stride)
    assert windows["length"].max() <= max_length and windows.groupby("example").size().max() >= 3
    cut_answers = 0
    for example, rows in windows.groupby("example", sort=False):
        question = tok(sample["question"][example].lstrip(), add_special_tokens=False)["input_ids"]
        context_text = sample["context"][example]
        context = tok(context_text, add_special_tokens=False, return_offsets_mapping=True)
        head = [tok.cls_token_id, *question, tok.sep_token_id]
        assert rows["window"].tolist() == list(range(len(rows)))
        begin = 0
        for n, (_, w) in enumerate(rows.iterrows()):
            ids, types, offsets = list(w["input_ids"]), list(w["token_type_ids"]), w["offsets"].reshape(-1, 2)
            assert ids[: len(head)] == head and ids[-1] == tok.sep_token_id
            piece = ids[len(head) : -1]
            end = begin + len(piece)
            assert piece == context["input_ids"][begin:end]
            assert types == [0] * len(head) + [1] * (len(piece) + 1)
            assert (offsets[: len(head)] == -1).all() and (offsets[-1] == -1).all()
            assert offsets[len(head) : -1].tolist() == [list(o) for o in context["offset_mapping"][begin:end]]
            last = n == len(rows) - 1
            assert (end == len(context["input_ids"])) if last else (len(ids) == max_length)
            begin = end - stride
            if sample["is_impossible"][example]:
                assert (w["start"], w["end"]) == (0, 0)
                continue
            a = int(sample["answer_starts"][example][0])
            b = a + len(sample["answer_texts"][example][0])
            inside = offsets[len(head), 0] <= a and b <= offsets[-2, 1]
            cut_answers += not inside and a < offsets[-2, 1] and offsets[len(head), 0] < b
            if not inside:
                assert (w["start"], w["end"]) == (0, 0)
            else:
                assert len(head) <= w["start"] <= w["end"] < len(ids) - 1
                span = context_text[offsets[w["start"], 0] : offsets[w["end"], 1]]
                assert sample["answer_texts"][example][0] in span
    assert cut_answers > 0  # some answers straddle a window's edge: those windows say no answer


def test_the_best_span_is_taken_over_all_of_a_questions_windows(dev):
    """A real question whose answer lies only in a later window: logits that point at it there,
    weaker ones elsewhere, decode to the gold answer, whichever window holds it."""
    tok = load_tokenizer(DEFAULT_BACKBONE)
    sample = dev[~dev["is_impossible"]].iloc[:300].reset_index(drop=True)
    windows = build_windows(sample, tok, 96, 32)
    first = windows[windows["start"] > 0].groupby("example")["window"].min()
    example = int(first[first >= 1].index[0])
    rows = windows[windows["example"] == example]
    decoded = []
    for _, w in rows.iterrows():
        start, end = np.zeros(w["length"]), np.zeros(w["length"])
        offsets = w["offsets"].reshape(-1, 2)
        if w["start"] > 0:
            start[w["start"]], end[w["end"]] = 8.0, 8.0
        else:  # a weaker span on the window's first context token
            token = int(np.flatnonzero(offsets[:, 0] >= 0)[0])
            start[token], end[token] = 3.0, 3.0
        decoded.append((start, end, offsets))
    context = sample["context"][example]
    c = decode_question(decoded, context)
    answer = sample["answer_texts"][example][0]
    assert answer in c.text and len(c.text) <= len(answer) + 5 and c.score_diff == pytest.approx(16.0)


def test_n_best_start_and_end_candidates_each_are_searched(dev):
    """On a real window: the top start and top end make no valid span, the second of each does;
    with n_best=2 that span is the answer, with n_best=1 there is none."""
    tok = load_tokenizer(DEFAULT_BACKBONE)
    w = build_windows(dev.iloc[:1].reset_index(drop=True), tok, 384, 128).iloc[0]
    offsets = w["offsets"].reshape(-1, 2)
    c0 = int(np.flatnonzero(offsets[:, 0] >= 0)[0])
    start, end = np.zeros(w["length"]), np.zeros(w["length"])
    start[c0 + 2], end[c0 + 1] = 10.0, 10.0  # end before start
    start[c0 + 3], end[c0 + 5] = 5.0, 5.0
    context = dev["context"][0]
    c = decode_question([(start, end, offsets)], context, n_best=2)
    assert c.text == context[offsets[c0 + 2, 0] : offsets[c0 + 5, 1]] and c.score_diff == pytest.approx(15.0)
    assert decode_question([(start, end, offsets)], context, n_best=1).text == ""


def test_each_question_is_decoded_from_all_of_its_windows(dev):
    """``candidates`` on real windows of 300 answerable dev questions, logits pointing at each
    window's gold span (weaker ones at the first context token of the windows without it): every
    question, those whose answer only a later window holds among them, decodes to its answer."""
    from bertvision.data.tokenized import TokenizedSplit
    from bertvision.evaluation.span_eval import candidates
    from bertvision.registry.tasks import get_task

    tok = load_tokenizer(DEFAULT_BACKBONE)
    sample = dev[~dev["is_impossible"]].iloc[:300].reset_index(drop=True)
    windows = build_windows(sample, tok, 96, 32)
    logits = []
    for _, w in windows.iterrows():
        both = np.zeros((w["length"], 2))
        if w["start"] > 0:
            both[w["start"], 0], both[w["end"], 1] = 8.0, 8.0
        else:
            token = int(np.flatnonzero(w["offsets"].reshape(-1, 2)[:, 0] >= 0)[0])
            both[token] = 3.0
        logits.append(both)
    found = candidates(logits, TokenizedSplit(windows), sample, get_task("squad2"))
    later = windows[windows["start"] > 0].groupby("example")["window"].min()
    assert (later >= 1).sum() >= 10  # questions whose first windows do not hold the answer
    for row, c in enumerate(found):
        assert sample["answer_texts"][row][0] in c.text, sample["id"][row]
