"""Channel scores as rankings, and their fusion: each channel gives a score per chunk (-inf where it retrieved
nothing); fusion sums weighted shares of each channel's best ranks (reciprocal rank fusion) or scores (score
fusion). The in-memory retriever fuses arrays of every chunk, the lance backend its channels' few hundred hits."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def spread(size: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A channel's few hits as a score per chunk (-inf for the others)."""
    scores = np.full(size, -np.inf)
    scores[rows] = values
    return scores


def ranks_of(scores: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk rows, 1-based ranks) of the best `depth` retrieved chunks, best first."""
    finite = np.flatnonzero(np.isfinite(scores))
    if not len(finite):
        return finite, finite
    depth = min(depth, len(finite))
    best = finite[np.argpartition(-scores[finite], depth - 1)[:depth]]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best, np.arange(1, len(best) + 1)


def rank_shares(count: int, weight: float, k: float) -> np.ndarray:
    """What a channel's `count` best hits (best first) add to reciprocal rank fusion: weight / (k + rank)."""
    return weight / (k + np.arange(1, count + 1))


def score_shares(scores: np.ndarray, weight: float) -> np.ndarray:
    """What a channel's best hits (their scores, best first) add to score fusion: weight × their place between
    the last (0) and the first (1), plus a floor share so that the last still counts."""
    first, floor = scores[0], scores[-1]
    span = first - floor if first > floor else 1.0
    return weight * (scores - floor) / span + weight * 1e-6


def reciprocal_rank_fusion(rankings: Sequence[tuple[np.ndarray, float]], size: int, k: float, depth: int) -> np.ndarray:
    """Σ weight / (k + rank) over channels: robust to channels whose scores are on other scales."""
    fused = np.zeros(size)
    for scores, weight in rankings:
        rows, _ = ranks_of(scores, depth)
        fused[rows] += rank_shares(len(rows), weight, k)
    fused[fused == 0] = -np.inf
    return fused


def score_fusion(rankings: Sequence[tuple[np.ndarray, float]], size: int, depth: int) -> np.ndarray:
    """Σ weight · score/max(score) over each channel's top `depth`: keeps how much better a
    channel's first hit is than its tenth, which rank fusion throws away."""
    fused = np.zeros(size)
    for scores, weight in rankings:
        rows, _ = ranks_of(scores, depth)
        if len(rows):
            fused[rows] += score_shares(scores[rows], weight)
    fused[fused == 0] = -np.inf
    return fused
