"""The LLM-free heuristic extractor: on the sample corpus, chat logs, Markdown, and bad input."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from lexgraph.build.pipeline import chunk_frame
from lexgraph.extract.heuristic import RULES_VERSION, HeuristicExtractor
from lexgraph.extract.readers import read_document
from lexgraph.extract.schemas import ChunkExtraction, ChunkInput, Extractor
from lexgraph.ids import short_hash

CORPUS = Path(__file__).resolve().parent.parent / "sample" / "corpus"
_WORD = re.compile(r"\S+")
_NOT_A_CLAIM = re.compile(r"^\s*(?:#{1,6}\s|\|?\s*:?-{2,}|```|~~~)")


class WordCounter:
    """Whitespace words as tokens: chunking without loading the embedding model."""

    max_tokens = 100_000

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(_WORD.findall(text)) for text in texts]

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [match.span() for match in _WORD.finditer(text)]


@pytest.fixture(scope="module")
def chunks() -> list[ChunkInput]:
    found = []
    for path in sorted(CORPUS.iterdir()):
        document = read_document(path, CORPUS)
        source = {"doc_id": document.doc_id, "text": document.text, "format": document.format, "page_starts": [],
                  "relative_path": document.relative_path, "content_hash": document.content_hash}
        frame = chunk_frame(source, WordCounter(), 150)
        found += [ChunkInput(row["chunk_id"], row["doc_id"], row["text"], row["heading_path"])
                  for row in frame.iter_rows(named=True)]
    assert len({chunk.doc_id for chunk in found}) == len(list(CORPUS.iterdir()))
    return found


@pytest.fixture(scope="module")
def extractor() -> HeuristicExtractor:
    return HeuristicExtractor()


@pytest.fixture(scope="module")
def outcomes(chunks, extractor) -> list:
    return [extractor.extract(chunk) for chunk in chunks]


def _entities(outcomes) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for outcome in outcomes:
        for entity in outcome.extraction.entities:
            found.setdefault(entity.name, set()).add(entity.type)
    return found


def test_it_is_an_extractor_with_a_versioned_prompt(extractor):
    assert isinstance(extractor, Extractor)
    assert (extractor.name, extractor.model) == ("heuristic", "heuristic-v1")
    assert extractor.prompt_version == short_hash(RULES_VERSION, 12)
    outcome = extractor.extract(ChunkInput("c", "d", "Kestrel Propulsion GmbH builds engines in Kiel."))
    assert (outcome.extractor, outcome.model, outcome.prompt_version, outcome.outcome, outcome.attempts) == (
        "heuristic", "heuristic-v1", extractor.prompt_version, "ok", 1)
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.error) == (0, 0, None)


def test_every_chunk_with_a_sentence_yields_a_statement(chunks, outcomes):
    for chunk, outcome in zip(chunks, outcomes):
        claims = [line for line in chunk.text.splitlines()
                  if not _NOT_A_CLAIM.match(line) and any(c.isalnum() for c in line)]
        statements = list(outcome.extraction.statements())
        if claims:
            assert statements, f"{chunk.chunk_id}: no statement from {chunk.text[:200]!r}"
        for topic, statement in statements:
            assert topic.name and statement.text and statement.text == statement.text.strip()


def test_output_is_what_the_validators_would_keep(outcomes, extractor):
    """The extractor builds its models without re-validating them; validating must change nothing."""
    for outcome in outcomes:
        dumped = outcome.extraction.model_dump()
        assert extractor.response_model.model_validate(dumped).model_dump() == dumped
        assert ChunkExtraction.model_validate_json(outcome.extraction.model_dump_json()).model_dump() == dumped


def test_sample_corpus_entities_are_typed_by_their_cues(outcomes):
    found = _entities(outcomes)
    assert found["Kestrel Propulsion GmbH"] == {"organization"}
    assert found["Annika Vogt"] == {"person"}
    assert "Nordlys Spirit" in found and "vessel" in found["Nordlys Spirit"]  # "MV Nordlys Spirit", prefix dropped
    assert not any(name.startswith(("MV ", "Dr. ", "Dr ")) for name in found)
    assert "location" in found["Hamburg"] and "location" in found["Germany"]
    assert "money" in found["EUR 410 million"] and "date" in found["14 March 2024"]
    assert "contract" in found["HM-2023-07"]
    for outcome in outcomes:
        for entity in outcome.extraction.entities:
            assert entity.name and entity.mention and entity.description
            assert len(entity.mention) <= 161


def test_profile_chunk_gives_topics_from_headings_relations_and_facts(extractor):
    text = (CORPUS / "kestrel-propulsion-profile.md").read_text()
    extraction = extractor.extract(ChunkInput("c", "d", text, "Supplier Profile: Kestrel Propulsion GmbH")).extraction
    topics = [topic.name for topic in extraction.topics]
    assert topics[:3] == ["Supplier Profile: Kestrel Propulsion GmbH", "Company summary", "Ownership"]
    facts = {(f.subject, f.predicate, f.object) for _, s in extraction.statements() for f in s.facts}
    assert ("Kestrel Propulsion GmbH", "is a wholly owned subsidiary of", "Ostwind Industrieholding AG") in facts
    relations = {(r.source, r.predicate, r.target) for r in extraction.relations}
    assert ("Annika Vogt", "joined", "Kestrel Propulsion GmbH") in relations  # "Dr. Vogt joined Kestrel"
    pair = next(r for r in extraction.relations
                if {r.source, r.target} == {"Kestrel Propulsion GmbH", "Ostwind Industrieholding AG"})
    assert pair.strength > 0.5  # they share two sentences
    names = {entity.name for entity in extraction.entities}
    assert "Vogt" not in names and "Ostwind" not in names  # folded into the full names


def test_table_rows_become_readable_statements_facts_and_relations(extractor):
    text = ("| Supplier | Country | Chief executive | Status |\n|---|---|---|---|\n"
            "| Kestrel Propulsion GmbH | Germany | Annika Vogt | Suspended |\n")
    extraction = extractor.extract(ChunkInput("c", "d", text, "Register")).extraction
    [(topic, statement)] = list(extraction.statements())
    assert topic.name == "Register"
    assert statement.text == ("Supplier: Kestrel Propulsion GmbH; Country: Germany; Chief executive: Annika Vogt; "
                              "Status: Suspended")
    assert ("Kestrel Propulsion GmbH", "chief executive", "Annika Vogt") in {
        (f.subject, f.predicate, f.object) for f in statement.facts}
    types = {entity.name: entity.type for entity in extraction.entities}
    assert types == {"Kestrel Propulsion GmbH": "organization", "Germany": "location", "Annika Vogt": "person"}
    assert {(r.source, r.predicate, r.target) for r in extraction.relations} == {
        ("Kestrel Propulsion GmbH", "country", "Germany"), ("Kestrel Propulsion GmbH", "chief executive", "Annika Vogt")}


def test_markdown_lists_emphasis_links_and_code_blocks(extractor):
    text = ("## Management\n\n- **Chief Executive Officer:** Dr. Annika Vogt, CEO since January 2021.\n"
            "* See [the register](https://example.com/r) for MV *Nordlys Spirit*.\n"
            "```\nprint('Not A Statement')\n```\n1. Signed in Bergen on 2024-03-14.\n")
    extraction = extractor.extract(ChunkInput("c", "d", text)).extraction
    assert [statement.text for _, statement in extraction.statements()] == [
        "Chief Executive Officer: Dr. Annika Vogt, CEO since January 2021.",
        "See the register for MV Nordlys Spirit.",
        "Signed in Bergen on 2024-03-14.",
    ]
    assert {topic.name for topic in extraction.topics} == {"Management"}
    types = {entity.name: entity.type for entity in extraction.entities}
    assert types["Annika Vogt"] == "person" and types["Nordlys Spirit"] == "vessel"
    assert types["Bergen"] == "location" and types["2024-03-14"] == "date" and types["January 2021"] == "date"
    assert "Not A Statement" not in types and "Chief Executive Officer" not in types


def test_chat_logs_keep_their_speakers(extractor):
    text = ("Time: 20260924_20:00\n"
            "JenniferMoore: Hey Li Hua! Are you ready for the bench press with Wolfgang Schulz next week?\n"
            "LiHua: I feel pretty strong lately. Let's do it!\n"
            "Thrall: Count me in.\n")
    extraction = extractor.extract(ChunkInput("c", "d", text)).extraction
    texts = [statement.text for _, statement in extraction.statements()]
    assert texts == [
        "Time: 20260924_20:00",
        "Jennifer Moore: Hey Li Hua!",
        "Jennifer Moore: Are you ready for the bench press with Wolfgang Schulz next week?",
        "Li Hua: I feel pretty strong lately.",
        "Li Hua: Let's do it!",
        "Thrall: Count me in.",
    ]
    types = {entity.name: entity.type for entity in extraction.entities}
    for person in ("Jennifer Moore", "Li Hua", "Wolfgang Schulz", "Thrall"):
        assert types[person] == "person", person
    assert "Time" not in types and "Hey" not in types
    assert len(extraction.topics) == 1 and extraction.topics[0].name  # keywords, as there is no heading
    assert any({r.source, r.target} == {"Jennifer Moore", "Wolfgang Schulz"} for r in extraction.relations)


def test_email_headers_are_not_speakers(extractor):
    text = "From: Piotr Nowak <piotr.nowak@example.com>\nTo: Erik Lunde\nSubject: ME No. 2\n\nErik, see below."
    extraction = extractor.extract(ChunkInput("c", "d", text)).extraction
    types = {entity.name: entity.type for entity in extraction.entities}
    assert types["Piotr Nowak"] == "person" and types["Erik Lunde"] == "person"
    assert not {"From", "To", "Subject"} & set(types)
    assert "Erik" not in types  # the lone first name is Erik Lunde


@pytest.mark.parametrize("text", ["", "   \n\t  ", "!!! ... ??? --- ***", "|---|---|\n", "## \n", "```\ncode\n```"])
def test_empty_and_punctuation_only_text_gives_an_empty_extraction(extractor, text):
    outcome = extractor.extract(ChunkInput("c", "d", text))
    assert outcome.outcome == "ok"
    assert outcome.extraction.empty and isinstance(outcome.extraction, ChunkExtraction)


def test_a_one_megabyte_chunk_does_not_blow_up(extractor):
    sentence = "Kestrel Propulsion GmbH and Annika Vogt met Erik Lunde in Hamburg on 14 March 2024 about EUR 5 million. "
    text = (sentence * (1_000_000 // len(sentence) + 1))[:1_000_000]
    started = time.perf_counter()
    extraction = extractor.extract(ChunkInput("c", "d", text)).extraction
    assert time.perf_counter() - started < 60
    assert len(list(extraction.statements())) > 5000
    names = {entity.name for entity in extraction.entities}
    assert {"Kestrel Propulsion GmbH", "Annika Vogt", "Erik Lunde", "Hamburg"} <= names
    # one long line without any sentence end: statements are cut, entity pairs are capped
    line = " ".join(f"Name{i} Person{i}" for i in range(40_000))
    extraction = extractor.extract(ChunkInput("c", "d", line)).extraction
    assert all(len(statement.text) <= 600 for _, statement in extraction.statements())


def test_deterministic(chunks, outcomes):
    again = HeuristicExtractor()
    for chunk, outcome in zip(chunks, outcomes):
        assert again.extract(chunk).extraction.model_dump() == outcome.extraction.model_dump()


def test_configured_entity_types(chunks):
    narrow = HeuristicExtractor(entity_types=["person", "organization"])
    types = {entity.type for chunk in chunks for entity in narrow.extract(chunk).extraction.entities}
    assert types <= {"person", "organization", "other"}


def test_throughput_on_the_sample_corpus(chunks, extractor):
    rounds, started = 0, time.perf_counter()
    while rounds < 3 or time.perf_counter() - started < 1.0:
        for chunk in chunks:
            extractor.extract(chunk)
        rounds += 1
    seconds = time.perf_counter() - started
    characters = sum(len(chunk.text) for chunk in chunks) * rounds
    print(f"\nheuristic extractor: {len(chunks) * rounds / seconds:,.0f} chunks/s "
          f"({characters / seconds / 1e6:.2f} MB/s) over {len(chunks)} sample-corpus chunks × {rounds}")
