"""Chunk KNN graphs: exact results against brute force, and incremental updates equal to rebuilds."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from lexgraph.indexing import knn, knn_vectors, knn_words
from lexgraph.indexing.knn import lexical_knn, semantic_knn


@pytest.fixture(params=["default_blocks", "tiny_blocks"])
def blocks(request, monkeypatch):
    """Run each test with tiles smaller than the corpus too, so block merging is exercised."""
    if request.param == "tiny_blocks":
        monkeypatch.setattr(knn_vectors, "_ROW_BLOCK", 37)
        monkeypatch.setattr(knn_vectors, "_COL_BLOCK", 53)
        monkeypatch.setattr(knn_words, "_WORD_ROW_BLOCK", 29)
        monkeypatch.setattr(knn_vectors, "_PAIR_BLOCK", 41)
    return request.param


def unit_vectors(rng: np.random.Generator, n: int, dim: int = 12, duplicates: int = 0) -> np.ndarray:
    raw = rng.normal(size=(n, dim))
    # Repeated rows give exactly equal similarities: ties that only the chunk id can break.
    for start in range(0, duplicates, 4):
        raw[start + 1 : start + 4] = raw[start]
    return (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)


def shuffled_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.array([f"chunk-{i:05d}" for i in rng.permutation(n)])


def word_lists(rng: np.random.Generator, n: int, vocabulary: int = 60) -> list[list[str]]:
    return [[f"w{j}" for j in rng.integers(0, vocabulary, rng.integers(0, 12))] for _ in range(n)]


def brute_force_semantic(ids: np.ndarray, vectors: np.ndarray, k: int) -> dict[str, list[str]]:
    sims = vectors.astype(np.float64) @ vectors.astype(np.float64).T
    result = {}
    for i, chunk in enumerate(ids):
        candidates = [j for j in range(len(ids)) if j != i and sims[i, j] > 0]
        ranked = sorted(candidates, key=lambda j: (-sims[i, j], ids[j]))
        result[chunk] = [ids[j] for j in ranked[:k]]
    return result


def brute_force_lexical(
    ids: np.ndarray, words: list[list[str]], k: int, max_df: int
) -> dict[str, list[tuple[str, float]]]:
    sets = [set(w) for w in words]
    df: dict[str, int] = {}
    for chunk_words in sets:
        for word in chunk_words:
            df[word] = df.get(word, 0) + 1
    kept = [{w for w in s if df[w] <= max_df} for s in sets]
    result = {}
    for i, chunk in enumerate(ids):
        scored = []
        for j in range(len(ids)):
            shared = len(kept[i] & kept[j])
            if j != i and shared:
                scored.append((-shared / np.sqrt(len(kept[i]) * len(kept[j])), ids[j]))
        result[chunk] = [(other, -score) for score, other in sorted(scored)[:k]]
    return result


def lists(frame: pl.DataFrame) -> dict[str, list[str]]:
    ordered = frame.sort("chunk_id", "rank").group_by("chunk_id", maintain_order=True).agg("neighbor_id")
    return dict(zip(ordered["chunk_id"].to_list(), ordered["neighbor_id"].to_list()))


def test_exact_semantic_matches_brute_force(blocks):
    rng = np.random.default_rng(1)
    ids, vectors = shuffled_ids(rng, 150), unit_vectors(rng, 150)
    frame = semantic_knn(ids, vectors, k=6).state_frame()
    expected = {chunk: found for chunk, found in brute_force_semantic(ids, vectors, 6).items() if found}
    assert lists(frame) == expected
    reference = vectors.astype(np.float64)
    position = {chunk: i for i, chunk in enumerate(ids)}
    for row in frame.iter_rows(named=True):
        exact = reference[position[row["chunk_id"]]] @ reference[position[row["neighbor_id"]]]
        assert row["sim"] == pytest.approx(exact, abs=1e-6)
    assert frame["rank"].max() == 5


def test_equal_similarities_go_to_the_smaller_chunk_id():
    vector = np.array([[1.0, 0.0]], dtype=np.float32)
    vectors = np.vstack([vector] * 4 + [np.array([[0.6, 0.8]], dtype=np.float32)])
    graph = semantic_knn(["d", "b", "a", "c", "e"], vectors, k=2)
    assert lists(graph.state_frame())["d"] == ["a", "b"]
    assert lists(graph.state_frame())["e"] == ["a", "b"]


def test_incremental_add_equals_rebuild(blocks):
    rng = np.random.default_rng(2)
    ids, vectors = shuffled_ids(rng, 400), unit_vectors(rng, 400, duplicates=60)
    rebuilt = semantic_knn(ids, vectors, k=5)
    graph = semantic_knn(ids[:150], vectors[:150], k=5)
    for start in range(150, 400, 31):
        update = graph.add(ids[start : start + 31], vectors[start : start + 31])
        assert update.added == len(ids[start : start + 31])
    assert graph.state_frame().equals(rebuilt.state_frame())
    assert graph.edges().equals(rebuilt.edges())


def test_incremental_remove_equals_rebuild(blocks):
    rng = np.random.default_rng(3)
    ids, vectors = shuffled_ids(rng, 400), unit_vectors(rng, 400, duplicates=40)
    graph = semantic_knn(ids, vectors, k=5)
    removed = ids[rng.choice(400, 90, replace=False)]
    update = graph.remove(removed[:45])
    graph.remove(removed[45:])
    keep = ~np.isin(ids, removed)
    rebuilt = semantic_knn(ids[keep], vectors[keep], k=5)
    assert update.removed == 45 and 0 < update.recomputed < 355
    assert graph.state_frame().equals(rebuilt.state_frame())
    assert graph.edges().equals(rebuilt.edges())


def test_mixed_add_and_remove_of_documents_equals_rebuild():
    rng = np.random.default_rng(4)
    ids, vectors = shuffled_ids(rng, 300), unit_vectors(rng, 300, duplicates=20)
    graph = semantic_knn(ids[:100], vectors[:100], k=4)
    present = set(ids[:100])
    for start in range(100, 300, 20):
        graph.add(ids[start : start + 20], vectors[start : start + 20])
        present |= set(ids[start : start + 20])
        gone = rng.choice(sorted(present), 7, replace=False)
        graph.remove(gone)
        present -= set(gone)
    keep = np.isin(ids, sorted(present))
    assert graph.state_frame().equals(semantic_knn(ids[keep], vectors[keep], k=4).state_frame())


def test_exact_lexical_matches_brute_force(blocks):
    rng = np.random.default_rng(5)
    ids, words = shuffled_ids(rng, 120), word_lists(rng, 120)
    frame = lexical_knn(ids, words, k=4, max_df=15).state_frame()
    expected = brute_force_lexical(ids, words, 4, 15)
    assert lists(frame) == {chunk: [o for o, _ in found] for chunk, found in expected.items() if found}
    sims = {(r["chunk_id"], r["neighbor_id"]): r["sim"] for r in frame.iter_rows(named=True)}
    assert all(sims[(chunk, other)] == sim for chunk, found in expected.items() for other, sim in found)


def test_lexical_ignores_words_over_the_document_frequency_cap():
    words = [["common", "alpha"], ["common", "beta"], ["common", "alpha"], ["common"]]
    frame = lexical_knn(["a", "b", "c", "d"], words, k=3, max_df=3).state_frame()
    assert lists(frame) == {"a": ["c"], "c": ["a"]}


def test_lexical_incremental_add_and_remove_equal_rebuild_across_cap_crossings(blocks):
    rng = np.random.default_rng(6)
    ids, words = shuffled_ids(rng, 300), word_lists(rng, 300)
    graph = lexical_knn(ids[:80], words[:80], k=4, max_df=12)
    crossed = 0
    for start in range(80, 300, 40):
        update = graph.add(ids[start : start + 40], words[start : start + 40])
        crossed += update.recomputed > update.added
    assert crossed, "the data must make some words cross max_df, or the test proves nothing"
    assert graph.state_frame().equals(lexical_knn(ids, words, k=4, max_df=12).state_frame())
    removed = set(ids[rng.choice(300, 120, replace=False)])
    graph.remove(sorted(removed))
    keep = [chunk not in removed for chunk in ids]
    rebuilt = lexical_knn(ids[keep], [w for w, kept in zip(words, keep) if kept], k=4, max_df=12)
    assert graph.state_frame().equals(rebuilt.state_frame())
    assert graph.edges().equals(rebuilt.edges())


def test_edges_are_undirected_and_keep_the_larger_direction():
    rng = np.random.default_rng(7)
    ids, vectors = shuffled_ids(rng, 80), unit_vectors(rng, 80)
    graph = semantic_knn(ids, vectors, k=3)
    state, edges = graph.state_frame(), graph.edges()
    assert edges.columns == ["src", "dst", "kind", "weight"]
    assert (edges["src"] < edges["dst"]).all() and edges.select("src", "dst").is_unique().all()
    directed = {
        (min(a, b), max(a, b)): s for a, b, s in zip(state["chunk_id"], state["neighbor_id"], state["sim"])
    }
    assert dict(zip(zip(edges["src"], edges["dst"]), edges["weight"])) == directed
    assert set(edges["kind"]) == {"semantic"}


def test_edge_weight_is_the_larger_of_two_unequal_directions():
    state = pl.DataFrame(
        {"chunk_id": ["a", "b"], "neighbor_id": ["b", "a"], "kind": ["lexical"] * 2, "sim": [0.5, 0.7], "rank": [0, 0]},
        schema=knn.STATE_SCHEMA,
    )
    graph = lexical_knn(["a", "b"], [["x"], ["x"]], k=2, state=state)
    assert graph.edges().rows() == [("a", "b", "lexical", 0.7)]


def test_state_round_trips_through_parquet_and_keeps_updating(tmp_path):
    rng = np.random.default_rng(8)
    ids, vectors, words = shuffled_ids(rng, 200), unit_vectors(rng, 200, duplicates=12), word_lists(rng, 200)
    semantic = semantic_knn(ids[:150], vectors[:150], k=5)
    lexical = lexical_knn(ids[:150], words[:150], k=5, max_df=20)
    path = tmp_path / "knn.parquet"
    pl.concat([semantic.state_frame(), lexical.state_frame()]).write_parquet(path)
    saved = pl.read_parquet(path)
    restored = semantic_knn(ids[:150], vectors[:150], k=5, state=saved)
    restored_lexical = lexical_knn(ids[:150], words[:150], k=5, max_df=20, state=saved)
    assert restored.state_frame().equals(semantic.state_frame())
    assert restored_lexical.state_frame().equals(lexical.state_frame())
    restored.add(ids[150:], vectors[150:])
    restored_lexical.add(ids[150:], words[150:])
    assert restored.state_frame().equals(semantic_knn(ids, vectors, k=5).state_frame())
    assert restored_lexical.state_frame().equals(lexical_knn(ids, words, k=5, max_df=20).state_frame())


def test_restoring_with_another_k_or_unknown_chunks_is_refused():
    rng = np.random.default_rng(9)
    ids, vectors = shuffled_ids(rng, 30), unit_vectors(rng, 30)
    saved = semantic_knn(ids, vectors, k=5).state_frame()
    with pytest.raises(ValueError, match="another k"):
        semantic_knn(ids, vectors, k=3, state=saved)
    with pytest.raises(ValueError, match="not in the corpus"):
        semantic_knn(ids[:20], vectors[:20], k=5, state=saved)


def test_invalid_input_is_refused_and_leaves_the_graph_unchanged():
    rng = np.random.default_rng(10)
    ids, vectors = shuffled_ids(rng, 20), unit_vectors(rng, 20)
    graph = semantic_knn(ids[:10], vectors[:10], k=3)
    before = graph.state_frame()
    with pytest.raises(ValueError, match="normalised"):
        graph.add(ids[10:], vectors[10:] * 2)
    with pytest.raises(ValueError, match="already in the graph"):
        graph.add(ids[:2], vectors[:2])
    with pytest.raises(ValueError, match="unknown chunk ids"):
        graph.remove(["nope"])
    with pytest.raises(ValueError, match="shape"):
        graph.add(ids[10:], vectors[10:, :5])
    assert graph.state_frame().equals(before)
    with pytest.raises(ValueError, match="k must be"):
        semantic_knn(ids, vectors, k=0)
    with pytest.raises(ValueError, match="mode"):
        semantic_knn(ids, vectors, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of words"):
        lexical_knn(["a"], ["one string"])


def test_approximate_mode_finds_nearly_all_exact_neighbours_and_updates():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(11)
    centres = unit_vectors(rng, 20, dim=32)
    raw = centres[rng.integers(0, 20, 600)] + 0.3 * rng.normal(size=(600, 32)).astype(np.float32)
    vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    ids = shuffled_ids(rng, 600)

    def recall(graph: knn.KnnGraph, keep: np.ndarray) -> float:
        exact = lists(semantic_knn(ids[keep], vectors[keep], k=5).state_frame())
        found = lists(graph.state_frame())
        return sum(len(set(exact[c]) & set(found.get(c, []))) for c in exact) / sum(map(len, exact.values()))

    graph = semantic_knn(ids[:500], vectors[:500], k=5, mode="approx")
    assert recall(graph, np.arange(600) < 500) > 0.9
    graph.add(ids[500:], vectors[500:])
    assert recall(graph, np.ones(600, dtype=bool)) > 0.9
    removed = ids[rng.choice(600, 200, replace=False)]
    graph.remove(removed[:30])  # a few dead vectors: filtered out of the HNSW results
    assert not set(graph.state_frame()["neighbor_id"]) & set(removed[:30])
    assert recall(graph, ~np.isin(ids, removed[:30])) > 0.9
    graph.remove(removed[30:])  # over a quarter of the index dead: it is rebuilt
    assert not set(graph.state_frame()["neighbor_id"]) & set(removed)
    assert recall(graph, ~np.isin(ids, removed)) > 0.9


def test_spread_moves_rows_in_place_or_copies_and_both_place_every_row_where_the_map_says():
    rng = np.random.default_rng(0)
    for old_to_new, total, in_place in ((np.array([0, 1, 3, 4, 7, 8, 9]), 11, True),  # rows only inserted
                                        (np.array([2, 3, 4]), 5, True),  # inserted at the front
                                        (np.array([0, 2, 1]), 4, False)):  # not increasing: copied
        rows = rng.integers(0, 1000, (len(old_to_new), 3)).astype(np.int32)
        owned = rows.copy()
        grown = knn_vectors._spread(owned, old_to_new, total)
        assert (grown is owned) == in_place and grown.shape == (total, 3)
        assert np.array_equal(grown[old_to_new], rows)
        # arrays another array may refer to, or not laid out row by row, are always copied
        view = np.zeros((len(old_to_new) + 2, 3), np.int32)[:len(old_to_new)]
        view[:] = rows
        for shared in (view, np.asfortranarray(rows)):
            grown = knn_vectors._spread(shared, old_to_new, total)
            assert grown is not shared and np.array_equal(grown[old_to_new], rows)
