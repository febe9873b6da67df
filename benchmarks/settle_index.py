"""Bring a cached benchmark index to the current on-disk bookkeeping, in place and with its content
unchanged: what the first corpus update after an upgrade does by itself, done once so that timed
fresh-process adds (benchmarks.fresh_add) measure the steady state, not a one-off migration.

    .venv/bin/python -m benchmarks.settle_index <index home>

Steps, each skipped when already done: the KNN save rewritten in its current format; the graph's SIMILAR
table recreated in its current schema with the save's edges; the chunk rows' former
PageRank and skeleton columns dropped (they live in the chunk_scores table); the keyword index rewritten as
an Arrow base (with the id its deltas name); the lexical graph's saved state written (a rebuild of the same graph, nothing
embedded), or one saved as Parquet written again as Arrow; the record of extract files verified whole
written; the keyword links' record regrouped a row per document; the lance graph tables written in their current format;
the LanceDB tables compacted, keeping no
old version (nothing else reads a cached index).
"""
import json
import sys
import time
from datetime import timedelta

import pyarrow as pa

from lexgraph.indexing import corpus_keywords, corpus_state, knn_state
from lexgraph.indexing import lexical
from lexgraph.indexing.lexical_state import load_state, save_state
from lexgraph.extract.embedder import Embedder
from lexgraph.settings import Settings
from lexgraph.storage import lance_indexes, lance_maintenance
from lexgraph.storage.extract_store import ExtractStore, verify_extracts
from lexgraph.storage.graph_store import SIMILAR_SCHEMA, GraphStore
from lexgraph.storage.vector_store import CHUNKS, VectorStore


def timed(label: str, step) -> None:
    started = time.perf_counter()
    outcome = step()
    print(f"{label}: {outcome} ({time.perf_counter() - started:.1f} s)", flush=True)


def keyword_index(files: corpus_state.CorpusFiles, dimension: int) -> str:
    if files.keyword_index.exists():
        with pa.memory_map(str(files.keyword_index)) as source:
            if corpus_keywords.KEYWORD_BASE in (pa.ipc.open_file(source).schema.metadata or {}):
                return "already an Arrow base"
    index, included, links = corpus_keywords._load_keyword_index(files, dimension)
    if included is None:
        return "no trusted index to rewrite (the next update rebuilds it)"
    corpus_keywords._write_keyword_index(files, index, included, links)
    return f"{index.height} keywords rewritten as an Arrow base (deltas extend it)"


def similar_schema(settings: Settings, files: corpus_state.CorpusFiles) -> str:
    """The graph's SIMILAR in the current schema, holding the save's edges: opening a writer recreates a table
    of an older schema empty, and the save's edges are written back whole, as the next update would."""
    previous = corpus_state.read_json(files.similar_synced).get("generation")
    with GraphStore.writer(settings.graph_path) as graph:
        if knn_state.synced_similar_generation(files) is not None:
            return "already current"
        saved, reason = knn_state.load_knn(files)
        if saved is None or previous != saved.generation:
            return f"the graph did not hold the save's edges ({reason or 'no sync record'}): the next update writes them"
        edges = knn_state.saved_edges(saved)
        graph.replace_similarity_edges(edges)
    knn_state.record_similar_synced(files, saved.generation)
    return f"SIMILAR recreated in schema {SIMILAR_SCHEMA}, {edges.height} edges written"


def chunk_score_columns(vectors: VectorStore) -> str:
    table = vectors.db.open_table(CHUNKS)
    former = [c for c in ("pagerank", "in_skeleton") if c in table.schema.names]
    if not former:
        return "already without them"
    table.drop_columns(former)
    return f"dropped {former} (the next corpus update writes chunk_scores)"


def lexical_state(settings: Settings, files: corpus_state.CorpusFiles, vectors: VectorStore, embedder) -> str:
    if (files.lexical_state / "state.json").exists():
        state, why = load_state(files.lexical_state)
        if state is None:
            return f"saved state not usable ({why}): the next update rebuilds it"
        if any((files.lexical_state / state.generation).glob("*.parquet")):
            save_state(files.lexical_state, state)
            return "state saved before as Parquet, written again as Arrow"
        return "state already saved"
    with GraphStore.writer(settings.graph_path) as graph:
        result = lexical.build_lexical_graph(sorted(vectors.indexed_hashes()), ExtractStore(settings.extract_dir),
                                             graph, vectors, embedder, run_id="settle",
                                             state_dir=files.lexical_state)
    return f"{result.mode} ({result.reason}), embedded {result.embedded}"


def verified_extracts(settings: Settings, vectors: VectorStore) -> str:
    from lexgraph.indexing.repair import INDEXED_STAGES

    problems = verify_extracts(ExtractStore(settings.extract_dir), vectors.indexed_hashes(), INDEXED_STAGES)
    return f"record written, {len(problems)} document(s) with a problem"


def keyword_links_record(files: corpus_state.CorpusFiles) -> str:
    path = files.root / lance_indexes.LINK_DOCS_FILE
    record, why = lance_indexes._read_record(path)
    if record is None:
        return f"{why} (the next search_indexes rewrites the table)"
    lance_indexes._write_record(path, record)
    return f"{record.height} documents' rows written a row per document"


def graph_tables(settings: Settings, files: corpus_state.CorpusFiles, vectors: VectorStore) -> str:
    """The lance graph tables in their current format, written whole (what the first corpus run after an upgrade
    does once), so that timed adds measure the update by difference."""
    from lexgraph.query import graph_tables_step, lance_graph_tables

    if lance_graph_tables.tables_current(files):
        return "already current"
    outcome = graph_tables_step.update_graph_tables(files, vectors, ExtractStore(settings.extract_dir), settings)
    why = outcome.figures.get("why_whole")
    return outcome.figures["decision"] + (f" ({why})" if why else "")


def main() -> None:
    settings = Settings.from_env(home=sys.argv[1])
    files, vectors = corpus_state.CorpusFiles(settings.index_dir), VectorStore(settings.lance_uri)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    timed("knn save", lambda: knn_state.resave_knn(files))
    timed("graph's SIMILAR schema", lambda: similar_schema(settings, files))
    timed("chunk rows' score columns", lambda: chunk_score_columns(vectors))
    timed("keyword index", lambda: keyword_index(files, embedder.dimension))
    timed("lexical state", lambda: lexical_state(settings, files, vectors, embedder))
    timed("extract files verified", lambda: verified_extracts(settings, vectors))
    timed("keyword links record", lambda: keyword_links_record(files))
    timed("graph tables", lambda: graph_tables(settings, files, vectors))
    lance_maintenance.KEEP_VERSIONS = timedelta(0)
    timed("lance tables", lambda: json.dumps([(t["table"], t["decision"], t["fragments_after"])
                                              for t in lance_maintenance.compact_tables(vectors)]))


if __name__ == "__main__":
    main()
