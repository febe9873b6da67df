"""The graph_tables corpus step: the lance graph tables (lexgraph.query.lance_graph_tables) kept current, by
difference when it can be (lexgraph.query.graph_tables_diff), else written whole from the memory graph."""
from __future__ import annotations

import time

from lexgraph.indexing.corpus_state import GRAPH_TABLES, CorpusFiles, catalog_digest
from lexgraph.indexing.corpus_update import StepOutcome
from lexgraph.query import graph_channels, graph_tables_diff
from lexgraph.query import lance_graph_tables as gt
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import CHUNKS, VectorStore


def update_graph_tables(files: CorpusFiles, store: VectorStore, extract: ExtractStore, settings) -> StepOutcome:
    """graph_tables: the lexical graph written as the graph tables when queries use the lance backend (below the
    threshold, only the record that none are needed), then recorded as built (the crash-safety commit). By
    difference when it can be (graph_tables_diff), else whole."""
    indexed = store.indexed_hashes()  # the catalog this build is made from
    digest = catalog_digest(indexed)
    chunks = store.count(CHUNKS)
    lexical_inputs = files.recorded_lexical_inputs()
    figures = {"chunks": chunks, "threshold": settings.lance_threshold, "query_backend": settings.query_backend,
               "catalog_digest": digest}
    if chunks == 0 or not settings.uses_lance(chunks):
        files.record_built(GRAPH_TABLES, digest, settings)
        return StepOutcome(digest, figures={**figures, "decision": "below threshold: none"})
    started = time.perf_counter()
    state = gt.read_state(files)
    written, why = graph_tables_diff.try_diff(files, store, extract, state, lexical_inputs)
    decision = "written by difference"
    if written is None:
        decision = "written whole"
        gt.mark_writing(files, state)
        frame = store.scan(CHUNKS, ["chunk_id", "doc_id"])
        chunk_ids, doc_ids = frame["chunk_id"].to_list(), frame["doc_id"].to_list()
        rows: dict = {}
        graph = graph_channels.load_lexical_graph(store, extract, {c: i for i, c in enumerate(chunk_ids)}, rows)
        written = gt.write_graph_tables(store, graph, chunk_ids, doc_ids, rows)
    gt.record_tables(files, written, digest, lexical_inputs)
    files.record_built(GRAPH_TABLES, digest, settings)
    return StepOutcome(digest, figures={**figures, "decision": decision, "why_whole": why,
                                        "seconds": round(time.perf_counter() - started, 2),
                                        "bridge_pair_share": round(gt.corpus_figures(written)["bridge_pair_share"], 4)},
                       details={"rows": written["counts"]}, paths={"state": str(files.graph_tables)})
