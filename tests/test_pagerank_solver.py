"""The PageRank solver (conjugate gradients finished by power iteration) against plain power iteration, and
the Polars skeleton selection and diff against plain Python sorts and sets."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from lexgraph.indexing.pagerank import pagerank
from lexgraph.indexing.skeleton import (DEFAULT_BETA, frame_selection_diff, select_skeleton, selection_diff, skeleton_mask,
                                     skeleton_size)


def random_graph(n: int, k: int = 6, seed: int = 0, isolated: int = 3) -> tuple[list[str], pl.DataFrame]:
    """Chunk-like ids and k random weighted edges per node (some repeated, a self-loop), the last
    `isolated` nodes without edges (dangling)."""
    rng = np.random.default_rng(seed)
    ids = [f"doc-{i // 20:04d}-c{i % 20:03d}" for i in range(n)]
    linked = n - isolated
    src = np.repeat(np.arange(linked), k)
    dst = rng.integers(0, linked, size=src.size)
    dst[0] = src[0]  # a self-loop
    weight = rng.uniform(0.05, 1.0, size=src.size)
    edges = pl.DataFrame({"src": [ids[i] for i in src], "dst": [ids[j] for j in dst], "weight": weight})
    return ids, edges


def power_iteration(ids: list[str], edges: pl.DataFrame, damping: float = 0.85, tol: float = 1e-10) -> np.ndarray:
    """The plain power iteration from uniform that pagerank used before (the reference)."""
    position = {node: i for i, node in enumerate(ids)}
    n = len(ids)
    matrix = np.zeros((n, n))
    for s, d, w in edges.iter_rows():
        matrix[position[s], position[d]] += w
        if s != d:
            matrix[position[d], position[s]] += w
    strength = matrix.sum(axis=1)
    dangling = strength == 0
    inverse = np.divide(1.0, strength, out=np.zeros(n), where=~dangling)
    scores = np.full(n, 1.0 / n)
    while True:
        updated = damping * (matrix @ (scores * inverse) + scores[dangling].sum() / n) + (1 - damping) / n
        change = np.abs(updated - scores).sum()
        scores = updated
        if change < tol:
            return scores / scores.sum()


def top(ids: list[str], scores: np.ndarray) -> set[str]:
    return set(select_skeleton(np.array(ids), scores, DEFAULT_BETA).tolist())


def test_solver_matches_plain_power_iteration():
    ids, edges = random_graph(400)
    scores = pagerank(ids, edges["src"], edges["dst"], edges["weight"])
    expected = power_iteration(ids, edges)
    assert np.abs(scores - expected).max() < 1e-12
    assert scores.sum() == pytest.approx(1.0, abs=1e-12) and scores.min() > 0
    assert top(ids, scores) == top(ids, expected)
    for damping in (0.0, 0.5):
        np.testing.assert_allclose(pagerank(ids, edges["src"], edges["dst"], edges["weight"], damping=damping),
                                   power_iteration(ids, edges, damping), rtol=0, atol=1e-12)


def test_the_selection_and_its_diff_match_plain_python_sorts_and_sets():
    rng = np.random.default_rng(3)
    ids = np.array([f"c{i:05d}é" if i % 7 else f"C{i:05d}" for i in rng.permutation(3000)])
    scores = rng.integers(0, 50, size=ids.size) / 50.0  # many ties: broken by the smaller id
    for beta in (0.0, 0.29, DEFAULT_BETA, 1.0):
        expected = sorted(zip(ids.tolist(), scores.tolist()), key=lambda pair: (-pair[1], pair[0]))
        expected = [chunk for chunk, _ in expected[:skeleton_size(ids.size, beta)]]
        assert select_skeleton(ids, scores, beta).tolist() == expected
        mask = skeleton_mask(pl.Series(ids), pl.Series(scores), beta)
        assert set(ids[mask].tolist()) == set(expected)
    docs = {chunk: chunk[:3] for chunk in ids[:2500].tolist()}  # the other chunks' documents are gone
    previous, current = ids[rng.random(ids.size) < 0.8].tolist(), ids[rng.random(ids.size) < 0.8].tolist()
    entered, left = sorted(set(current) - set(previous)), sorted(set(previous) - set(current))
    found = selection_diff(previous, current, docs)
    assert (found.newly_selected, found.deselected) == (tuple(entered), tuple(left))
    assert found.documents == tuple(sorted({docs[c] for c in entered + left if c in docs}))
    assert frame_selection_diff(pl.Series(previous), pl.Series(current),
                                pl.DataFrame({"chunk_id": list(docs), "doc_id": list(docs.values())})) == found
    with pytest.raises(ValueError, match="unique"):
        skeleton_mask(pl.Series(["a", "a"]), pl.Series([1.0, 2.0]))
