"""The KNN graphs' kinds, their neighbour lists as saved (:class:`SavedLists`) and the undirected similarity
edges derived from them (:class:`EdgeRows`, the form PageRank and the saved edges file use).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl

SEMANTIC = "semantic"
LEXICAL = "lexical"
# The kinds of edge, in the order of their codes (EdgeRows.kind, the saved edges file, Kùzu's SIMILAR.kind).
EDGE_KINDS = (SEMANTIC, LEXICAL)
EDGE_SCHEMA: dict[str, pl.DataType] = {
    "src": pl.String(),
    "dst": pl.String(),
    "kind": pl.String(),
    "weight": pl.Float64(),
}


@dataclass(frozen=True)
class EdgeRows:
    """Undirected similarity edges (src < dst) as positions into ``chunk_ids``, with each one's kind (a
    position in EDGE_KINDS) and weight: the form the KNN state saves and PageRank reads.

    Why: at 100k chunks a save holds 2.65M edges; naming both ends by chunk id cost every add seconds of
    string building, writing and mapping back. Only the few edges a store write needs get names (frame)."""

    chunk_ids: np.ndarray  # sorted, unique
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray  # uint8 positions in EDGE_KINDS
    weight: np.ndarray  # float64

    @property
    def height(self) -> int:
        return len(self.src)

    def counts_by_kind(self) -> dict[str, int]:
        counts = np.bincount(self.kind, minlength=len(EDGE_KINDS))
        return {name: int(n) for name, n in zip(EDGE_KINDS, counts) if n}

    def frame(self) -> pl.DataFrame:
        """The edges named by chunk id and kind name (EDGE_SCHEMA)."""
        kinds = pl.Series(EDGE_KINDS, dtype=pl.String)
        return pl.DataFrame({"src": _names(self.chunk_ids, self.src), "dst": _names(self.chunk_ids, self.dst),
                             "kind": kinds.gather(self.kind), "weight": self.weight.astype(np.float64)},
                            schema=EDGE_SCHEMA)

    def touching(self, chunk_ids: Sequence[str]) -> "EdgeRows":
        """The edges with an end among these chunks (an id this list does not hold has none)."""
        wanted = np.asarray(chunk_ids, dtype=str)
        at = np.searchsorted(self.chunk_ids, wanted)  # chunk_ids is sorted: no string table to build
        held = at < len(self.chunk_ids)
        ends = at[held][self.chunk_ids[at[held]] == wanted[held]]
        keep = np.isin(self.src, ends) | np.isin(self.dst, ends)
        return EdgeRows(self.chunk_ids, self.src[keep], self.dst[keep], self.kind[keep], self.weight[keep])

    @staticmethod
    def concat(parts: Sequence["EdgeRows"]) -> "EdgeRows":
        if any(not np.array_equal(part.chunk_ids, parts[0].chunk_ids) for part in parts[1:]):
            raise ValueError("edges of different chunk lists cannot be joined")
        return EdgeRows(parts[0].chunk_ids, *(np.concatenate([getattr(p, name) for p in parts])
                                              for name in ("src", "dst", "kind", "weight")))


@dataclass(frozen=True)
class SavedLists:
    """One kind's neighbour lists in the form they are saved in: row i is the list of ``chunk_ids[i]``,
    its entries positions into ``chunk_ids`` (-1: an empty slot), best first.

    Why positions: a new process loads them as two arrays, with no string to look up per entry.
    """

    chunk_ids: np.ndarray  # sorted, unique
    neighbors: np.ndarray  # [n, k] integers
    sims: np.ndarray  # [n, k] float64


def _names(chunk_ids: np.ndarray, positions: np.ndarray) -> pl.Series:
    """The chunk ids at these positions. A few are picked out before they become a Series: turning all of a
    100k-id array into one costs about 0.1 s, and the edge diffs ask for a few hundred ids, eight times."""
    if len(positions) < len(chunk_ids):
        return pl.Series(chunk_ids[positions], dtype=pl.String)
    return pl.Series(chunk_ids, dtype=pl.String).gather(positions)


def edge_frame(chunk_ids: np.ndarray, src: np.ndarray, dst: np.ndarray, kind: str, weights: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame(
        {"src": _names(chunk_ids, src), "dst": _names(chunk_ids, dst), "kind": pl.repeat(kind, len(src), eager=True),
         "weight": weights},
        schema=EDGE_SCHEMA,
    )


def _undirected(neighbors: np.ndarray, sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Directed lists as undirected pairs: sorted keys low * n + high, weight the larger direction's sim."""
    n = len(neighbors)
    row, rank = np.nonzero(neighbors >= 0)
    col = neighbors[row, rank].astype(np.int64)
    key = np.minimum(row, col) * n + np.maximum(row, col)
    order = np.argsort(key)  # not stable: equal keys are one pair, reduced to its larger weight
    key, weight = key[order], sims[row, rank][order]
    if not len(key):
        return np.zeros(0, np.int64), np.zeros(0)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[starts], np.maximum.reduceat(weight, starts)


def edges_of(saved: SavedLists, kind: str) -> pl.DataFrame:
    """The edges of saved lists, as :meth:`KnnGraph.edges` gives them for the graph they were saved from."""
    return edge_rows_of(saved, kind).frame()


def edge_rows_of(saved: SavedLists, kind: str) -> EdgeRows:
    """The edges of saved lists as positions, as :meth:`KnnGraph.edge_rows` gives them."""
    keys, weights = _undirected(saved.neighbors, saved.sims)
    src, dst = np.divmod(keys, max(len(saved.chunk_ids), 1))
    return EdgeRows(saved.chunk_ids, src.astype(np.int32), dst.astype(np.int32),
                    np.full(len(src), EDGE_KINDS.index(kind), dtype=np.uint8), weights)


def position_map(old_ids: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """Position in ``new_ids`` of each of ``old_ids``; -1 for those not there."""
    old = pl.DataFrame({"chunk_id": pl.Series(old_ids, dtype=pl.String)}).with_row_index("old")
    new = pl.DataFrame({"chunk_id": pl.Series(new_ids, dtype=pl.String)}).with_row_index("new")
    pairs = old.join(new, on="chunk_id", how="inner")
    mapping = np.full(len(old_ids), -1, dtype=np.int64)
    mapping[pairs["old"].to_numpy()] = pairs["new"].to_numpy()
    return mapping
