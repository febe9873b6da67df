"""Ranking primitives of the KNN graphs: each row's best k candidates, in a deterministic order."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

Triples = tuple[np.ndarray, np.ndarray, np.ndarray]  # row positions, neighbour positions, similarities


def top_k(rows: np.ndarray, cols: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Best k candidates per row with positive similarity, as (rows, cols, sims, ranks).

    Higher similarity first, then the smaller position; positions follow chunk-id order, so
    equal similarities go to the smaller chunk id.
    """
    keep = sims > 0
    rows, cols, sims = rows[keep], cols[keep], sims[keep]
    if len(rows) > _FEW_CANDIDATES:
        rows, cols, sims = _contenders(rows, cols, sims, k)
    order = np.lexsort((cols, -sims, rows))
    rows, cols, sims = rows[order], cols[order], sims[order]
    rank = _rank_in_row(rows)
    chosen = rank < k
    return rows[chosen], cols[chosen], sims[chosen], rank[chosen]


def _rank_in_row(rows: np.ndarray) -> np.ndarray:
    """Each entry's place (0, 1, …) among the entries of its row; rows grouped, in order."""
    index = np.arange(len(rows))
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    return index - np.maximum.accumulate(np.where(first, index, 0))


# Above this many candidates, top_k first drops those that cannot make their row's top k (one sort of one
# key instead of a three-key lexsort of them all: the lexical search of 5,700 lists took 0.5 s ranking).
_FEW_CANDIDATES = 8192


def _contenders(rows: np.ndarray, cols: np.ndarray, sims: np.ndarray, k: int) -> Triples:
    """The candidates whose similarity reaches their row's k-th best, less a margin: a superset of each
    row's top k, ties included. Sorted by one float key, row first then similarity descending; the
    key's rounding can misorder only similarities closer than the margin, which keeps them all."""
    key = rows * 2.0 + (1.0 - sims)
    margin = 4 * np.spacing(2.0 * float(rows.max()) + 2.0)
    order = np.argsort(key)
    rows, cols, sims = rows[order], cols[order], sims[order]
    at_k = _rank_in_row(rows) == k - 1  # each row's k-th best (rows with fewer keep every candidate)
    floor = np.full(int(rows.max()) + 1, -np.inf)
    floor[rows[at_k]] = sims[at_k] - margin
    keep = sims >= floor[rows]
    return rows[keep], cols[keep], sims[keep]


def concat_triples(parts: Sequence[Triples]) -> Triples:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore[return-value]


def blocks(positions: np.ndarray, size: int) -> Iterable[np.ndarray]:
    for start in range(0, len(positions), size):
        yield positions[start : start + size]
