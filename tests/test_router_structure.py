"""The shipped router decomposes a question only on explicit structure: wording, length and clause count
alone never send it to the agentic route, and a paraphrase routes like its original."""
import json

import pytest

from lexgraph.query.router import StructuralRouter
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def router():
    return StructuralRouter()


LONG_SINGLE_FACT = [
    "I'm putting together the governance section of the quarterly board pack and I only need one detail from the "
    "minutes, so could you tell me who was in the chair at the parent company's board meeting in March 2024?",
    "For the audit file we are preparing for the external reviewers, which shipyard, based on everything in the "
    "contract correspondence and the technical annexes that were circulated last spring, built the hull of the "
    "feeder vessel that received the retrofitted engines?",
    "Quick one, with apologies for the long preamble about our reporting deadlines, the auditors and the format "
    "the finance team wants: what was the total contract price of the engine supply contract as amended?",
]


@pytest.mark.parametrize("question", LONG_SINGLE_FACT)
def test_a_long_single_fact_question_stays_off_the_agentic_route(router, question):
    decision = router.route(question)
    assert decision.route == "semantic", decision.reason
    assert "one question" in decision.reason or "safe route" in decision.reason


@pytest.mark.parametrize("question, cue", [
    ("Who chairs Kestrel, and which yard built the Nordkapp Vega?", "two questions"),
    ("Who was CEO of Kestrel? Who chairs its board?", "two questions"),
    ("Did the yard deliver the hull before the engines were shipped?", "order in time"),
    ("Was the contract price higher than the retrofit budget?", "comparison"),
    ("Compare the delivery terms of the two supply contracts.", "comparison"),
])
def test_explicit_structure_is_decomposed_and_says_why(router, question, cue):
    decision = router.route(question)
    assert decision.route == "agentic" and cue in decision.reason
    assert decision.confidence >= 0.5 and decision.probabilities["agentic"] == pytest.approx(decision.confidence)


@pytest.mark.parametrize("original, paraphrase", [
    ("Who is the CEO of Kestrel Propulsion?",
     "Could you remind me who currently runs the engine maker Kestrel, as its chief executive?"),
    ("When was Halvorsen Maritime Group founded?",
     "The shipping group behind the retrofit programme - in what year was it set up, originally?"),
    ("Did the yard deliver the hull before the engines were shipped?",
     "Was the hull handed over by the yard before the engines went out, or only afterwards?"),
])
def test_a_paraphrase_routes_like_its_original(router, original, paraphrase):
    assert router.route(original).route == router.route(paraphrase).route


def test_the_sample_paraphrases_route_like_their_originals(router):
    pairs = json.loads((ROOT / "sample" / "questions.paraphrased.json").read_text())
    same = [router.route(p["original"]).route == router.route(p["question"]).route for p in pairs.values()]
    assert len(same) >= 20 and sum(same) / len(same) >= 0.9


def test_the_sample_paraphrases_and_unanswerable_questions_are_well_formed():
    from lexgraph.evaluation.metrics import load_questions

    originals = {q.question: q for q in load_questions(ROOT / "sample" / "questions.json")}
    paraphrased = json.loads((ROOT / "sample" / "questions.paraphrased.json").read_text())
    assert len(paraphrased) == len(originals)
    for record in paraphrased.values():
        original = originals[record["original"]]  # each paraphrase names a question of the sample
        assert record["answer"] == original.answer and record["question"] != record["original"]
    unanswerable = load_questions(ROOT / "sample" / "questions.unanswerable.json")
    assert len(unanswerable) == 15 and all(q.is_null for q in unanswerable)
