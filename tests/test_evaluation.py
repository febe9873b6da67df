"""Benchmark metrics on hand-made cases: what each figure in the report means."""
import json
from dataclasses import dataclass

import pytest

from lexgraph.evaluation import metrics as ev
from lexgraph.ids import normalise_evidence_id


@dataclass
class FakeHit:
    """A ranked hit as the metrics see it (plain data, no store behind it)."""

    doc_key: str
    text: str
    token_count: int


def test_normalise_answer_drops_case_punctuation_articles_and_spaces():
    assert ev.normalise_answer("  The EUR 19.1   million. ") == "eur 191 million"
    assert ev.normalise_answer("An apple, a PEAR; the end!") == "apple pear end"
    assert ev.normalise_answer("“Viva la Vida” — Coldplay") == "viva la vida coldplay"
    assert ev.normalise_answer("theatre another") == "theatre another"  # only whole-word articles go


@pytest.mark.parametrize("raw, key", [
    ("20260121_10:00", "20260121_1000"),
    ("LiHua-World/week3/20260121_1000.txt", "20260121_1000"),
    ("20260121_1000.TXT", "20260121_1000"),
    ("Board Minutes 2024-03.md", "board minutes 2024-03"),
    ("board minutes 2024-03", "board minutes 2024-03"),
    ("report v1.2", "report v1.2"),  # not a text-file extension: kept
    ("Time: 20260930_16:00", "20260930_1600"),  # a label left in one LiHua-World id
])
def test_evidence_ids_and_file_paths_meet(raw, key):
    assert normalise_evidence_id(raw) == key


def test_split_evidence_handles_and_joined_lists_and_none():
    assert ev.split_evidence("20260121_10:00<and>20260701_10:00") == ("20260121_1000", "20260701_1000")
    assert ev.split_evidence(["a.md", "A", "b"]) == ("a", "b")
    assert ev.split_evidence("N/A") == ()
    assert ev.split_evidence(None) == ()


def test_recall_counts_distinct_documents_in_rank_order():
    ranked = ["d1", "d1", "d2", "d3", "d1", "d4", "d5"]
    assert ev.ranked_documents(ranked, 3) == ["d1", "d2", "d3"]
    evidence = ["d2", "d4", "d9"]
    assert ev.evidence_recall(ranked, evidence, 1) == 0.0
    assert ev.evidence_recall(ranked, evidence, 2) == pytest.approx(1 / 3)
    assert ev.evidence_recall(ranked, evidence, 4) == pytest.approx(2 / 3)  # top-4 documents: d1 d2 d3 d4
    assert ev.all_evidence_found(ranked, evidence, 10) is False
    assert ev.all_evidence_found(ranked, ["d1", "d3"], 3) is True
    assert ev.evidence_recall(ranked, [], 5) is None


def test_coverage_takes_whole_hits_until_the_budget_is_spent():
    hits = [FakeHit("a", "Kari Solheim chaired it.", 100), FakeHit("b", "The price was EUR 19.1 million.", 100),
            FakeHit("c", "Helene Strand presided.", 100)]
    assert [h.doc_key for h in ev.context_within_budget(hits, 250)] == ["a", "b"]
    assert ev.coverage_at_budget("EUR 19.1 million", hits, 200) is True
    assert ev.coverage_at_budget("EUR 19.1 million", hits, 199) is False  # the second hit does not fit
    assert ev.coverage_at_budget("Helene Strand", hits, 299) is False
    assert ev.coverage_at_budget("Helene Strand", hits, 300) is True
    assert ev.coverage_at_budget("...", hits, 300) is None  # nothing left to look for


def test_coverage_matches_whole_tokens_only():
    assert ev.answer_covered("yes", ["Yesterday we met."]) is False
    assert ev.answer_covered("Yes", ["Oh yes, we met."]) is True


def test_latency_percentiles_and_means():
    assert ev.percentile([10, 20, 30, 40], 50) == 25
    assert ev.percentile([], 95) is None
    assert ev.mean([1.0, None, 0.0, True]) == pytest.approx(2 / 3)


def test_loads_lihua_object_format(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({
        "0": {"question": "Did A happen before B?", "answer": "Yes", "evidence": "20260121_10:00<and>20260701_10:00",
              "type": "Multi"},
        "1": {"question": "Question: Who came?", "answer": "Answer: Wolfgang", "evidence": "20260122_17:00",
              "type": "Single"},
        "2": {"question": "What did he eat?", "answer": "Insufficient information", "evidence": "N/A", "type": "Null"},
    }))
    q0, q1, q2 = ev.load_questions(path)
    assert (q0.qid, q0.qtype, q0.evidence) == ("0", "Multi", ("20260121_1000", "20260701_1000"))
    assert (q1.question, q1.answer) == ("Who came?", "Wolfgang")  # field labels inside values are dropped
    assert q2.evidence == () and q2.is_null and q2.qtype == "Null"


def test_loads_list_format_and_infers_types(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps([
        {"id": "a", "question": "Who chaired the meeting?", "answer": "Kari Solheim"},
        {"id": "b", "question": "What is unknown?", "answer": "Insufficient information"},
        {"question": "Which files?", "answer": "two", "evidence": ["x.md", "y.txt"]},
    ]))
    a, b, c = ev.load_questions(path)
    assert (a.qid, a.qtype, a.evidence) == ("a", "Other", ())
    assert b.qtype == "Null"
    assert (c.qid, c.qtype, c.evidence) == ("2", "Multi", ("x", "y"))


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ("42", "top level is a JSON int"),
    ("{}", "contains no questions"),
    ('{"0": {"answer": "x"}}', "question '0' has no 'question' text"),
    ('[{"id": 1, "question": "q?"}]', "question '1' has no 'answer' string"),
    ('{"0": ["q", "a"]}', "question '0' is a list"),
    ('[{"id": "x", "question": "q?", "answer": "a"}, {"id": "x", "question": "r?", "answer": "b"}]',
     "duplicate question ids: x"),
    ('{"0": {"question": "q?", "answer": "a", "evidence": 7}}', "'evidence' must be a string"),
    ('{"0": {"question": "q?", "answer": "a", "answer_aliases": "b"}}', "'answer_aliases' must be a list"),
    ('{"0": {"question": "q?", "answer": "a", "answer_aliases": [["b"]]}}', "'answer_aliases' must be a list"),
])
def test_malformed_questions_name_the_file_and_problem(tmp_path, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        ev.load_questions(path)
    assert str(path) in str(error.value) and problem in str(error.value)


def test_missing_questions_file(tmp_path):
    with pytest.raises(ev.QuestionsFileError, match="questions file not found"):
        ev.load_questions(tmp_path / "none.json")


def test_answer_aliases_are_read_with_the_answer(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"0": {"question": "Who?", "answer": "G. Stanley Hall", "answer_aliases": ["Stanley Hall"]},
                                "1": {"question": "Who?", "answer": "x"}}))
    with_aliases, without = ev.load_questions(path)
    assert with_aliases.aliases == ("Stanley Hall",) and without.aliases == ()
