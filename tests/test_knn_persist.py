"""The saved KNN state (format 3: lists as row positions, the lexical corpus as word ids) restores what a
build from scratch gives; a damaged, torn or foreign save is rebuilt with the reason said; a format-2
save is read once and saved as format 3."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from lexgraph.indexing import knn_state
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_update import edge_diff, update_knn
from lexgraph.indexing.knn import edge_changes, lexical_knn, semantic_knn


def corpus(n: int, dim: int = 16, seed: int = 5) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(8, dim))
    raw = centres[rng.integers(0, 8, n)] + 0.3 * rng.normal(size=(n, dim))
    vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    order = rng.permutation(n)  # chunks arrive in no particular id order, as from LanceDB
    chunks = pl.DataFrame({"chunk_id": [f"c{i:04d}" for i in order], "doc_id": [f"d{i // 5:03d}" for i in order]})
    words = chunks.select("chunk_id").with_columns(
        pl.Series("words", [sorted({f"w{j}" for j in rng.integers(0, 40, 6)}) for _ in range(n)]))
    return chunks, vectors, words


def sorted_edges(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("src", "dst", "kind")


def same_edges(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    return sorted_edges(a).equals(sorted_edges(b))


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_a_restored_state_updates_like_a_build_from_scratch(tmp_path, mode):
    chunks, vectors, words = corpus(300)
    files = CorpusFiles(tmp_path)
    update_knn(files, chunks.head(240), vectors[:240], words, k=5, mode=mode)
    assert json.loads(pq.read_table(files.knn_corpus).column("settings")[0].as_py())["format"] == knn_state.KNN_FORMAT
    assert set(pq.read_schema(files.knn_state).names) == set(knn_state.KNN_STATE_SCHEMA)
    # two documents gone, a kept chunk re-embedded, sixty chunks new
    keep = ~chunks["doc_id"].is_in(["d003", "d011"]).to_numpy()
    moved = vectors.copy()
    moved[7] = vectors[250]
    result = update_knn(files, chunks.filter(pl.Series(keep)), moved[keep], words, k=5, mode=mode)
    assert not result.rebuilt and result.rebuild_reason == "" and result.words_read == 61
    clean = update_knn(CorpusFiles(tmp_path / "clean"), chunks.filter(pl.Series(keep)), moved[keep], words, k=5,
                       mode=mode)
    if mode == "exact":  # exact updates equal a rebuild; approximate ones depend on the HNSW index's history
        assert same_edges(result.edges, clean.edges)
    # the edge changes computed from the lists equal a diff of the two saves' edge files
    removed, added, reweighted = result.edge_changes
    assert removed.height + added.height > 0
    assert result.isolated == 0
    # a later process loads what was saved: no list changes, the same edges
    again = update_knn(files, chunks.filter(pl.Series(keep)), moved[keep], words, k=5, mode=mode)
    assert not again.rebuilt and again.semantic.changed == 0 and again.lexical.changed == 0
    assert same_edges(again.edges, result.edges)
    assert all(part.height == 0 for part in again.edge_changes)
    if mode == "approx":
        assert again.ann_index == "loaded"


def test_lists_restored_from_positions_equal_the_graph_saved():
    chunks, vectors, words = corpus(150, seed=3)
    ids, word_lists = chunks["chunk_id"].to_list(), words["words"].to_list()
    semantic = semantic_knn(ids, vectors, k=4)
    lexical = lexical_knn(ids, word_lists, k=4, max_df=20)
    order = np.argsort(np.array(ids))
    restored = semantic_knn(list(np.array(ids)[order]), vectors[order], k=4, state=semantic.lists())
    restored_lexical = lexical_knn(lexical.chunk_ids, lexical.word_matrix(), k=4, max_df=20, state=lexical.lists())
    assert restored.state_frame().equals(semantic.state_frame())
    assert restored_lexical.state_frame().equals(lexical.state_frame())
    # and both keep updating like a rebuild
    more = [f"n{i:03d}" for i in range(10)]
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(10, vectors.shape[1]))
    extra = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    extra_words = [["w1", "w2", "w3"]] * 10
    restored.add(more, extra)
    restored_lexical.add(more, extra_words)
    assert restored.state_frame().equals(semantic_knn(ids + more, np.vstack([vectors, extra]), k=4).state_frame())
    assert restored_lexical.state_frame().equals(
        lexical_knn(ids + more, word_lists + extra_words, k=4, max_df=20).state_frame())


def test_edge_changes_equal_a_diff_of_the_edge_frames():
    rng = np.random.default_rng(3)
    for trial in range(12):
        n = int(rng.integers(20, 120))
        raw = rng.normal(size=(n, 8))
        vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
        ids = np.array([f"c{i:04d}" for i in rng.permutation(n)])
        words = [sorted({f"w{j}" for j in rng.integers(0, 30, 5)}) for _ in range(n)]
        k, split = int(rng.integers(1, 6)), int(rng.integers(1, n))
        for build, data in ((semantic_knn, vectors), (lexical_knn, words)):
            graph = build(list(ids[:split]), data[:split], k)
            lists = graph.lists()
            before = type(lists)(lists.chunk_ids.copy(), lists.neighbors.copy(), lists.sims.copy())
            before_edges = graph.edges()
            gone = list(rng.choice(ids[:split], size=int(rng.integers(0, split // 2 + 1)), replace=False))
            if gone:
                graph.remove(gone)
            graph.add(list(ids[split:]), data[split:])
            for got, expected in zip(edge_changes(before, graph), edge_diff(before_edges, graph.edges())):
                assert same_edges(got, expected), (trial, build.__name__)


def _save(tmp_path, mode="exact"):
    chunks, vectors, words = corpus(200, seed=9)
    files = CorpusFiles(tmp_path)
    update_knn(files, chunks.head(160), vectors[:160], words, k=4, mode=mode)
    return files, chunks, vectors, words


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, reason", [
    ("state_truncated", "knn_state.parquet unreadable"),
    ("corpus_garbage", "knn_corpus.parquet unreadable"),
    ("state_missing", "knn_state.parquet missing"),
    ("vocabulary_missing", "knn_vocabulary.parquet missing"),
    ("state_of_another_save", "different saves"),
    ("vocabulary_of_another_save", "knn_vocabulary.parquet is of another save"),
    ("other_k", "saved with k=4 mode=exact, now k=5 mode=exact"),
    ("neighbour_out_of_range", "saved state refused: the saved lists name positions outside"),
    ("neighbour_is_itself", "saved state refused: a saved list names its own chunk"),
    ("similarity_not_finite", "saved state refused: the saved similarities are not all finite"),
    ("unknown_format", "saved in format 99"),
])
def test_a_damaged_torn_or_foreign_state_is_rebuilt_with_the_reason(tmp_path, damage, reason):
    files, chunks, vectors, words = _save(tmp_path)
    older = {p.name: p.read_bytes() for p in files.root.glob("knn_*.parquet")}
    update_knn(files, chunks.head(180), vectors[:180], words, k=4)
    k = 4
    if damage == "state_truncated":
        _truncate(files.knn_state)
    elif damage == "corpus_garbage":
        files.knn_corpus.write_bytes(b"PAR1 not parquet at all" * 10)
    elif damage == "state_missing":
        files.knn_state.unlink()
    elif damage == "vocabulary_missing":
        files.knn_vocabulary.unlink()
    elif damage == "state_of_another_save":
        files.knn_state.write_bytes(older["knn_state.parquet"])
    elif damage == "vocabulary_of_another_save":
        files.knn_vocabulary.write_bytes(older["knn_vocabulary.parquet"])
    elif damage == "other_k":
        k = 5
    elif damage == "neighbour_out_of_range":
        table = pq.read_table(files.knn_state)
        frame = pl.from_arrow(table).with_columns(pl.col("semantic_neighbors").list.eval(pl.element() + 10_000))
        knn_state._write_table(files.knn_state, frame.to_arrow().replace_schema_metadata(table.schema.metadata))
    elif damage in ("neighbour_is_itself", "similarity_not_finite"):
        table = pq.read_table(files.knn_state)
        frame = pl.from_arrow(table).with_row_index("row")
        frame = (frame.with_columns(pl.concat_list(pl.col("row").cast(pl.Int32), pl.col("semantic_neighbors").list.slice(1))
                                    .alias("semantic_neighbors")) if damage == "neighbour_is_itself" else
                 frame.with_columns(pl.concat_list(pl.lit(float("nan")), pl.col("semantic_sims").list.slice(1))
                                    .alias("semantic_sims")))
        frame = frame.drop("row")
        knn_state._write_table(files.knn_state, frame.to_arrow().cast(table.schema).replace_schema_metadata(table.schema.metadata))
    elif damage == "unknown_format":
        table = pq.read_table(files.knn_corpus)
        frame = pl.from_arrow(table).with_columns(pl.lit(json.dumps({"k": 4, "mode": "exact", "format": 99})).alias("settings"))
        knn_state._write_table(files.knn_corpus, frame.to_arrow().replace_schema_metadata(table.schema.metadata))
    result = update_knn(files, chunks, vectors, words, k=k)
    assert result.rebuilt and reason in result.rebuild_reason, result.rebuild_reason
    assert result.edge_changes is None  # the graph's edges are then written whole
    clean = update_knn(CorpusFiles(tmp_path / "clean"), chunks, vectors, words, k=k)
    assert same_edges(result.edges, clean.edges)
    # the rebuilt state was saved whole: the next process loads it
    again = update_knn(files, chunks, vectors, words, k=k)
    assert not again.rebuilt and again.rebuild_reason == ""


def _as_format_2(files: CorpusFiles, words: pl.DataFrame) -> None:
    """Write the current save the way format 2 did: lists by chunk id, words as strings."""
    saved, _ = knn_state.load_knn(files)
    generation = saved.generation
    ids = saved.lists["semantic"].chunk_ids
    state = []
    for kind, lists in saved.lists.items():
        row, rank = np.nonzero(lists.neighbors >= 0)
        state.append(pl.DataFrame({"chunk_id": ids[row], "neighbor_id": ids[lists.neighbors[row, rank]],
                                   "kind": [kind] * len(row), "sim": lists.sims[row, rank],
                                   "rank": rank.astype(np.int32)}))
    settings = json.dumps({**saved.settings, "format": 2})
    corpus = saved.corpus.join(words, on="chunk_id", how="left").with_columns(pl.lit(settings).alias("settings"))
    for path, frame in ((files.knn_state, pl.concat(state)),
                        (files.knn_corpus, corpus.select("chunk_id", "doc_id", "vector_digest", "words", "ann_id",
                                                         "settings"))):
        table = frame.to_arrow()
        knn_state._write_table(path, table.replace_schema_metadata({knn_state.KNN_GENERATION: generation.encode()}))
    files.knn_vocabulary.unlink()


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_a_format_2_state_is_read_once_and_saved_as_format_3(tmp_path, mode):
    files, chunks, vectors, words = _save(tmp_path, mode)
    # the same save, kept in format 3
    update_knn(CorpusFiles(tmp_path / "reference"), chunks.head(160), vectors[:160], words, k=4, mode=mode)
    _as_format_2(files, words)
    result = update_knn(files, chunks, vectors, words, k=4, mode=mode)
    assert not result.rebuilt and result.semantic.added == 40 and result.words_read == 40
    assert result.edge_changes is not None  # the graph gets a diff, not a rewrite
    assert json.loads(pq.read_table(files.knn_corpus).column("settings")[0].as_py())["format"] == knn_state.KNN_FORMAT
    # the same as the update of a format-3 save of the same lists
    expected = update_knn(CorpusFiles(tmp_path / "reference"), chunks, vectors, words, k=4, mode=mode)
    assert same_edges(result.edges, expected.edges)
    if mode == "approx":
        assert result.ann_index == "loaded"


def test_resave_rewrites_a_format_2_state_unchanged_and_keeps_the_graph_in_sync(tmp_path):
    files, chunks, vectors, words = _save(tmp_path, "approx")
    before = sorted_edges(knn_state.read_edges(files).frame())
    saved, _ = knn_state.load_knn(files)
    knn_state.record_similar_synced(files, saved.generation)  # the graph holds this save's edges
    _as_format_2(files, words)
    message = knn_state.resave_knn(files)
    assert message.startswith("rewritten in format 3"), message
    assert sorted_edges(knn_state.read_edges(files).frame()).equals(before)
    migrated, reason = knn_state.load_knn(files)
    assert reason == "" and migrated.settings["format"] == knn_state.KNN_FORMAT
    assert knn_state.synced_similar_generation(files) == migrated.generation
    assert [p.name for p in files.root.glob("knn_hnsw.*.faiss")] == [files.ann_index(migrated.generation).name]
    assert knn_state.resave_knn(files) == "nothing rewritten: already in the current format"
    # and the next update starts from it with the saved HNSW index
    result = update_knn(files, chunks, vectors, words, k=4, mode="approx")
    assert not result.rebuilt and result.ann_index == "loaded" and result.edge_changes is not None
