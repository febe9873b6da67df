"""What an auditor needs beside an answer: for each citation its source version (sha256), the text
around the cited span, and the extractor, model and prompt version of the statement it falls in; for
the answer, the index it was read from."""
from __future__ import annotations

from typing import Sequence

import polars as pl

from lexgraph.indexing.corpus_state import catalog_digest
from lexgraph.indexing.pipeline import STATEMENTS
from lexgraph.extract.source_texts import source_text
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import VectorStore

CONTEXT_CHARS = 400


def index_identity(settings: Settings, catalog: dict[str, str] | None = None) -> dict:
    """Which index an answer was read from. catalog: doc_id -> content hash, when the caller has it."""
    from lexgraph import __version__

    catalog = VectorStore(settings.lance_uri).indexed_hashes() if catalog is None else catalog
    return {"index_version": settings.index_version, "lexgraph_version": __version__,
            "catalog_digest": catalog_digest(catalog), "index_dir": str(settings.index_dir)}


def _statement_for(store: ExtractStore, doc_id: str, chunk_id: str, cited: str) -> dict | None:
    """The statement of the cited chunk whose text overlaps the cited span most (None without any)."""
    if not store.exists(STATEMENTS, doc_id):
        return None
    statements = store.read(STATEMENTS, doc_id).filter(pl.col("chunk_id") == chunk_id)
    if statements.height == 0:
        return None
    words = set(cited.lower().split())
    rows = statements.to_dicts()
    return max(rows, key=lambda r: len(words & set(r["text"].lower().split())))


def citation_provenance(settings: Settings, citations: Sequence, catalog: dict[str, str] | None = None) -> list[dict]:
    """Each citation with its document and chunk ids, source sha256, surrounding text, and the provenance
    of the statement it rests on (the extractor, model and prompt version; None for a plain chunk)."""
    store = ExtractStore(settings.extract_dir)
    hashes = VectorStore(settings.lance_uri).indexed_hashes() if catalog is None else catalog
    out = []
    for citation in citations:
        sha = hashes.get(citation.doc_id)
        before = after = ""
        if sha is not None:
            try:
                text = source_text(store, sha)["text"]
                before = text[max(0, citation.char_start - CONTEXT_CHARS):citation.char_start]
                after = text[citation.char_end:citation.char_end + CONTEXT_CHARS]
            except KeyError:
                pass  # an index built before source texts were kept: the span alone
        statement = _statement_for(store, citation.doc_id, citation.chunk_id, citation.text)
        out.append({**citation.public(), "doc_id": citation.doc_id, "chunk_id": citation.chunk_id,
                    "statement_id": statement["statement_id"] if statement else None,
                    "statement": statement["text"] if statement else None,
                    "source_sha256": sha, "context_before": before, "context_after": after,
                    "extractor": statement["extractor"] if statement else None,
                    "model": statement["model"] if statement else None,
                    "prompt_version": statement["prompt_version"] if statement else None,
                    "extracted_at": str(statement["extracted_at"]) if statement else None})
    return out
