"""The router's labelled questions on the sample corpus: `sample/questions.agentic.json` (multi-step questions,
route "agentic") and `sample/questions.router.json` (exemplars for the "semantic" and "graph" routes).

Checks their shape and that every answer is found in the documents cited as its evidence. An answer that is
computed (a sum, a difference, a comparison or a list put together from several documents) carries
`"computed": true`; for those only the evidence files are checked."""
import json
import re
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLE_CORPUS

AGENTIC = ROOT / "sample" / "questions.agentic.json"
ROUTER = ROOT / "sample" / "questions.router.json"
ROUTES = {"semantic", "graph", "agentic"}


def _load(path: Path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, list)
    return data


def _normalise(text: str) -> str:
    """Case-folded, NFC, with markdown emphasis markers dropped and runs of whitespace collapsed."""
    text = unicodedata.normalize("NFC", text).replace("*", "")
    return re.sub(r"\s+", " ", text).strip().casefold()


def _documents() -> dict[str, str]:
    """Doc key (file name without extension, as in sample/questions.json) -> normalised text."""
    return {path.stem: _normalise(path.read_text(encoding="utf-8"))
            for path in SAMPLE_CORPUS.iterdir() if path.is_file()}


AGENTIC_QUESTIONS = _load(AGENTIC)
ROUTER_QUESTIONS = _load(ROUTER)
ALL_QUESTIONS = AGENTIC_QUESTIONS + ROUTER_QUESTIONS
DOCUMENTS = _documents()


def test_ids_are_unique_across_both_files():
    ids = [question["id"] for question in ALL_QUESTIONS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("question", ALL_QUESTIONS, ids=lambda question: question["id"])
def test_shape(question):
    assert set(question) <= {"id", "question", "route", "steps", "answer", "evidence", "computed"}
    assert isinstance(question["id"], str) and question["id"]
    assert isinstance(question["question"], str) and question["question"].strip()
    assert question["route"] in ROUTES
    assert isinstance(question["answer"], str) and question["answer"].strip()
    assert isinstance(question["evidence"], list) and question["evidence"]
    assert all(isinstance(key, str) for key in question["evidence"])
    assert len(question["evidence"]) == len(set(question["evidence"]))
    assert isinstance(question.get("computed", False), bool)
    if "steps" in question:
        assert all(isinstance(step, str) and step.strip() for step in question["steps"])


def test_agentic_file_holds_at_least_60_agentic_questions():
    assert len(AGENTIC_QUESTIONS) >= 60
    assert {question["route"] for question in AGENTIC_QUESTIONS} == {"agentic"}


@pytest.mark.parametrize("question", AGENTIC_QUESTIONS, ids=lambda question: question["id"])
def test_agentic_questions_are_decomposed(question):
    assert 2 <= len(question["steps"]) <= 4
    assert len(question["evidence"]) >= 1


def test_router_file_covers_semantic_and_graph():
    routes = [question["route"] for question in ROUTER_QUESTIONS]
    assert set(routes) == {"semantic", "graph"}
    assert min(routes.count("semantic"), routes.count("graph")) >= 15


def test_questions_are_not_repeated():
    texts = [_normalise(question["question"]) for question in ALL_QUESTIONS]
    assert len(texts) == len(set(texts))


@pytest.mark.parametrize("question", ALL_QUESTIONS, ids=lambda question: question["id"])
def test_evidence_names_sample_files(question):
    unknown = [key for key in question["evidence"] if key not in DOCUMENTS]
    assert not unknown, f"{question['id']}: no file in sample/corpus for {unknown}"


@pytest.mark.parametrize("question", [question for question in ALL_QUESTIONS if not question.get("computed")],
                         ids=lambda question: question["id"])
def test_answer_occurs_in_an_evidence_document(question):
    answer = _normalise(question["answer"])
    found = [key for key in question["evidence"] if answer in DOCUMENTS.get(key, "")]
    assert found, f"{question['id']}: answer {question['answer']!r} is in none of {question['evidence']}"


CHAT = ROOT / "sample" / "questions.router.chat.json"
LIHUA_DEV = ROOT.parent / "shared" / "datasets" / "lihua-world" / "questions.dev.json"


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def test_chat_exemplars_are_shipped_labelled_and_unique():
    from lexgraph.query.router import default_exemplars, load_exemplars

    chat = load_exemplars([CHAT])
    assert len(chat) >= 80 and {e.route for e in chat} == {"semantic", "graph"}
    assert len({e.question for e in chat}) == len(chat)
    assert {e.question for e in chat} <= {e.question for e in default_exemplars()}


@pytest.mark.skipif(not LIHUA_DEV.exists(), reason="needs ../shared (LiHua-World dev questions)")
def test_chat_exemplars_are_written_not_taken_from_the_benchmark():
    """The router is measured on LiHua-World's questions: an exemplar that is (nearly) one of them would make
    that figure a memory test. No exemplar shares 80% of its words with a dev question."""
    dev = [_words(q["question"]) for q in json.loads(LIHUA_DEV.read_text(encoding="utf-8")).values()]
    for exemplar in _load(CHAT):
        mine = _words(exemplar["question"])
        closest = max(len(mine & other) / len(mine | other) for other in dev)
        assert closest < 0.8, exemplar["question"]
