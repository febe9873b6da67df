"""Texts met again in one run (a log's repeated lines, page headers, a file that repeats itself) are
extracted, keyworded and counted once, and give exactly what a first meeting gives."""
import json

import pytest

from lexgraph.indexing.lexical_extraction import OfflineRows
from lexgraph.extract.nlp_extractor import NLPExtractor
from lexgraph.extract import keywords
from lexgraph.extract.keywords import extract_keywords
from lexgraph.extract.schemas import ChunkInput

TEXT = "Dana Frost of Bolt Engines met Alpha Shipping in Bergen on 3 May 2024 about contract C-1."
OTHER = "The arbitration over contract C-1 awarded EUR 2 million to Alpha Shipping."


class Counting(NLPExtractor):
    """The real extractor, counting the chunks it extracts."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def extract_many(self, chunks):
        self.calls += len(chunks)
        return super().extract_many(chunks)


def _fresh(chunk: ChunkInput) -> str:
    extraction = NLPExtractor().extract(chunk).extraction
    return json.dumps(extraction.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)


def test_a_repeated_chunk_text_is_extracted_once_and_its_row_is_its_own():
    extractor = Counting()
    rows = OfflineRows(extractor)
    chunks = [ChunkInput(f"c{i}", "doc", TEXT if i % 2 == 0 else OTHER, "Notes") for i in range(6)]
    found = [rows.row(chunk, in_skeleton=False) for chunk in chunks]
    assert extractor.calls == 2
    assert [r["chunk_id"] for r in found] == [c.chunk_id for c in chunks]
    assert all(r["extraction"] == _fresh(c) for r, c in zip(found, chunks))
    assert json.loads(found[0]["extraction"])["entities"], "the text has entities: the check is not vacuous"


def test_the_same_text_under_other_headings_is_extracted_again():
    extractor = Counting()
    rows = OfflineRows(extractor)
    first = rows.row(ChunkInput("a", "doc", TEXT, "Board > Minutes"), in_skeleton=False)
    second = rows.row(ChunkInput("b", "doc", TEXT, "Claims"), in_skeleton=False)
    assert extractor.calls == 2
    assert first["extraction"] == _fresh(ChunkInput("a", "doc", TEXT, "Board > Minutes"))
    assert second["extraction"] == _fresh(ChunkInput("b", "doc", TEXT, "Claims"))
    assert first["extraction"] != second["extraction"]  # the topic comes from the heading


def test_the_memory_is_bounded_oldest_first():
    extractor = Counting()
    rows = OfflineRows(extractor, limit=2)
    texts = [f"Alpha Shipping signed contract C-{i} with Bolt Engines." for i in range(3)]
    for i, text in enumerate(texts):
        rows.row(ChunkInput(f"c{i}", "doc", text), in_skeleton=False)
    rows.row(ChunkInput("again-2", "doc", texts[2]), in_skeleton=False)  # still known
    assert extractor.calls == 3
    rows.row(ChunkInput("again-0", "doc", texts[0]), in_skeleton=False)  # pushed out by the third
    assert extractor.calls == 4


def test_repeated_sentences_keep_their_own_chunks_and_spans():
    chunks = [("c1", f"{TEXT} {OTHER}"), ("c2", f"Intro line here. {TEXT}"), ("c3", OTHER)]
    found = extract_keywords(chunks)
    # what each sentence gives on its own, with the document's lowercase words as the function takes them
    lowercase = {keywords._normalise(m.group()) for _, text in chunks for m in keywords._TOKEN.finditer(text)
                 if m.group()[0].islower()}
    expected = sorted((k, chunk_id, a, b) for chunk_id, text in chunks for a, b in keywords.split_sentences(text)
                      for k in keywords.sentence_keywords(text[a:b], lowercase))
    got = sorted((r["keyword"], r["chunk_id"], r["char_start"], r["char_end"]) for r in found.occurrences.to_dicts())
    assert got == expected and {c for _, c, _, _ in got} == {"c1", "c2", "c3"}
    assert len(found.sentences) == len(set(found.sentences)) == 3  # TEXT, OTHER and the intro, once each


def test_repeated_chunk_texts_give_each_chunk_its_rows_in_chunk_order():
    """A chunk text met again (a letterhead, a log line) is worked on once; every chunk still gets its own
    rows, in chunk order then sentence order, with the sentence ids of a chunk-by-chunk reading."""
    texts = [f"{TEXT} {OTHER}", "Intro line here.", "", OTHER]
    chunks = [(f"c{i}", texts[i % 3 if i % 4 else 3]) for i in range(12)]
    found = extract_keywords(chunks)
    lowercase = {keywords._normalise(m.group()) for _, text in chunks for m in keywords._TOKEN.finditer(text)
                 if m.group()[0].islower()}
    sentences, expected = [], []
    for chunk_id, text in chunks:
        for a, b in keywords.split_sentences(text):
            words = sorted(keywords.sentence_keywords(text[a:b], lowercase))
            if words and text[a:b] not in sentences:
                sentences.append(text[a:b])
            expected += [(k, chunk_id, sentences.index(text[a:b]), a, b) for k in words]
    assert found.occurrences.rows() == expected and found.sentences == sentences
    assert found.occurrences.schema == keywords.OCCURRENCE_SCHEMA
    assert extract_keywords([]).occurrences.schema == keywords.OCCURRENCE_SCHEMA


@pytest.mark.parametrize("texts", [[TEXT, OTHER, TEXT, TEXT, ""], ["x"] * 5, []])
def test_token_counts_of_a_batch_with_repeats_equal_counts_one_by_one(embedder, texts):
    assert embedder.count_tokens(texts) == [embedder.count_tokens([t])[0] for t in texts]
