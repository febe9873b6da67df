"""One token budget filled from several retrieval channels (KET-RAG's θ split), de-duplicated, ordered.

Each channel ranks chunks; the builder gives every channel its share of the budget (θ), fills that
share with the channel's best chunks not already taken, then spends what is left on the fused
ranking. Every evidence item keeps the ids that lead back to its source (chunk, document, source
path, span) and the channel and score that put it there, so an answer's citations and an auditor's
provenance are read straight from it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from lexgraph.query.fusion import ranks_of
from lexgraph.query.retrieval_types import RetrievalIndex

# A chunk counts its own tokens; a context never holds more than this many evidence items.
MAX_ITEMS = 400


@dataclass(frozen=True)
class Evidence:
    """One chunk in a context: what a citation and an audit need to find the passage again."""

    id: str  # the chunk id: what an answer cites
    doc_id: str
    source_path: str
    char_start: int
    char_end: int
    text: str
    token_count: int
    score: float
    channel: str  # the channel whose share, or the fused ranking ("fused"), brought it in
    rank: int
    page_start: int | None = None
    page_end: int | None = None
    heading_path: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    items: list[Evidence]
    budget: int
    tokens: int
    shares: dict[str, float]

    def ids(self) -> set[str]:
        return {item.id for item in self.items}

    def by_id(self, evidence_id: str) -> Evidence | None:
        return next((item for item in self.items if item.id == evidence_id), None)


def _evidence(index: RetrievalIndex, row: int, score: float, channel: str, rank: int) -> Evidence:
    r = index.chunks.row(row, named=True)
    return Evidence(r["chunk_id"], r["doc_id"], r["source_path"], int(r["char_start"]), int(r["char_end"]),
                    r["text"], int(r["token_count"]), float(score), channel, rank, r.get("page_start"),
                    r.get("page_end"), r.get("heading_path") or "")


def build_context(index: RetrievalIndex, fused: np.ndarray, channels: Mapping[str, np.ndarray] | None = None,
                  shares: Mapping[str, float] | None = None, budget: int = 2048) -> Context:
    """Fill `budget` tokens: each channel in `shares` first takes its θ share of the budget from its own
    ranking, then the fused ranking fills the rest. A chunk enters once (the first channel to bring it
    in is recorded); a chunk larger than the room left is skipped, so smaller later ones still fit."""
    if budget <= 0:
        raise ValueError(f"the context budget must be a positive number of tokens, got {budget}")
    channels, shares = channels or {}, dict(shares or {})
    if any(share < 0 for share in shares.values()) or sum(shares.values()) > 1 + 1e-9:
        raise ValueError(f"channel shares must be non-negative and sum to at most 1, got {shares}")
    items: list[Evidence] = []
    taken: set[int] = set()
    used = 0

    def fill(scores: np.ndarray, channel: str, allowance: int) -> None:
        nonlocal used
        spent = 0
        rows, _ = ranks_of(scores, min(index.size, MAX_ITEMS))
        for rank, row in enumerate(rows.tolist(), 1):
            if len(items) >= MAX_ITEMS or spent >= allowance:
                return
            if row in taken:
                continue
            tokens = int(index.chunks["token_count"][row])
            if tokens > allowance - spent or used + tokens > budget:
                continue
            taken.add(row)
            items.append(_evidence(index, row, scores[row], channel, rank))
            spent += tokens
            used += tokens

    for name, share in shares.items():
        if share and name in channels:
            fill(channels[name], name, int(budget * share))
    fill(fused, "fused", budget - used)
    # Read in fused order (then channel order): the strongest evidence first whichever share brought it.
    order = {row: i for i, row in enumerate(ranks_of(fused, index.size)[0].tolist())}
    position = {item.id: i for i, item in enumerate(items)}
    items.sort(key=lambda e: (order.get(index.position.get(e.id, -1), len(order)), position[e.id]))
    return Context(items, budget, used, shares)
