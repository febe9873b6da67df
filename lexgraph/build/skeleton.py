"""β-skeleton selection: the top ⌊β·n⌋ chunks by PageRank, and its diff against the last one.

Why: KET-RAG runs LLM extraction only on the skeleton; the diff says which chunks newly need
extraction and which documents must be re-extracted, so nothing else pays again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Iterable, Mapping

import numpy as np
import numpy.typing as npt

DEFAULT_BETA = 0.8
# β·n is computed in floating point: 0.29 * 100 is 28.999999999999996, which must count as 29.
_FLOOR_SLACK = 1e-9


def skeleton_size(n: int, beta: float) -> int:
    """⌊β·n⌋, after checking that β is a number in [0, 1]."""
    if isinstance(beta, bool) or not isinstance(beta, Real) or not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
    return min(n, math.floor(float(beta) * n + _FLOOR_SLACK))


def select_skeleton(chunk_ids: npt.ArrayLike, scores: npt.ArrayLike, beta: float = DEFAULT_BETA) -> np.ndarray:
    """Ids of the top ⌊β·n⌋ chunks, highest score first; equal scores go to the smaller chunk id."""
    ids = np.asarray(chunk_ids)
    values = np.asarray(scores, dtype=np.float64)
    if ids.shape != values.shape or ids.ndim != 1:
        raise ValueError("chunk_ids and scores must be 1-d and of equal length")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("chunk ids must be unique")
    size = skeleton_size(len(ids), beta)
    order = np.lexsort((ids, -values))
    return ids[order[:size]]


@dataclass(frozen=True)
class SelectionDiff:
    """What changed between two skeleton selections, and the documents that must be re-extracted."""

    newly_selected: tuple[str, ...]
    deselected: tuple[str, ...]
    documents: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly form, for run metadata."""
        return {
            "newly_selected": list(self.newly_selected),
            "deselected": list(self.deselected),
            "documents": list(self.documents),
            "newly_selected_count": len(self.newly_selected),
            "deselected_count": len(self.deselected),
            "document_count": len(self.documents),
        }


def selection_diff(
    previous: Iterable[str], current: Iterable[str], chunk_to_doc: Mapping[str, str]
) -> SelectionDiff:
    """Chunks that entered and left the selection, and the documents they belong to.

    A changed chunk missing from ``chunk_to_doc`` (its document was removed) is still listed as
    selected or deselected but names no document: there is nothing left to re-extract.
    """
    before, after = {str(chunk) for chunk in previous}, {str(chunk) for chunk in current}
    entered = tuple(sorted(after - before))
    left = tuple(sorted(before - after))
    documents = {chunk_to_doc[chunk] for chunk in entered + left if chunk in chunk_to_doc}
    return SelectionDiff(entered, left, tuple(sorted(documents)))
