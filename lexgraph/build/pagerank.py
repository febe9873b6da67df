"""Weighted PageRank on an undirected graph given as edge arrays, by sparse power iteration.

Why: KET-RAG spends LLM calls only on the most central chunks of the chunk KNN graph; one
iteration is one sparse matrix-vector product, so each costs time linear in the edges.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl
import scipy.sparse as sp

DEFAULT_DAMPING = 0.85


def _positions(node_ids: pl.Series, values: npt.ArrayLike | pl.Series) -> np.ndarray:
    """Index of each value in ``node_ids``; unknown values raise ValueError.

    A hash join, not a sort of strings: mapping a million edge ends to ids stays well under a second.
    """
    given = pl.Series("id", values)
    wanted = given.cast(node_ids.dtype, strict=False)
    nodes = pl.DataFrame({"id": node_ids, "position": np.arange(len(node_ids), dtype=np.int64)})
    found = pl.DataFrame({"id": wanted}).join(nodes, on="id", how="left", maintain_order="left")["position"]
    if found.null_count():
        unknown = given.filter(found.is_null()).head(5).to_list()
        raise ValueError(f"unknown node id(s): {unknown}")
    return found.to_numpy().astype(np.int64)


def pagerank(
    node_ids: npt.ArrayLike | pl.Series,
    src: npt.ArrayLike | pl.Series,
    dst: npt.ArrayLike | pl.Series,
    weight: npt.ArrayLike | pl.Series | None = None,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> np.ndarray:
    """PageRank score of every node, aligned with ``node_ids``; the scores sum to 1.

    Each edge (src, dst, weight) is undirected: a walker at a node moves to a neighbour with
    probability proportional to the edge weight. Repeated edges add their weights; a self-loop
    counts once. Nodes without edges (dangling) send their mass to all nodes uniformly, as does
    the teleport step. Iterates until the L1 change is below ``tol``; raises RuntimeError if that
    takes more than ``max_iter`` iterations.
    """
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    nodes = pl.Series("id", node_ids)
    if nodes.is_duplicated().any():
        raise ValueError("node ids must be unique")
    n = len(nodes)
    rows = _positions(nodes, src)
    cols = _positions(nodes, dst)
    if len(rows) != len(cols):
        raise ValueError("src and dst must have the same length")
    weights = np.ones(len(rows)) if weight is None else np.asarray(weight, dtype=np.float64)
    if weights.shape != rows.shape:
        raise ValueError("weight must have one value per edge")
    if not bool(np.all(np.isfinite(weights))) or bool(np.any(weights < 0)):
        raise ValueError("edge weights must be finite and non-negative")
    if n == 0:
        return np.zeros(0)

    loop = rows == cols
    both_ways = sp.coo_matrix(
        (
            np.concatenate([weights, weights[~loop]]),
            (np.concatenate([rows, cols[~loop]]), np.concatenate([cols, rows[~loop]])),
        ),
        shape=(n, n),
    ).tocsr()
    strength = np.asarray(both_ways.sum(axis=1)).ravel()
    dangling = strength == 0
    inverse_strength = np.divide(1.0, strength, out=np.zeros(n), where=~dangling)

    scores = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        # The matrix is symmetric, so multiplying by it is multiplying by its transpose.
        spread = both_ways @ (scores * inverse_strength) + scores[dangling].sum() / n
        updated = damping * spread + (1.0 - damping) / n
        change = float(np.abs(updated - scores).sum())
        scores = updated
        if change < tol:
            return scores / scores.sum()
    raise RuntimeError(f"PageRank did not converge to tol={tol} within {max_iter} iterations")
