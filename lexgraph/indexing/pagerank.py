"""Weighted PageRank on an undirected graph given as edge arrays, by conjugate gradients finished by power iteration.

Why: KET-RAG spends LLM calls only on the most central chunks of the chunk KNN graph; one
iteration is one sparse matrix-vector product, so each costs time linear in the edges.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl
import scipy.sparse as sp

DEFAULT_DAMPING = 0.85


def positions_of(node_ids: pl.Series, values: npt.ArrayLike | pl.Series) -> np.ndarray:
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
    the teleport step. The result is a power-iteration step whose L1 change is below ``tol`` (the
    steps before it are conjugate gradients, see :func:`_solve`); raises RuntimeError if that takes
    more than ``max_iter`` iterations.
    """
    nodes = pl.Series("id", node_ids)
    if nodes.is_duplicated().any():
        raise ValueError("node ids must be unique")
    return pagerank_of_positions(len(nodes), positions_of(nodes, src), positions_of(nodes, dst), weight,
                                 damping=damping, tol=tol, max_iter=max_iter)


def pagerank_of_positions(
    n: int,
    rows: np.ndarray,
    cols: np.ndarray,
    weight: npt.ArrayLike | None = None,
    *,
    damping: float = DEFAULT_DAMPING,
    tol: float = 1e-10,
    max_iter: int = 1000,
) -> np.ndarray:
    """:func:`pagerank` of nodes 0..n-1 with edges given as their positions (no ids to look up)."""
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    if len(rows) != len(cols):
        raise ValueError("src and dst must have the same length")
    if len(rows) and (min(int(rows.min()), int(cols.min())) < 0 or max(int(rows.max()), int(cols.max())) >= n):
        raise ValueError(f"edge ends must be positions of the {n} nodes")
    weights = np.ones(len(rows)) if weight is None else np.asarray(weight, dtype=np.float64)
    if weights.shape != rows.shape:
        raise ValueError("weight must have one value per edge")
    if not bool(np.all(np.isfinite(weights))) or bool(np.any(weights < 0)):
        raise ValueError("edge weights must be finite and non-negative")
    if n == 0:
        return np.zeros(0)
    # Each edge once, as given (a self-loop at half weight: the walk below adds the matrix and its transpose).
    # Products need neither sorted columns nor merged repeats: rows grouped by a stable argsort are the
    # whole CSR build, a third of scipy's from (rows, cols), which sorts and merges.
    half = np.where(rows == cols, weights / 2, weights)
    order = np.argsort(rows, kind="stable")
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=starts[1:])
    one_way = sp.csr_matrix((half[order], cols[order], starts), shape=(n, n))
    return _solve(one_way, damping, tol, max_iter)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """a·b without BLAS: a threaded BLAS dot product waits for its helper thread, which on a busy machine
    cost more than the matrix products (at 100k chunks the solve took 0.13-0.9 s with `@`, 0.11-0.13 s with
    this; docs/perf/pagerank_selection.md)."""
    return float(np.einsum("i,i->", a, b))


def _solve(one_way: sp.csr_matrix, damping: float, tol: float, max_iter: int) -> np.ndarray:
    """Conjugate gradients on the symmetrised linear system, then power iteration from its answer until one
    step changes the scores by less than ``tol`` (in L1), the stopping rule of plain power iteration.

    With W = A + Aᵀ the weights, D their row sums and c the (scalar) share every node receives by teleport
    and from dangling nodes, the scores solve x = d·W·D⁻¹·x + c·1. So x ∝ z with (I - d·W·D⁻¹)·z = 1, and
    z = D^½·y with (I - d·D^-½·W·D^-½)·y = D^-½·1: a symmetric positive-definite system (eigenvalues in
    [1-d, 1+d]), which conjugate gradients solve in about a third of power iteration's steps.
    """
    n = one_way.shape[0]
    walk = one_way.T  # a transposed view, not a copy

    def spread(vector: np.ndarray) -> np.ndarray:  # W·vector
        return one_way @ vector + walk @ vector

    strength = np.asarray(one_way.sum(axis=1)).ravel() + np.asarray(one_way.sum(axis=0)).ravel()
    dangling = strength == 0
    inverse_strength = np.divide(1.0, strength, out=np.zeros(n), where=~dangling)

    def share(scores: np.ndarray) -> float:  # c for scores summing to 1
        return ((1.0 - damping) + damping * float(scores[dangling].sum())) / n

    def step(scores: np.ndarray) -> np.ndarray:  # one power-iteration step
        return damping * spread(scores * inverse_strength) + share(scores)

    root = np.sqrt(np.where(dangling, 1.0, strength))
    inverse_root = 1.0 / root
    scaled = np.empty(n)

    def system(y: np.ndarray, out: np.ndarray) -> np.ndarray:  # out = (I - d·D^-½·W·D^-½)·y
        np.multiply(inverse_root, y, out=scaled)
        walked = spread(scaled)
        walked *= inverse_root
        walked *= damping
        return np.subtract(y, walked, out=out)

    # The loop below works in place: no temporary array per vector operation.
    scores = np.full(n, 1.0 / n)
    y = inverse_root * scores / share(scores)
    residual = inverse_root - system(y, np.empty(n))
    direction = residual.copy()
    product, lifted = np.empty(n), np.empty(n)
    squared = _dot(residual, residual)
    # One power step from x = z/sum(z) would change it by Σ|c - (1 - ρ)/sum(z)| with ρ = D^½·residual, which
    # is at most 2·‖ρ‖₁/sum(z) (its terms sum to 0): two passes over n, not the half dozen of the sum itself.
    iterations = 0
    while iterations < max_iter and squared > 0:
        system(direction, product)
        alpha = squared / _dot(direction, product)  # > 0: the system is positive definite, direction ≠ 0
        np.multiply(direction, alpha, out=lifted)
        y += lifted
        np.multiply(product, alpha, out=lifted)
        residual -= lifted
        iterations += 1
        previous, squared = squared, _dot(residual, residual)
        np.multiply(root, residual, out=lifted)
        if 2.0 * float(np.abs(lifted, out=lifted).sum()) < tol / 2 * _dot(root, y):
            break
        direction *= squared / previous
        direction += residual
    z = root * y
    scores = z / z.sum()
    for _ in range(max_iter - iterations):
        updated = step(scores)
        change = float(np.abs(updated - scores).sum())
        scores = updated
        if change < tol:
            return scores / scores.sum()
    raise RuntimeError(f"PageRank did not converge to tol={tol} within {max_iter} iterations")
