"""Damage repair: an indexed document whose extract files are truncated, damaged or missing goes back for
re-ingestion when its inbox file can be read, else it is named as a failure. `lexgraph ingest` (the runner)
and the corpus sensor both call it before they reconcile or retry."""
from __future__ import annotations

from lexgraph.inbox import FileState
from lexgraph.indexing import pipeline
from lexgraph.storage.extract_store import ExtractStore, verify_extracts
from lexgraph.storage.vector_store import VectorStore

# Extract outputs every indexed document has; one missing is damage like a truncated file.
INDEXED_STAGES = (pipeline.SOURCES, pipeline.CHUNKS, pipeline.VECTORS, pipeline.KEYWORDS, pipeline.KEYWORD_STATS)


def drop_damaged_documents(store: ExtractStore, vectors: VectorStore, files: dict[str, FileState],
                           indexed: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Indexed documents (`indexed`: the catalog as read from `vectors`) with a truncated, damaged or missing
    extract file: those whose inbox file can be read are taken out of the catalog (and their damaged files
    deleted) so reconcile re-ingests them; the others are returned as failures that name the file.
    -> (repaired, damaged)."""
    problems = verify_extracts(store, indexed, INDEXED_STAGES)
    repaired = {d: p for d, p in problems.items() if d in files and not files[d].problem}
    damaged = {d: f"{p}; the document cannot be re-ingested: " + (
                   "its file is no longer in the inbox (`lexgraph ingest --prune` removes it from the index)"
                   if d not in files else f"its file cannot be read now ({files[d].problem})")
               for d, p in problems.items() if d not in repaired}
    if repaired:
        for doc_id in repaired:
            store.remove_corrupt(doc_id)
        vectors.forget_sources(list(repaired))
    return repaired, damaged
