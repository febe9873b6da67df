"""Corpus updates that reuse what they saved: the KNN state without a copy of the vectors, a persisted
HNSW index (refused and rebuilt when damaged or of another save), and words read only for new chunks."""
from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest

from lexgraph.indexing import knn_state
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_update import update_knn
from lexgraph.indexing.knn import lexical_knn, semantic_knn
from tests.helpers import clustered_corpus


def corpus(n: int, seed: int = 5) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    return clustered_corpus(n, seed, doc_size=5, vocabulary=40)


def sorted_edges(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("src", "dst", "kind")


def test_the_knn_state_keeps_no_vectors_and_an_update_equals_a_rebuild(tmp_path):
    chunks, vectors, words = corpus(120)
    files = CorpusFiles(tmp_path)
    update_knn(files, chunks.head(90), vectors[:90], words, k=4)
    assert "vector" not in pl.read_parquet(files.knn_corpus).columns
    # remove two documents and add the rest; the saved lists are reused with the vectors given now
    keep = ~chunks["doc_id"].is_in(["d001", "d007"])
    asked: list[int] = []

    def words_of(wanted: pl.DataFrame) -> pl.DataFrame:
        asked.append(wanted.height)
        return wanted.join(words, on="chunk_id")

    result = update_knn(files, chunks.filter(keep), vectors[keep.to_numpy()], words_of, k=4)
    clean = update_knn(CorpusFiles(tmp_path / "clean"), chunks.filter(keep), vectors[keep.to_numpy()], words, k=4)
    assert not result.rebuilt and result.semantic.removed == 10 and result.semantic.added == 30
    assert asked == [30] and result.words_read == 30  # only the new chunks' words were read
    assert sorted_edges(result.edges).equals(sorted_edges(clean.edges))


def test_a_kept_chunk_whose_vector_changed_is_searched_again(tmp_path):
    chunks, vectors, words = corpus(60)
    files = CorpusFiles(tmp_path)
    update_knn(files, chunks, vectors, words, k=4)
    moved = vectors.copy()
    moved[[3, 17]] = vectors[[40, 41]]  # re-embedded with another model, say
    result = update_knn(files, chunks, moved, words, k=4)
    clean = update_knn(CorpusFiles(tmp_path / "clean"), chunks, moved, words, k=4)
    assert result.semantic.removed == 2 and result.semantic.added == 2
    assert sorted_edges(result.edges).equals(sorted_edges(clean.edges))


def approx_graph(chunks, vectors, words, files):
    return update_knn(files, chunks, vectors, words, k=5, mode="approx")


def test_the_hnsw_index_is_saved_and_loaded_instead_of_rebuilt(tmp_path):
    chunks, vectors, words = corpus(400)
    files = CorpusFiles(tmp_path)
    first = approx_graph(chunks.head(300), vectors[:300], words, files)
    assert first.ann_index.startswith("rebuilt")
    saved = list(tmp_path.glob("corpus/knn_hnsw.*.faiss"))
    assert [p.name for p in saved] == [files.ann_index(first.generation).name]
    keep = ~chunks["doc_id"].is_in(["d002"])
    second = approx_graph(chunks.filter(keep), vectors[keep.to_numpy()], words, files)
    assert second.ann_index == "loaded" and second.semantic.added == 100 and second.semantic.removed == 5
    # one index file, of the new save
    assert [p.name for p in tmp_path.glob("corpus/knn_hnsw.*.faiss")] == [files.ann_index(second.generation).name]
    # the same lists as the same update of the graph kept in memory, index and all
    ids = chunks["chunk_id"].to_list()
    in_memory = semantic_knn(ids[:300], vectors[:300], k=5, mode="approx")
    in_memory.remove([c for c, d in zip(ids, chunks["doc_id"]) if d == "d002"])
    in_memory.add(ids[300:], vectors[300:])
    assert sorted_edges(second.edges.filter(pl.col("kind") == "semantic")).equals(sorted_edges(in_memory.edges()))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other_generation", "missing"])
def test_a_damaged_or_foreign_hnsw_file_is_rebuilt_and_says_why(tmp_path, damage):
    chunks, vectors, words = corpus(300, seed=9)
    files = CorpusFiles(tmp_path)
    older = approx_graph(chunks.head(200), vectors[:200], words, files)
    kept_old = tmp_path / "older.faiss"
    shutil.copy(files.ann_index(older.generation), kept_old)
    latest = approx_graph(chunks.head(250), vectors[:250], words, files)
    path = files.ann_index(latest.generation)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a faiss index" * 100)
    elif damage == "other_generation":  # an index of the previous save under the current name
        shutil.copy(kept_old, path)
    else:
        path.unlink()
    half_written = path.with_name("knn_hnsw.killed-midway.tmp")
    half_written.write_bytes(b"\x00" * 10)
    result = approx_graph(chunks, vectors, words, files)
    assert not half_written.exists()
    expected = {"truncated": "unreadable", "garbage": "unreadable", "other_generation": "refused",
                "missing": "no saved index"}[damage]
    assert result.ann_index.startswith("rebuilt") and expected in result.ann_index, result.ann_index
    # the rebuilt index was saved and the next process loads it
    again = approx_graph(chunks, vectors, words, files)
    assert again.ann_index == "loaded" and again.semantic.added == 0


def test_an_index_holding_other_vectors_at_the_saved_positions_is_refused():
    rng = np.random.default_rng(2)
    raw = rng.normal(size=(80, 8))
    vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    ids = [f"c{i:03d}" for i in range(80)]
    graph = semantic_knn(ids, vectors, k=3, mode="approx")
    index, faiss_ids = graph.ann_index()
    state = graph.state_frame()
    reordered = semantic_knn(ids, vectors, k=3, mode="approx", state=state, ann_index=(index, faiss_ids[::-1].copy()))
    assert reordered.ann_status.startswith("rebuilt: saved index refused")
    loaded = semantic_knn(ids, vectors, k=3, mode="approx", state=state, ann_index=(index, faiss_ids))
    assert loaded.ann_status == "loaded" and loaded.state_frame().equals(state)
    # a lexical graph or an exact one has no ANN index
    assert lexical_knn(ids, [["a"]] * 80, k=3).ann_index() is None and semantic_knn(ids, vectors, k=3).ann_status == "exact"


def test_a_knn_state_of_the_older_format_or_with_its_edges_torn_off_is_not_trusted(tmp_path):
    chunks, vectors, words = corpus(40)
    files = CorpusFiles(tmp_path)
    update_knn(files, chunks, vectors, words, k=3)
    # an older save: the vector column and no digests
    old = pl.read_parquet(files.knn_corpus).drop("vector_digest")
    table = old.to_arrow()
    knn_state._write_table(files.knn_corpus, table.replace_schema_metadata(
        {knn_state.KNN_GENERATION: knn_state._generation(files.knn_state).encode()}))
    assert update_knn(files, chunks, vectors, words, k=3).rebuilt
    # edges of another save: the lists are reused, but no diff is offered against those edges
    stale_edges = files.edges.read_bytes()
    update_knn(files, chunks.head(30), vectors[:30], words, k=3)
    files.edges.write_bytes(stale_edges)
    result = update_knn(files, chunks, vectors, words, k=3)
    assert not result.rebuilt and result.edge_changes is None
