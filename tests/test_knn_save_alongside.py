"""The KNN state saved in a thread while the graph's SIMILAR edges are written (update_knn(save=False) and
write_similarity_edges): the same files and edges as one after the other, and a graph write that fails
leaves the sync record naming no save, so the next update writes the edges whole."""
from __future__ import annotations

import pytest

from lexgraph.indexing import corpus_state, knn_state, knn_update
from lexgraph.storage.graph_store import GraphStore
from tests.helpers import clustered_corpus, load_chunk_nodes
from tests.conftest import GRAPH_SUFFIX

def similar(graph: GraphStore) -> list[tuple]:
    return sorted(graph.similarity_edges().iter_rows())


def add_in_steps(root, save: bool, fail_graph_write: bool = False):
    """60 chunks, then 20 more: each update's state and edges written as the asset (save=False) or the tests
    (save=True) do."""
    chunks, vectors, words = clustered_corpus(80, seed=11, doc_size=10, vocabulary=40)
    files = corpus_state.CorpusFiles(root / "corpus")
    with GraphStore.writer(root / f"g{GRAPH_SUFFIX}") as graph:
        load_chunk_nodes(graph, chunks)
        for n in (60, 80):
            result = knn_update.update_knn(files, chunks.head(n), vectors[:n], words, k=4, save=save)
            if fail_graph_write and n == 80:
                graph.add_similarity_edges = lambda edges: (_ for _ in ()).throw(RuntimeError("disk full"))
            knn_update.write_similarity_edges(files, graph, result)
        return files, result, similar(graph)


def test_the_state_saved_alongside_the_graph_write_is_the_same_as_saved_first(tmp_path):
    files_a, result_a, edges_a = add_in_steps(tmp_path / "alongside", save=False)
    files_b, result_b, edges_b = add_in_steps(tmp_path / "first", save=True)
    assert edges_a == edges_b and len(edges_a) == result_a.edges.height
    assert result_a.pending_save is None and result_a.generation  # saved, and the record names that save
    assert knn_state.synced_similar_generation(files_a) == result_a.generation
    saved_a, reason = knn_state.load_knn(files_a)
    saved_b, _ = knn_state.load_knn(files_b)
    assert reason == "" and saved_a.generation == result_a.generation and saved_a.edges_current
    assert saved_a.corpus.drop("ann_id").equals(saved_b.corpus.drop("ann_id"))
    for kind in ("semantic", "lexical"):
        assert (saved_a.lists[kind].neighbors == saved_b.lists[kind].neighbors).all()
    # the next update diffs against it, as after a save made first
    chunks, vectors, words = clustered_corpus(80, seed=11, doc_size=10, vocabulary=40)
    again = knn_update.update_knn(files_a, chunks.head(70), vectors[:70], words, k=4, save=False)
    assert again.edge_changes is not None and again.previous_generation == result_a.generation


def test_a_failed_graph_write_leaves_no_sync_record_and_the_next_update_writes_the_edges_whole(tmp_path):
    with pytest.raises(RuntimeError, match="disk full"):
        add_in_steps(tmp_path, save=False, fail_graph_write=True)
    files = corpus_state.CorpusFiles(tmp_path / "corpus")
    assert corpus_state.read_json(files.similar_synced).get("generation") is None and knn_state.synced_similar_generation(files) is None
    saved, reason = knn_state.load_knn(files)
    assert reason == ""  # the state of the failed update was still saved whole
    chunks, vectors, words = clustered_corpus(80, seed=11, doc_size=10, vocabulary=40)
    with GraphStore.writer(tmp_path / f"g{GRAPH_SUFFIX}") as graph:
        result = knn_update.update_knn(files, chunks, vectors, words, k=4, save=False)
        figures = knn_update.write_similarity_edges(files, graph, result)
        assert figures["similar_edges_rewritten"] is True
        assert similar(graph) == sorted(tuple(r) for r in result.edges.select(
            "src", "dst", "kind", "weight").iter_rows())
