"""LLM-free keyword extraction and the incrementally aggregated keyword index."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from lexgraph.extract.keywords import (
    empty_keyword_index,
    extract_keywords,
    keyword_chunk_edges_query,
    keyword_stats,
    keyword_vectors,
    sentence_keywords,
    split_sentences,
)
from tests.helpers import add_keyword_stats, subtract_keyword_stats


def test_stopwords_numbers_punctuation_and_single_characters_are_dropped():
    keywords = sentence_keywords("The 3 ships, and 2024's 12.5% x-rays, were NOT in a port -- or were they?!")
    assert keywords == {"ships", "x-rays", "port"}


def test_content_words_are_lowercased_and_possessives_stripped():
    assert sentence_keywords("Dana's Engines run hot") == {"dana", "engines", "run", "hot"}


def test_proper_noun_phrases_are_kept_and_normalised():
    sentence = "Yesterday Li Hua met the Halvorsen Maritime Group’s CEO at the Bank of England."
    keywords = sentence_keywords(sentence)
    assert {"li hua", "halvorsen maritime group", "bank of england"} <= keywords
    assert "yesterday li hua" not in keywords and "halvorsen maritime group ceo" not in keywords
    assert {"li", "hua", "halvorsen", "ceo"} <= keywords


def test_phrases_do_not_cross_punctuation_or_start_with_a_common_first_word():
    assert not any(" " in k for k in sentence_keywords("LiHua: That sounds great, Adam. Smith agrees."))
    assert sentence_keywords("Contract Terms Apply", {"contract"}) & {"terms apply", "contract terms apply"} == {
        "terms apply"
    }


def test_sentences_split_at_line_breaks_and_end_marks_but_not_abbreviations():
    text = "Dr. Lee signed it. Did Adam agree?\n  Yes!   Then e.g. more follows"
    spans = split_sentences(text)
    expected = ["Dr. Lee signed it.", "Did Adam agree?", "Yes!", "Then e.g. more follows"]
    assert [text[s:e] for s, e in spans] == expected
    assert split_sentences("  ...  \n\n") == []


def test_extraction_gives_occurrences_with_offsets_and_distinct_sentences():
    chunks = [("c1", "Li Hua visits Oslo. Li Hua visits Oslo."), ("c2", "Nothing here.\nOslo again!")]
    result = extract_keywords(chunks)
    occurrences = result.occurrences
    assert occurrences.columns == ["keyword", "chunk_id", "sentence_id", "char_start", "char_end"]
    assert result.sentences == ["Li Hua visits Oslo.", "Oslo again!"]  # "Nothing here." has no keyword
    oslo = occurrences.filter(pl.col("keyword") == "oslo").sort("chunk_id", "char_start")
    assert oslo.select("chunk_id", "sentence_id", "char_start", "char_end").rows() == [
        ("c1", 0, 0, 19),
        ("c1", 0, 20, 39),
        ("c2", 1, 14, 25),
    ]
    for row in occurrences.iter_rows(named=True):
        text = dict(chunks)[row["chunk_id"]]
        assert text[row["char_start"] : row["char_end"]] == result.sentences[row["sentence_id"]]
    edges = keyword_chunk_edges_query(occurrences.lazy()).collect()
    assert edges.filter(pl.col("keyword") == "oslo").rows() == [("oslo", "c1", 2), ("oslo", "c2", 1)]
    with pytest.raises(ValueError, match="unique"):
        extract_keywords([("c1", "a"), ("c1", "b")])


def test_keyword_vector_is_the_mean_of_its_distinct_sentences():
    result = extract_keywords([("c1", "Oslo is cold. Bergen is wet.\nOslo is cold.")])
    vectors = np.array([[1.0, 0.0], [0.0, 1.0]])
    stats = keyword_stats(result.occurrences, vectors)
    assert stats["keyword"].to_list() == ["bergen", "cold", "oslo", "wet"]
    assert stats["sentence_count"].to_list() == [1, 1, 1, 1]  # the repeated sentence counts once
    index = add_keyword_stats(empty_keyword_index(2), stats)
    other = keyword_stats(extract_keywords([("d1", "Oslo is wet.")]).occurrences, [[0.6, 0.8]])
    vectors = keyword_vectors(add_keyword_stats(index, other))
    means = dict(zip(vectors["keyword"], vectors["vector"].to_numpy().tolist()))
    np.testing.assert_allclose(means["oslo"], [0.8, 0.4], atol=1e-6)
    np.testing.assert_allclose(means["bergen"], [0.0, 1.0])


def document_stats(rng: np.random.Generator, words: list[str], doc: str) -> pl.DataFrame:
    sentences = [" ".join(rng.choice(words, 4)) + "." for _ in range(6)]
    result = extract_keywords([(f"{doc}-c0", " ".join(sentences[:3])), (f"{doc}-c1", " ".join(sentences[3:]))])
    vectors = rng.normal(size=(len(result.sentences), 8))  # float64: full mantissas, so rounding would show
    return keyword_stats(result.occurrences, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))


def test_add_then_subtract_returns_the_original_index_exactly_in_any_order():
    rng = np.random.default_rng(0)
    words = [f"term{i}" for i in range(15)]
    docs = [document_stats(rng, words, f"d{i}") for i in range(5)]
    base = empty_keyword_index(8)
    for doc in docs[:3]:
        base = add_keyword_stats(base, doc)
    grown = add_keyword_stats(add_keyword_stats(base, docs[3]), docs[4])
    assert subtract_keyword_stats(subtract_keyword_stats(grown, docs[3]), docs[4]).equals(base)
    rebuilt = empty_keyword_index(8)
    for doc in (docs[4], docs[2], docs[0], docs[3], docs[1]):
        rebuilt = add_keyword_stats(rebuilt, doc)
    assert rebuilt.equals(grown)
    everything_removed = grown
    for doc in docs:
        everything_removed = subtract_keyword_stats(everything_removed, doc)
    assert everything_removed.height == 0


def test_subtracting_what_was_never_added_or_mixing_dimensions_is_refused():
    rng = np.random.default_rng(1)
    doc = document_stats(rng, ["alpha", "beta", "gamma"], "d")
    with pytest.raises(ValueError, match="not in the index"):
        subtract_keyword_stats(empty_keyword_index(8), doc)
    with pytest.raises(ValueError, match="schema"):
        add_keyword_stats(empty_keyword_index(3), doc)
    doubled = add_keyword_stats(add_keyword_stats(empty_keyword_index(8), doc), doc)
    halved = subtract_keyword_stats(doubled, doc)
    with pytest.raises(ValueError, match="more sentences"):
        subtract_keyword_stats(halved, add_keyword_stats(doc, doc))
    with pytest.raises(ValueError, match="only 1 vectors"):
        keyword_stats(extract_keywords([("c", "Oslo. Bergen.")]).occurrences, np.zeros((1, 2)))
