"""Weighted PageRank against networkx on small hand-made graphs."""
from __future__ import annotations

import networkx as nx
import numpy as np
import polars as pl
import pytest

from lexgraph.indexing.pagerank import pagerank

EDGES = [("a", "b", 1.0), ("a", "c", 3.0), ("b", "c", 0.5), ("c", "d", 2.0), ("d", "e", 1.0), ("e", "a", 0.25)]


def reference(nodes: list[str], edges: list[tuple[str, str, float]], **options: float) -> np.ndarray:
    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    graph.add_weighted_edges_from(edges)
    scores = nx.pagerank(graph, weight="weight", tol=1e-13, max_iter=1000, **options)
    return np.array([scores[node] for node in nodes])


def run(nodes: list[str], edges: list[tuple[str, str, float]], **options: float) -> np.ndarray:
    src, dst, weight = zip(*edges)
    return pagerank(nodes, list(src), list(dst), list(weight), **options)


def test_weighted_graph_matches_networkx():
    nodes = ["e", "c", "a", "d", "b"]  # not sorted: the result follows this order
    scores = run(nodes, EDGES)
    np.testing.assert_allclose(scores, reference(nodes, EDGES), atol=1e-9)
    assert scores.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.argmax(scores) == nodes.index("c")


def test_isolated_node_and_other_damping_match_networkx():
    nodes = ["a", "b", "c", "d", "e", "lonely"]
    for damping in (0.85, 0.5):
        scores = run(nodes, EDGES, damping=damping)
        np.testing.assert_allclose(scores, reference(nodes, EDGES, alpha=damping), atol=1e-9)
        assert scores.sum() == pytest.approx(1.0, abs=1e-12)
        assert scores[-1] == pytest.approx(scores.min())


def test_unweighted_edges_and_integer_node_ids():
    nodes = [10, 20, 30, 40]
    scores = pagerank(nodes, [10, 10, 10], [20, 30, 40])
    expected = reference(nodes, [(10, 20, 1.0), (10, 30, 1.0), (10, 40, 1.0)])  # type: ignore[list-item]
    np.testing.assert_allclose(scores, expected, atol=1e-9)


def test_accepts_polars_columns_of_an_edge_frame():
    frame = pl.DataFrame(EDGES, schema=["src", "dst", "weight"], orient="row")
    nodes = pl.Series(["a", "b", "c", "d", "e"])
    scores = pagerank(nodes, frame["src"], frame["dst"], frame["weight"])
    np.testing.assert_allclose(scores, reference(nodes.to_list(), EDGES), atol=1e-9)


def test_repeated_edges_add_their_weights():
    split = run(["a", "b", "c"], [("a", "b", 1.0), ("a", "b", 2.0), ("b", "c", 1.0)])
    merged = run(["a", "b", "c"], [("a", "b", 3.0), ("b", "c", 1.0)])
    np.testing.assert_allclose(split, merged, atol=1e-12)


def test_graph_without_edges_is_uniform_and_empty_graph_is_empty():
    np.testing.assert_allclose(pagerank(["a", "b", "c", "d"], [], []), np.full(4, 0.25))
    assert pagerank([], [], []).shape == (0,)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown node"):
        pagerank(["a", "b"], ["a"], ["z"])
    with pytest.raises(ValueError, match="non-negative"):
        pagerank(["a", "b"], ["a"], ["b"], [-1.0])
    with pytest.raises(ValueError, match="unique"):
        pagerank(["a", "a"], [], [])
    with pytest.raises(ValueError, match="damping"):
        pagerank(["a"], [], [], damping=1.0)
    with pytest.raises(RuntimeError, match="converge"):
        run(["a", "b", "c", "d", "e"], EDGES, max_iter=3)
