"""A graph written with SIMILAR's kind as a STRING (before SIMILAR_SCHEMA 2) is migrated by the first writer that
opens it: the table recreated with a kind code, the old sync record void, and the next corpus update writes the
edges whole, with the same kinds and weights as a graph written in the new schema."""
from __future__ import annotations

import os

import polars as pl
import pytest

from lexgraph.atomic_json import write_json
from lexgraph.indexing import corpus_state, knn_state, knn_update
from lexgraph.storage.graph_store import GraphStore
from tests.helpers import clustered_corpus, load_chunk_nodes

# Only Kùzu graphs were ever written in the old schema; and a process that imports kuzu cannot open LadybugDB
pytestmark = pytest.mark.skipif(os.environ.get("LEXGRAPH_GRAPH_BACKEND", "kuzu").lower() != "kuzu",
                                reason="a Kùzu-only migration (LEXGRAPH_GRAPH_BACKEND is not kuzu)")

OLD_SIMILAR = "CREATE REL TABLE SIMILAR(FROM Chunk TO Chunk, kind STRING, weight DOUBLE)"


def as_old_schema(path, edges: pl.DataFrame, files: corpus_state.CorpusFiles, generation: str) -> None:
    """What code before the kind code left: SIMILAR with string kinds holding `edges`, and its sync record."""
    import kuzu  # here, not at collection: importing it binds the whole worker process to Kùzu

    db = kuzu.Database(str(path))
    conn = kuzu.Connection(db)
    conn.execute("DROP TABLE SIMILAR")
    conn.execute(OLD_SIMILAR)
    rows = edges.select(pl.col("src").alias("from"), pl.col("dst").alias("to"), "kind", "weight")
    conn.execute("COPY SIMILAR FROM $rows", {"rows": rows.to_arrow()})
    conn.close()
    db.close()
    write_json(files.similar_synced, {"generation": generation})


def old_schema_graph(tmp_path):
    """60 of 80 clustered chunks' KNN edges in an old-schema graph with its sync record."""
    chunks, vectors, words = clustered_corpus(80, seed=5, doc_size=10, vocabulary=40)
    files, path = corpus_state.CorpusFiles(tmp_path / "corpus"), tmp_path / "g.kuzu"
    with GraphStore.writer(path) as graph:
        load_chunk_nodes(graph, chunks)
        first = knn_update.update_knn(files, chunks.head(60), vectors[:60], words, k=4)
        knn_update.write_similarity_edges(files, graph, first)
    as_old_schema(path, first.edges, files, first.generation)
    return chunks, vectors, words, files, path, first


def kind_type(graph: GraphStore) -> str:
    return graph.conn.execute("CALL table_info('SIMILAR') WHERE name = 'kind' RETURN type").get_next()[0]


def test_an_old_schema_graph_is_migrated_on_first_open_and_the_next_update_writes_the_edges_whole(tmp_path):
    chunks, vectors, words, files, path, first = old_schema_graph(tmp_path)

    reader = GraphStore(path)  # `lexgraph status` before any writer: counts and names still read
    try:
        assert reader.count("SIMILAR") == first.edges.height
        assert sorted(reader.similarity_edges().iter_rows()) == sorted(first.edges.iter_rows())
    finally:
        reader.close()

    with GraphStore.writer(path) as graph:  # e.g. the per-document run's load, before any corpus update
        assert kind_type(graph) == "UINT8" and graph.count("SIMILAR") == 0
    assert knn_state.synced_similar_generation(files) is None  # the old record names edges the graph lost

    with GraphStore.writer(path) as graph:
        assert kind_type(graph) == "UINT8"
        result = knn_update.update_knn(files, chunks, vectors, words, k=4)
        assert result.edge_changes is not None  # the KNN state itself was kept
        figures = knn_update.write_similarity_edges(files, graph, result)
        assert figures["similar_edges_rewritten"] is True
        assert sorted(graph.similarity_edges().iter_rows()) == sorted(result.edges.iter_rows())
        assert set(graph.query("MATCH ()-[r:SIMILAR]->() RETURN DISTINCT r.kind AS k")["k"]) == {0, 1}
    assert knn_state.synced_similar_generation(files) == result.generation

    # and the same as a graph written in the new schema from the start
    fresh_files, fresh_path = corpus_state.CorpusFiles(tmp_path / "fresh" / "corpus"), tmp_path / "fresh" / "g.kuzu"
    with GraphStore.writer(fresh_path) as graph:
        load_chunk_nodes(graph, chunks)
        for n in (60, 80):
            knn_update.write_similarity_edges(fresh_files, graph, knn_update.update_knn(fresh_files, chunks.head(n), vectors[:n],
                                                                          words, k=4))
        assert sorted(graph.similarity_edges().iter_rows()) == sorted(result.edges.iter_rows())


def test_settle_index_migrates_a_cached_graph_so_the_next_update_writes_a_diff(tmp_path):
    """benchmarks.settle_index: the save's edges written back into the recreated table and the record renewed,
    so a timed add after it diffs instead of paying the one-off rewrite."""
    from types import SimpleNamespace

    from benchmarks import settle_index

    chunks, vectors, words, files, path, first = old_schema_graph(tmp_path)
    settings = SimpleNamespace(graph_path=str(path))
    assert settle_index.similar_schema(settings, files).startswith("SIMILAR recreated in schema 2")
    assert knn_state.synced_similar_generation(files) == first.generation
    assert settle_index.similar_schema(settings, files) == "already current"
    with GraphStore.writer(path) as graph:
        assert sorted(graph.similarity_edges().iter_rows()) == sorted(first.edges.iter_rows())
        result = knn_update.update_knn(files, chunks, vectors, words, k=4)
        assert knn_update.write_similarity_edges(files, graph, result)["similar_edges_rewritten"] is False
        assert sorted(graph.similarity_edges().iter_rows()) == sorted(result.edges.iter_rows())
