"""The normalised text of every source version, kept so a citation's span can be shown later.

Texts are keyed by the content hash of the file's bytes: a changed file adds a new text and the
old one stays, so a chunk id, an answer or an audit record made against the old version still
resolves to the characters it cited.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

import polars as pl

from lexgraph.extract.readers import SourceDocument
from lexgraph.storage.extract_store import ExtractStore

SOURCE_TEXTS = "source_texts"
SOURCE_TEXT_SCHEMA = {"doc_id": pl.Utf8, "content_hash": pl.Utf8, "text": pl.Utf8, "page_starts": pl.List(pl.Int64)}


def save_source_text(document: SourceDocument, store: ExtractStore) -> None:
    """Write the text of this version once; an existing version is never rewritten."""
    if store.exists(SOURCE_TEXTS, document.content_hash):
        return
    frame = pl.DataFrame([{"doc_id": document.doc_id, "content_hash": document.content_hash, "text": document.text,
                           "page_starts": list(document.page_starts)}], schema=SOURCE_TEXT_SCHEMA)
    store.write(SOURCE_TEXTS, document.content_hash, frame)


def source_text(store: ExtractStore, content_hash: str) -> dict:
    """doc_id, content_hash, text and page_starts of one stored source version."""
    if not store.exists(SOURCE_TEXTS, content_hash):
        raise KeyError(f"no stored text for source version {content_hash}")
    return store.read(SOURCE_TEXTS, content_hash).row(0, named=True)


def source_span(store: ExtractStore, content_hash: str, start: int, end: int) -> str:
    """The characters [start, end) of a source version's normalised text, as a chunk cited them."""
    text = source_text(store, content_hash)["text"]
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"span [{start}, {end}) is outside source version {content_hash} ({len(text)} characters)")
    return text[start:end]


def page_of(page_starts: Sequence[int] | None, offset: int) -> int | None:
    """1-based page (slide) holding the character at offset; None when the format has no pages."""
    if not page_starts:
        return None
    return max(1, bisect_right(page_starts, offset))
