"""The best k candidates per row are the same whether or not those that cannot make a row's top k are
dropped first (as top_k does above _FEW_CANDIDATES): ties and order included."""
from __future__ import annotations

import numpy as np

from lexgraph.indexing import knn_top_k


def reference_top_k(rows, cols, sims, k):
    keep = sims > 0
    rows, cols, sims = rows[keep], cols[keep], sims[keep]
    order = np.lexsort((cols, -sims, rows))
    rows, cols, sims = rows[order], cols[order], sims[order]
    rank = np.zeros(len(rows), dtype=np.int64)
    for i in range(1, len(rows)):
        rank[i] = rank[i - 1] + 1 if rows[i] == rows[i - 1] else 0
    chosen = rank < k
    return rows[chosen], cols[chosen], sims[chosen], rank[chosen]


def test_dropping_hopeless_candidates_first_changes_no_top_k():
    rng = np.random.default_rng(11)
    for _ in range(20):
        size = int(rng.integers(knn_top_k._FEW_CANDIDATES + 1, 4 * knn_top_k._FEW_CANDIDATES))
        owners = rng.integers(0, 200_000, int(rng.integers(1, 400)))
        rows = owners[rng.integers(0, len(owners), size)]
        cols = rng.integers(0, 200_000, size)
        # shared-word style similarities: few distinct values, so many ties at each row's k-th place
        sims = rng.integers(-1, 6, size) / np.sqrt(rng.integers(1, 30, size) * 7.0)
        k = int(rng.integers(1, 25))
        got = knn_top_k.top_k(rows, cols, sims, k)
        want = reference_top_k(rows, cols, sims, k)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
