"""LLM-free keywords for KET-RAG's keyword↔chunk bipartite graph, and the corpus keyword index.

Keywords are lowercased content words plus proper-noun phrases ("Halvorsen Maritime Group").
A keyword's vector is the mean embedding of the sentences it occurs in, kept as (sum, count)
so that documents can be added to and subtracted from the corpus-wide index.

Why: KET-RAG indexes every chunk, not just the skeleton, through keywords, and this must cost
no LLM call and never re-read the corpus when one document changes.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt
import polars as pl
import scipy.sparse as sp

from lexgraph.terms import STOPWORDS

# Lowercase words that may sit inside a proper-noun phrase: "Bank of England", "Ludwig van Beethoven".
_CONNECTORS = frozenset({"of", "the", "and", "de", "del", "der", "van", "von", "da", "di", "du", "la", "le"})
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "a.m", "p.m", "inc", "ltd", "co", "corp",
     "no"}
)
# Words that often open a sentence capitalised before a name: "Yesterday Li Hua ..." is about "Li Hua".
_OPENERS = frozenset(
    {"yesterday", "today", "tomorrow", "tonight", "recently", "finally", "later", "currently", "actually",
     "unfortunately", "fortunately", "hopefully", "honestly", "dear", "congratulations", "welcome", "sorry"}
)
_TOKEN = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
_TERMINATOR = re.compile(r"\n|[.!?]+[\"'”’)\]]*(?=\s|$)")
_LAST_WORD = re.compile(r"([^\W_]+(?:\.[^\W_]+)*)$")
_POSSESSIVE = re.compile(r"'s$")
# Sentence vectors are rounded to multiples of 2^-30 before summing: every float64 sum is then
# exact (while a component's sum stays below 2^23), so adding and subtracting documents in any
# order gives bit for bit the index a rebuild would.
_GRID = float(2**30)

OCCURRENCE_SCHEMA: dict[str, pl.DataType] = {
    "keyword": pl.String(),
    "chunk_id": pl.String(),
    "sentence_id": pl.Int32(),
    "char_start": pl.Int32(),
    "char_end": pl.Int32(),
}


def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences in ``text``, whitespace trimmed.

    Sentences end at a line break or at . ! ? followed by white space, except after common
    abbreviations ("Dr.", "e.g.") and initials ("J."). Spans without a letter or digit are dropped.
    """
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _TERMINATOR.finditer(text):
        if match.group() == "." and _ends_with_abbreviation(text[max(0, match.start() - 24) : match.start()]):
            continue
        _add_span(spans, text, start, match.end())
        start = match.end()
    _add_span(spans, text, start, len(text))
    return spans


def _ends_with_abbreviation(before: str) -> bool:
    word = _LAST_WORD.search(before)
    if word is None:
        return False
    token = word.group(1)
    return token.lower() in _ABBREVIATIONS or (len(token) == 1 and token.isupper())


def _add_span(spans: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if any(character.isalnum() for character in stripped):
        offset = start + len(piece) - len(piece.lstrip())
        spans.append((offset, offset + len(stripped)))


def _normalise(token: str) -> str:
    folded = unicodedata.normalize("NFKC", token).replace("’", "'").lower()
    return _POSSESSIVE.sub("", folded)


def _content_word(token: str) -> str | None:
    """The keyword for one token, or None for stopwords, 1-character and numbers-only tokens."""
    word = _normalise(token)
    plain = unicodedata.normalize("NFKC", token).replace("’", "'").lower()
    if plain in STOPWORDS or word in STOPWORDS or len(word) < 2 or not any(c.isalpha() for c in word):
        return None
    return word


def _proper_noun_phrases(sentence: str, tokens: list[re.Match[str]], lowercase_words: set[str]) -> set[str]:
    """Runs of two or more capitalised words separated only by spaces, e.g. "Li Hua".

    A sentence's first word is capitalised anyway, so it only counts when the document never
    uses it in lowercase and it is no common opener ("Yesterday Li Hua ..." gives "li hua").
    A possessive ends the phrase: "Halvorsen Maritime Group's CEO" gives "halvorsen maritime group".
    """
    phrases: set[str] = set()
    run: list[tuple[str, bool]] = []  # (token, capitalised)

    def close() -> None:
        while run and not run[-1][1]:
            run.pop()
        if sum(capitalised for _, capitalised in run) >= 2:
            phrases.add(" ".join(_normalise(token) for token, _ in run))
        run.clear()

    previous_end = -1
    for position, match in enumerate(tokens):
        token = match.group()
        if previous_end >= 0 and not sentence[previous_end : match.start()].isspace():
            close()
        word = _normalise(token)
        capitalised = token[0].isupper() and word not in STOPWORDS and any(c.isalpha() for c in word)
        if position == 0 and (word in lowercase_words or word in _OPENERS):
            capitalised = False
        if capitalised or (run and token in _CONNECTORS):
            run.append((token, capitalised))
            if _POSSESSIVE.search(token.replace("’", "'")):
                close()
        else:
            close()
        previous_end = match.end()
    close()
    return phrases


def sentence_keywords(sentence: str, lowercase_words: set[str] | None = None) -> set[str]:
    """Keywords of one sentence: content words and proper-noun phrases, normalised.

    ``lowercase_words`` are the words the document also uses in lowercase: a sentence's
    capitalised first word that is one of them does not start a phrase.
    """
    tokens = list(_TOKEN.finditer(sentence))
    words = {word for match in tokens if (word := _content_word(match.group()))}
    return words | _proper_noun_phrases(sentence, tokens, lowercase_words or set())


@dataclass(frozen=True)
class KeywordExtraction:
    """One document's keyword occurrences and the distinct sentences whose embeddings they need."""

    occurrences: pl.DataFrame  # OCCURRENCE_SCHEMA; sentence_id indexes ``sentences``
    sentences: list[str]


def extract_keywords(chunks: Sequence[tuple[str, str]]) -> KeywordExtraction:
    """Keyword occurrences for the (chunk_id, text) chunks of one document.

    One row per keyword per sentence of a chunk, with the sentence's character span in the
    chunk text. Sentences are de-duplicated by text, and only those holding a keyword are kept.
    """
    chunk_ids = [chunk_id for chunk_id, _ in chunks]
    if len(set(chunk_ids)) != len(chunk_ids):
        raise ValueError("chunk ids must be unique")
    # Normalised once per distinct token and worked on once per distinct chunk text: a large document
    # repeats most of its tokens, and a log or a letterhead repeats whole chunks.
    texts = {text: position for position, text in enumerate(dict.fromkeys(text for _, text in chunks))}
    lowercase_words = {_normalise(token) for token in {token for text in texts for token in _TOKEN.findall(text)}
                       if token[0].islower()}
    sentences: list[str] = []  # the distinct sentences holding a keyword, in order of first meeting
    known: dict[str, tuple[list[str], int]] = {}  # a sentence's keywords and id, found once per document
    found: list[tuple[int, str, int, int, int]] = []  # (text, keyword, sentence id, span) of each distinct text
    for text, position in texts.items():
        for start, end in split_sentences(text):
            sentence = text[start:end]
            if sentence not in known:
                keywords = sorted(sentence_keywords(sentence, lowercase_words))
                known[sentence] = (keywords, len(sentences) if keywords else -1)
                if keywords:
                    sentences.append(sentence)
            keywords, sentence_id = known[sentence]
            found.extend((position, keyword, sentence_id, start, end) for keyword in keywords)
    # each chunk gets its text's rows, in chunk order: a join, not a Python tuple per occurrence
    per_text = pl.DataFrame(found, orient="row", schema={"text": pl.Int32} | {
        name: dtype for name, dtype in OCCURRENCE_SCHEMA.items() if name != "chunk_id"})
    chunk_texts = pl.DataFrame({"chunk_id": chunk_ids, "text": [texts[text] for _, text in chunks]},
                               schema={"chunk_id": pl.String, "text": pl.Int32})
    occurrences = (chunk_texts.with_row_index("_chunk")
                   .join(per_text.with_row_index("_row"), on="text", how="inner")
                   .sort("_chunk", "_row").select(list(OCCURRENCE_SCHEMA)))
    return KeywordExtraction(occurrences, sentences)


def chunk_keyword_pairs_query(occurrences: pl.LazyFrame) -> pl.LazyFrame:
    """The distinct (chunk_id, keyword) pairs of a scan of keyword occurrences."""
    return occurrences.select("chunk_id", "keyword").unique()


def keyword_chunk_edges_query(occurrences: pl.LazyFrame) -> pl.LazyFrame:
    """keyword→chunk edges with the number of the chunk's sentences holding the keyword; a query, so a scan
    of a keywords file reads only the two columns it needs."""
    return (
        occurrences.select("keyword", "chunk_id").group_by("keyword", "chunk_id")
        .agg(pl.len().cast(pl.Int32).alias("sentence_count"))
        .sort("keyword", "chunk_id")
    )


def empty_keyword_index(dim: int) -> pl.DataFrame:
    """A corpus keyword index with no keywords yet, for vectors of ``dim`` components."""
    return _stats_frame(np.zeros(0, dtype=str), np.zeros((0, dim)), np.zeros(0, dtype=np.int64))


def _stats_frame(keywords: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "keyword": pl.Series(keywords.tolist(), dtype=pl.String),
            "vector_sum": pl.Series(sums, dtype=pl.Array(pl.Float64, sums.shape[1])),
            "sentence_count": pl.Series(counts, dtype=pl.Int64),
        }
    )


def keyword_stats(occurrences: pl.DataFrame, sentence_vectors: npt.ArrayLike) -> pl.DataFrame:
    """Per keyword of one document: the sum of its distinct sentences' vectors, and their count.

    ``sentence_vectors[i]`` embeds ``KeywordExtraction.sentences[i]``. Sorted by keyword.
    """
    vectors = np.asarray(sentence_vectors, dtype=np.float64)
    if vectors.ndim != 2 or not bool(np.all(np.isfinite(vectors))):
        raise ValueError("sentence vectors must be a finite 2-d array")
    pairs = occurrences.select("keyword", "sentence_id").unique()
    sentence_ids = pairs["sentence_id"].to_numpy().astype(np.int64)
    if len(sentence_ids) and sentence_ids.max() >= len(vectors):
        raise ValueError(
            f"occurrences name sentence {sentence_ids.max()} but only {len(vectors)} vectors were given"
        )
    keywords, row = np.unique(pairs["keyword"].to_numpy().astype(str), return_inverse=True)
    membership = sp.csr_matrix(
        (np.ones(len(row)), (row, sentence_ids)), shape=(len(keywords), len(vectors))
    )
    sums = membership @ (np.rint(vectors * _GRID) / _GRID)
    return _stats_frame(keywords, np.asarray(sums), membership.getnnz(axis=1).astype(np.int64))


def updated_keyword_rows(current: pl.DataFrame, document: pl.DataFrame, sign: int) -> pl.DataFrame:
    """The rows of one document's keywords once its stats are added (``sign`` +1) or subtracted (-1).

    ``current`` holds the index's rows of those keywords (it may hold others, and any part of the
    index will do): only they are read, so an update costs the document's keywords, not the index.
    One row per keyword of the document, sorted; a keyword left with no sentence comes back with a
    count of 0 and a zero sum (a tombstone: the keyword leaves the index).
    """
    if current.schema != document.schema or "vector_sum" not in current.columns:
        raise ValueError(f"keyword frames differ in schema: {current.schema} vs {document.schema}")
    if not document["keyword"].is_unique().all():
        raise ValueError("a document's keyword stats must list each keyword once")
    touched = current.join(document.select("keyword"), on="keyword", how="semi").sort("keyword")
    if not touched["keyword"].is_unique().all():
        raise ValueError("the index lists a keyword twice")
    if sign < 0 and touched.height != document.height:
        raise ValueError("subtracting keywords that are not in the index: was this document added?")
    document = document.sort("keyword")
    names = document["keyword"].to_numpy().astype(str)
    sums = sign * document["vector_sum"].to_numpy()
    counts = sign * document["sentence_count"].to_numpy()
    at = np.searchsorted(names, touched["keyword"].to_numpy().astype(str))
    sums[at] += touched["vector_sum"].to_numpy()
    counts[at] += touched["sentence_count"].to_numpy()
    if bool(np.any(counts < 0)):
        raise ValueError("subtracting more sentences than the index holds: was this document added?")
    sums[counts == 0] = 0.0  # exact sums come back to 0 anyway; a tombstone carries nothing
    return _stats_frame(names, sums, counts)


def apply_keyword_rows(index: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """``index`` with ``rows`` (from :func:`updated_keyword_rows`) in place of its rows of the same
    keywords; rows with a count of 0 remove their keyword. Sorted by keyword."""
    untouched = index.join(rows.select("keyword"), on="keyword", how="anti")
    return pl.concat([untouched, rows.filter(pl.col("sentence_count") > 0)]).sort("keyword")


def keyword_vectors(index: pl.DataFrame) -> pl.DataFrame:
    """KET-RAG's keyword vectors: mean sentence embedding per keyword (float32, for the vector store)."""
    sums = index["vector_sum"].to_numpy()
    counts = index["sentence_count"].to_numpy()[:, None]
    means = (sums / np.maximum(counts, 1)).astype(np.float32)
    return pl.DataFrame(
        {
            "keyword": index["keyword"],
            "vector": pl.Series(means, dtype=pl.Array(pl.Float32, means.shape[1])),
            "sentence_count": index["sentence_count"],
        }
    )
