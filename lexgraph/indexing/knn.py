"""Chunk KNN graphs for KET-RAG, kept current as chunks come and go: the graph and its updates.

Two kinds, as in KET-RAG: ``semantic`` (K nearest chunks by embedding cosine) and ``lexical``
(K nearest chunks by shared distinct content words). The state is each chunk's directed top-K
list; the undirected similarity edges are derived from it.

Why: PageRank over this graph picks the skeleton; keeping top-K lists as the state lets an added
or removed document touch only the lists it affects, and in exact mode that incremental result
is identical to a full rebuild.

:class:`KnnGraph` holds one kind's lists and updates them in place; it searches a corpus of its kind,
:mod:`~lexgraph.indexing.knn_vectors` (embeddings, exact or through faiss HNSW) or
:mod:`~lexgraph.indexing.knn_words` (content words). The ranking primitives are in
:mod:`~lexgraph.indexing.knn_top_k`, the lists' undirected edges in :mod:`~lexgraph.indexing.knn_edges`.
The corpus step that keeps the graphs saved between runs is :mod:`~lexgraph.indexing.knn_update`, its
files :mod:`~lexgraph.indexing.knn_state`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import polars as pl

from lexgraph.defaults import DEFAULT_KNN_K
from lexgraph.indexing.knn_edges import EdgeRows, SavedLists, edge_frame, edge_rows_of, edges_of, position_map
from lexgraph.indexing.knn_top_k import Triples, concat_triples, top_k
from lexgraph.indexing.knn_vectors import AnnIndex, Mode, VectorCorpus
from lexgraph.indexing.knn_words import WordCorpus, WordMatrix

# K, chosen by measurement: lexgraph.defaults says how (LEXGRAPH_KNN_K's default).
DEFAULT_K = DEFAULT_KNN_K
# A word in more chunks than this links too much to say which chunks are close, and keeping it
# would make the lexical search cost grow with its document frequency; cost per chunk stays
# below (its distinct words) x DEFAULT_MAX_DF candidate pairs.
DEFAULT_MAX_DF = 100

STATE_SCHEMA: dict[str, pl.DataType] = {
    "chunk_id": pl.String(),
    "neighbor_id": pl.String(),
    "kind": pl.String(),
    "sim": pl.Float64(),
    "rank": pl.Int32(),
}
_EMPTY = -1  # unused neighbour slot
_GONE = -2  # slot whose neighbour was removed: that list must be searched again


@dataclass(frozen=True)
class KnnUpdate:
    """What one add or remove did to the neighbour lists, for run metadata."""

    added: int
    removed: int
    recomputed: int  # lists searched afresh: new chunks, chunks that lost a neighbour, lexical re-weights
    changed: int  # lists that differ afterwards

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _as_ids(chunk_ids: Sequence[str] | np.ndarray) -> np.ndarray:
    ids = np.asarray(chunk_ids, dtype=str)
    if ids.ndim != 1:
        raise ValueError("chunk ids must be a flat sequence of strings")
    if pl.Series(ids, dtype=pl.String).n_unique() != len(ids):  # polars: numpy's unique of strings is slow
        raise ValueError("chunk ids must be unique")
    return ids


class KnnGraph:
    """Directed top-K neighbour lists of one kind over a chunk corpus, updated in place.

    Build with :func:`semantic_knn` or :func:`lexical_knn`. ``chunk_ids`` is sorted; list
    entries are positions into it.
    """

    def __init__(self, corpus: VectorCorpus | WordCorpus, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.kind = corpus.kind
        self.k = k
        self._corpus = corpus
        self.chunk_ids = np.zeros(0, dtype=str)
        self._neighbors = np.full((0, k), _EMPTY, dtype=np.int64)
        self._sims = np.zeros((0, k))
        self.last_update = KnnUpdate(0, 0, 0, 0)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def add(self, chunk_ids: Sequence[str], data: npt.ArrayLike | Sequence[Iterable[str]]) -> KnnUpdate:
        """Add chunks (vectors for semantic, word lists for lexical): new lists plus reverse insertions."""
        new_ids = _as_ids(chunk_ids)
        merged = np.concatenate([self.chunk_ids, new_ids])
        order = np.argsort(merged, kind="stable")
        if len(merged) > 1 and bool(np.any(merged[order][1:] == merged[order][:-1])):
            clash = np.intersect1d(self.chunk_ids, new_ids)
            raise ValueError(f"chunk ids already in the graph: {clash[:5].tolist()}")
        target = np.empty(len(merged), dtype=np.int64)
        target[order] = np.arange(len(merged))
        old_to_new, new_positions = target[: len(self.chunk_ids)], target[len(self.chunk_ids) :]
        changed = self._corpus.insert(old_to_new, new_positions, data)  # type: ignore[arg-type]
        self._move(old_to_new, merged[order])
        return self._refresh(np.union1d(new_positions, changed), added=len(new_ids), removed=0)

    def remove(self, chunk_ids: Sequence[str]) -> KnnUpdate:
        """Drop chunks; only lists that held one of them (or lexical re-weights) are searched again."""
        gone = _as_ids(chunk_ids)
        unknown = np.setdiff1d(gone, self.chunk_ids)
        if len(unknown):
            raise ValueError(f"unknown chunk ids: {unknown[:5].tolist()}")
        keep = ~np.isin(self.chunk_ids, gone)
        old_to_new = np.where(keep, np.cumsum(keep) - 1, -1)
        changed = self._corpus.delete(old_to_new)
        self._move(old_to_new, self.chunk_ids[keep])
        return self._refresh(changed, added=0, removed=len(gone))

    def _move(self, old_to_new: np.ndarray, chunk_ids: np.ndarray) -> None:
        """Renumber rows and list entries after ids were inserted or deleted; removed neighbours become _GONE."""
        neighbors = np.full((len(chunk_ids), self.k), _EMPTY, dtype=np.int64)
        sims = np.zeros((len(chunk_ids), self.k))
        live = old_to_new >= 0
        moved = self._neighbors[live]
        target = old_to_new[np.maximum(moved, 0)]
        neighbors[old_to_new[live]] = np.where(moved < 0, _EMPTY, np.where(target < 0, _GONE, target))
        sims[old_to_new[live]] = self._sims[live]
        self.chunk_ids, self._neighbors, self._sims = chunk_ids, neighbors, sims

    def _refresh(self, changed: np.ndarray, added: int, removed: int) -> KnnUpdate:
        """Search afresh every list that may hold stale entries; offer the changed chunks to all others.

        A list without removed or changed chunks was the top-K of a set that only grew by the
        changed chunks, so its new top-K is the best of itself and those chunks.
        """
        stale = np.any((self._neighbors == _GONE) | np.isin(self._neighbors, changed), axis=1)
        redo = np.union1d(changed, np.flatnonzero(stale)).astype(np.int64)
        before = self._neighbors[redo], self._sims[redo]
        self._set_rows(redo, self._corpus.search(redo, self.k))
        differs = int(np.count_nonzero(np.any((before[0] != self._neighbors[redo]) | (before[1] != self._sims[redo]),
                                              axis=1)))
        rest = np.setdiff1d(np.arange(len(self)), redo)
        if len(changed) and len(rest):
            offered = self._beating(self._corpus.search_among(rest, changed.astype(np.int64), self.k))
            hit = np.unique(offered[0])
            self._set_rows(hit, concat_triples([self._entries(hit), offered]))
            differs += len(hit)  # a candidate that beats a list's last entry (or fills a slot) changes it
        return KnnUpdate(added, removed, recomputed=len(redo), changed=differs)

    def _beating(self, offered: Triples) -> Triples:
        """The offered candidates that would enter their row's list: better than its last entry (higher
        similarity, or equal and a smaller position), or any positive one where the list has room. The
        rest cannot change the top-k, and ranking them with every entry of their rows was most of an add."""
        rows, cols, sims = offered
        last_col, last_sim = self._neighbors[rows, -1], self._sims[rows, -1]
        room = last_col < 0
        enters = (sims > 0) & (room | (sims > last_sim) | ((sims == last_sim) & (cols < last_col)))
        return rows[enters], cols[enters], sims[enters]

    def _entries(self, rows: np.ndarray) -> Triples:
        r, slot = np.nonzero(self._neighbors[rows] >= 0)
        return rows[r], self._neighbors[rows[r], slot], self._sims[rows[r], slot]

    def _set_rows(self, rows: np.ndarray, candidates: Triples) -> None:
        self._neighbors[rows] = _EMPTY
        self._sims[rows] = 0.0
        r, c, s, rank = top_k(*candidates, self.k)
        self._neighbors[r, rank] = c
        self._sims[r, rank] = s

    def _restore(
        self,
        chunk_ids: Sequence[str],
        data: npt.ArrayLike | Sequence[Iterable[str]] | WordMatrix,
        state: pl.DataFrame | SavedLists,
        removed: Sequence[str] = (),
        ann: AnnIndex | None = None,
    ) -> None:
        """Load saved lists instead of searching; the corpus must be the one the state was saved with,
        less ``removed`` (chunks the state names whose data is gone): the lists that held those are
        searched again, and ``last_update`` says what that did. ``data`` is that of ``chunk_ids``."""
        ids, gone = _as_ids(chunk_ids), _as_ids(removed)
        if isinstance(state, SavedLists):
            saved_ids = state.chunk_ids
            keep = ~pl.Series(saved_ids, dtype=pl.String).is_in(gone.tolist()).to_numpy()
        else:
            everything = np.concatenate([ids, gone])
            if pl.Series(everything, dtype=pl.String).n_unique() != len(everything):
                raise ValueError("a removed chunk id is also among the chunks to restore")
            order = np.argsort(everything, kind="stable")
            saved_ids, keep = everything[order], order < len(ids)
            state = lists_from_frame(state.filter(pl.col("kind") == self.kind), saved_ids, self.k)
        order = np.argsort(ids, kind="stable")  # linear when already sorted
        if not bool(np.array_equal(ids[order], saved_ids[keep])):
            raise ValueError("the chunks given are not those of the saved state less the removed ones")
        positions = np.empty(len(ids), dtype=np.int64)
        positions[order] = np.arange(len(ids))
        self._load(state, keep, positions, data, ann)

    def _load(self, saved: SavedLists, keep: np.ndarray, positions: np.ndarray,
              data: npt.ArrayLike | Sequence[Iterable[str]] | WordMatrix, ann: AnnIndex | None) -> None:
        """Take saved lists; ``data`` belongs to the kept chunks, row i at ``positions[i]`` among them."""
        _check_lists(saved, self.k)
        self._corpus.load(positions, data, ann)  # type: ignore[arg-type]
        self.chunk_ids = saved.chunk_ids
        self._neighbors = saved.neighbors.astype(np.int64)
        self._sims = np.array(saved.sims, dtype=np.float64)
        if bool(keep.all()):
            self.last_update = KnnUpdate(0, 0, 0, 0)
            return
        self._move(np.where(keep, np.cumsum(keep) - 1, -1), saved.chunk_ids[keep])
        self.last_update = self._refresh(np.zeros(0, dtype=np.int64), added=0, removed=int(np.count_nonzero(~keep)))

    @property
    def ann_status(self) -> str:
        """How the ANN index was obtained: "exact" (none), "loaded" (a saved one) or "rebuilt: <why>"."""
        return self._corpus.ann_status

    def ann_index(self) -> AnnIndex | None:
        """The ANN index (approximate semantic graphs only) and the faiss id of each of ``chunk_ids``."""
        return self._corpus.ann_index()

    def ann_appended(self) -> list[int] | None:
        """Sizes of the batches of vectors appended, in order, to the ANN index since the saved one given to
        :func:`semantic_knn` was adopted (each by :func:`append_in_order`); None when the index was built
        here (or there is none). With the saved index they make it again, so a save may keep just those."""
        return self._corpus.ann_appended()

    def lists(self) -> SavedLists:
        """The directed lists as positions into ``chunk_ids``: the form to persist (views, not copies)."""
        return SavedLists(self.chunk_ids, self._neighbors, self._sims)

    def word_matrix(self) -> WordMatrix:
        """The lexical corpus over ``chunk_ids``, to persist with the lists."""
        if not isinstance(self._corpus, WordCorpus):
            raise TypeError("only a lexical graph has a word matrix")
        return self._corpus.matrix()

    def linked(self) -> np.ndarray:
        """Which chunks have at least one edge of this kind."""
        linked = np.any(self._neighbors >= 0, axis=1)
        linked[self._neighbors[self._neighbors >= 0]] = True
        return linked

    def state_frame(self) -> pl.DataFrame:
        """The directed lists, one row per (chunk, neighbour), with chunk ids."""
        row, rank = np.nonzero(self._neighbors >= 0)
        names = pl.Series(self.chunk_ids, dtype=pl.String)
        return pl.DataFrame(
            {
                "chunk_id": names.gather(row),
                "neighbor_id": names.gather(self._neighbors[row, rank]),
                "kind": pl.repeat(self.kind, len(row), eager=True),
                "sim": self._sims[row, rank],
                "rank": rank.astype(np.int32),
            },
            schema=STATE_SCHEMA,
        )

    def edges(self) -> pl.DataFrame:
        """Undirected similarity edges (src < dst), weight = the larger of the two directions' sims."""
        return edges_of(self.lists(), self.kind)

    def edge_rows(self) -> EdgeRows:
        """The same edges as positions into ``chunk_ids``."""
        return edge_rows_of(self.lists(), self.kind)


def _check_lists(saved: SavedLists, k: int) -> None:
    """Saved lists that could silently give wrong neighbours are refused (ValueError)."""
    ids, n = saved.chunk_ids, len(saved.chunk_ids)
    if saved.neighbors.shape != (n, k) or saved.sims.shape != (n, k):
        raise ValueError(f"the saved lists are {saved.neighbors.shape}, not {n} chunks x k={k}: saved with another k?")
    if n > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        raise ValueError("the saved chunk ids are not sorted and unique")
    neighbors = saved.neighbors
    if neighbors.size and (int(neighbors.min()) < _EMPTY or int(neighbors.max()) >= n):
        raise ValueError("the saved lists name positions outside the saved chunks")
    if bool(np.any(neighbors == np.arange(n)[:, None])):
        raise ValueError("a saved list names its own chunk")
    if not bool(np.all(np.isfinite(saved.sims))):
        raise ValueError("the saved similarities are not all finite")


def lists_from_frame(state: pl.DataFrame, chunk_ids: np.ndarray, k: int) -> SavedLists:
    """One kind's rows of a :meth:`KnnGraph.state_frame` as lists over ``chunk_ids`` (sorted).

    Joins, not a search per id: a state frame of 100k chunks has millions of rows.
    """
    missing = set(STATE_SCHEMA) - set(state.columns)
    if missing:
        raise ValueError(f"state frame lacks columns {sorted(missing)}")
    names = pl.DataFrame({"id": pl.Series(chunk_ids, dtype=pl.String)}).with_row_index("position")
    rows = (state.join(names.rename({"id": "chunk_id", "position": "owner"}), on="chunk_id", how="left")
            .join(names.rename({"id": "neighbor_id", "position": "neighbor"}), on="neighbor_id", how="left"))
    if rows["owner"].null_count() or rows["neighbor"].null_count():
        raise ValueError("state names chunk ids that are not in the corpus")
    rank = rows["rank"].to_numpy().astype(np.int64)
    if len(rank) and (rank.min() < 0 or rank.max() >= k):
        raise ValueError(f"state ranks must lie in [0, {k}): was it saved with another k?")
    owner = rows["owner"].to_numpy().astype(np.int64)
    if len(rank) and int(np.bincount(owner * k + rank).max()) > 1:  # bincount: unique() is slow at millions
        raise ValueError("state frame repeats a (chunk_id, rank) pair")
    neighbors = np.full((len(chunk_ids), k), _EMPTY, dtype=np.int64)
    sims = np.zeros((len(chunk_ids), k))
    neighbors[owner, rank] = rows["neighbor"].to_numpy()
    sims[owner, rank] = rows["sim"].to_numpy()
    return SavedLists(chunk_ids, neighbors, sims)


def word_matrix(words: Sequence[Iterable[str]]) -> WordMatrix:
    """The word matrix of chunks given by their words (in that order)."""
    corpus = WordCorpus(DEFAULT_MAX_DF)
    corpus.insert(np.zeros(0, dtype=np.int64), np.arange(len(words)), words)
    return corpus.matrix()


def edge_changes(before: SavedLists, graph: KnnGraph,
                 to_new: np.ndarray | None = None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(removed, added, reweighted) edges of the graph's kind from saved lists to the graph now (removed rows
    carry the old weight, reweighted ones the new): what diffing the two edge frames gives.

    An edge changes only with one of its two directed entries, so only pairs in lists that differ are
    looked at, and those touching removed chunks: a few per changed list, not millions of string pairs.
    ``to_new``: :func:`position_map` of the two id lists, when already known (both kinds share it).
    """
    if to_new is None:
        to_new = position_map(before.chunk_ids, graph.chunk_ids)
    old_neighbors, old_sims = before.neighbors.astype(np.int64), before.sims
    # the old lists renumbered to the new positions (a removed neighbour becomes _GONE, a new chunk's list empty)
    kept = np.flatnonzero(to_new >= 0)
    renumbered = np.where(old_neighbors >= 0, to_new[np.maximum(old_neighbors, 0)], _EMPTY)
    renumbered[(old_neighbors >= 0) & (renumbered < 0)] = _GONE
    was = np.full(graph._neighbors.shape, _EMPTY, dtype=np.int64)
    was_sims = np.zeros(graph._sims.shape)
    was[to_new[kept]], was_sims[to_new[kept]] = renumbered[kept], old_sims[kept]
    rows = np.flatnonzero(np.any((was != graph._neighbors) | (was_sims != graph._sims), axis=1))
    low, high = _pairs_of(rows, graph._neighbors[rows], was[rows])
    old_weight = _pair_weight(was, was_sims, low, high)
    new_weight = _pair_weight(graph._neighbors, graph._sims, low, high)
    # pairs with a removed chunk, in the old positions (the new ones have no place for it)
    gone = to_new < 0
    touches = (old_neighbors >= 0) & gone[np.maximum(old_neighbors, 0)]
    holders = np.union1d(np.flatnonzero(gone), np.flatnonzero(np.any(touches, axis=1)))
    gone_low, gone_high = _pairs_of(holders, old_neighbors[holders], np.full((len(holders), 0), _EMPTY))
    with_gone = gone[gone_low] | gone[gone_high]
    gone_low, gone_high = gone_low[with_gone], gone_high[with_gone]
    removed = np.isfinite(old_weight) & ~np.isfinite(new_weight)
    added = ~np.isfinite(old_weight) & np.isfinite(new_weight)
    reweighted = np.isfinite(old_weight) & np.isfinite(new_weight) & (old_weight != new_weight)
    return (pl.concat([edge_frame(before.chunk_ids, gone_low, gone_high, graph.kind,
                                   _pair_weight(old_neighbors, old_sims, gone_low, gone_high)),
                       edge_frame(graph.chunk_ids, low[removed], high[removed], graph.kind, old_weight[removed])]),
            edge_frame(graph.chunk_ids, low[added], high[added], graph.kind, new_weight[added]),
            edge_frame(graph.chunk_ids, low[reweighted], high[reweighted], graph.kind, new_weight[reweighted]))


def _pairs_of(rows: np.ndarray, *lists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct undirected pairs (low, high) between each row and the entries of its lists."""
    lows, highs = [], []
    for entries in lists:
        r, slot = np.nonzero(entries >= 0)
        lows.append(np.minimum(rows[r], entries[r, slot]))
        highs.append(np.maximum(rows[r], entries[r, slot]))
    low, high = np.concatenate(lows).astype(np.int64), np.concatenate(highs).astype(np.int64)
    width = int(high.max(initial=0)) + 1
    key = np.unique(low * width + high)
    return key // width, key % width


def _pair_weight(neighbors: np.ndarray, sims: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The edge weight of each pair under these lists: the larger direction's sim; -inf when neither lists the other."""
    def direction(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        hit = neighbors[a] == b[:, None]
        slot = hit.argmax(axis=1)
        found = hit[np.arange(len(a)), slot]
        return np.where(found, sims[a, slot], -np.inf)

    if not len(low):
        return np.zeros(0)
    return np.maximum(direction(low, high), direction(high, low))


def semantic_knn(
    chunk_ids: Sequence[str],
    vectors: npt.ArrayLike,
    k: int = DEFAULT_K,
    *,
    mode: Mode = "exact",
    state: pl.DataFrame | SavedLists | None = None,
    removed: Sequence[str] = (),
    ann_index: AnnIndex | None = None,
) -> KnnGraph:
    """Semantic KNN graph over L2-normalised embeddings [n, d] (cosine = dot product).

    ``mode="exact"`` is blocked brute force (memory O(block·n), never n x n) and its updates equal
    a rebuild; ``mode="approx"`` finds candidates with faiss HNSW (for large n) and scores them
    exactly. With ``state`` (a :meth:`KnnGraph.state_frame` or :meth:`KnnGraph.lists`), the lists are loaded, not searched;
    ``removed`` names chunks of the state that are gone (no vector needed), and ``ann_index`` is a
    saved :meth:`KnnGraph.ann_index` to reuse instead of building one (checked against the vectors;
    rebuilt when it does not match, as ``ann_status`` then says).
    """
    dim = np.asarray(vectors).shape[-1] if np.ndim(vectors) == 2 else 0
    graph = KnnGraph(VectorCorpus(dim, mode), k)
    if state is None:
        graph.add(chunk_ids, vectors)
    else:
        graph._restore(chunk_ids, vectors, state, removed, ann_index)
    return graph


def lexical_knn(
    chunk_ids: Sequence[str],
    words: Sequence[Iterable[str]] | WordMatrix,
    k: int = DEFAULT_K,
    *,
    max_df: int = DEFAULT_MAX_DF,
    state: pl.DataFrame | SavedLists | None = None,
) -> KnnGraph:
    """Lexical KNN graph over each chunk's content words (or keyword ids); always exact.

    Words found in more than ``max_df`` chunks are ignored. With ``state``, lists are loaded; the words
    may then be a saved :meth:`KnnGraph.word_matrix` (rows in ``chunk_ids`` order).
    """
    graph = KnnGraph(WordCorpus(max_df), k)
    if state is None:
        graph.add(chunk_ids, words)
    else:
        graph._restore(chunk_ids, words, state)
    return graph
