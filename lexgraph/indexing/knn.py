"""Chunk KNN graphs for KET-RAG, kept current as chunks come and go.

Two kinds, as in KET-RAG: ``semantic`` (K nearest chunks by embedding cosine) and ``lexical``
(K nearest chunks by shared distinct content words). The state is each chunk's directed top-K
list; the undirected similarity edges are derived from it.

Why: PageRank over this graph picks the skeleton; keeping top-K lists as the state lets an added
or removed document touch only the lists it affects, and in exact mode that incremental result
is identical to a full rebuild.
"""
from __future__ import annotations

import ctypes
from array import array
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Literal, Sequence

import numpy as np
import numpy.typing as npt
import polars as pl
import scipy.sparse as sp

from lexgraph.defaults import DEFAULT_KNN_K

SEMANTIC = "semantic"
LEXICAL = "lexical"
# K, chosen by measurement: lexgraph.defaults says how (LEXGRAPH_KNN_K's default).
DEFAULT_K = DEFAULT_KNN_K
# A word in more chunks than this links too much to say which chunks are close, and keeping it
# would make the lexical search cost grow with its document frequency; cost per chunk stays
# below (its distinct words) x DEFAULT_MAX_DF candidate pairs.
DEFAULT_MAX_DF = 100

Mode = Literal["exact", "approx"]
Triples = tuple[np.ndarray, np.ndarray, np.ndarray]  # row positions, neighbour positions, similarities

STATE_SCHEMA: dict[str, pl.DataType] = {
    "chunk_id": pl.String(),
    "neighbor_id": pl.String(),
    "kind": pl.String(),
    "sim": pl.Float64(),
    "rank": pl.Int32(),
}
# The kinds of edge, in the order of their codes (EdgeRows.kind, the saved edges file, Kùzu's SIMILAR.kind).
EDGE_KINDS = (SEMANTIC, LEXICAL)
EDGE_SCHEMA: dict[str, pl.DataType] = {
    "src": pl.String(),
    "dst": pl.String(),
    "kind": pl.String(),
    "weight": pl.Float64(),
}

# Unit vectors are stored as integers on a 2^-24 grid. Their dot products, computed in float64,
# are integers below 2^53 at every partial sum, hence exact whatever the summation order: a
# pair's similarity is bit-identical from a full build, an update or any block cut.
_GRID = float(2**24)
_SIM_UNIT = 2.0**-48
_NORM_TOLERANCE = 1e-3
_ROW_BLOCK = 1024  # query rows per dense tile
_COL_BLOCK = 8192  # corpus rows per dense tile: a tile is 64 MiB of float64
_WORD_ROW_BLOCK = 128  # query rows per sparse lexical product: up to ~rows x words x max_df pairs
# Against few targets (offering new chunks to all others) a block may hold more rows: rows x targets
# bounds its pairs. One product instead of n/128 small ones, each with a fixed cost.
_WORD_PAIRS = 1 << 21
_PAIR_BLOCK = 4096  # pairs rescored at once (and HNSW queries per call)
_EMPTY = -1  # unused neighbour slot
_GONE = -2  # slot whose neighbour was removed: that list must be searched again


class AnnIndexError(ValueError):
    """A saved ANN index that does not belong to the corpus it is loaded with."""


# A saved HNSW index and the faiss id of each of its chunks (same order as the chunk ids given with it).
AnnIndex = tuple[object, np.ndarray]


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


@dataclass(frozen=True)
class WordMatrix:
    """A lexical corpus as saved: row i of ``incidence`` holds the vocabulary ids of chunk i's distinct words.

    Why: rebuilding it means a dictionary look-up per word of every chunk; loaded, it is two arrays.
    """

    vocabulary: list[str]  # word of each column
    incidence: sp.csr_matrix  # [chunks, words], ones; each row's ids ascending


def _top_k(rows: np.ndarray, cols: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
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


# Above this many candidates, _top_k first drops those that cannot make their row's top k (one sort of one
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


def _spread(array: np.ndarray, old_to_new: np.ndarray, total: int) -> np.ndarray:
    """An array of ``total`` rows holding ``array``'s row i at ``old_to_new[i]`` (the other rows undefined).

    Rows only inserted (the map increasing, nothing removed) are moved in place, the array grown by
    realloc: a fresh copy of 100k vectors cost a fresh process ~0.2-0.4 s of page faults. Only for
    arrays no view refers to (the realloc may move the data)."""
    n, row = len(array), array.strides[0] if array.ndim else 0
    inserted = n > 0 and int(old_to_new[0]) >= 0 and bool(np.all(np.diff(old_to_new) >= 1))
    if not inserted or not (array.flags.owndata and array.flags.c_contiguous and array.base is None):
        grown = np.empty((total, *array.shape[1:]), dtype=array.dtype)
        grown[old_to_new] = array
        return grown
    array.resize((total, *array.shape[1:]), refcheck=False)
    bounds = np.r_[0, np.flatnonzero(np.diff(old_to_new) != 1) + 1, n]
    base = array.ctypes.data
    for start, end in zip(bounds[-2::-1], bounds[:0:-1]):  # last run first: each moves up, over free rows
        target = int(old_to_new[start])
        if target != start:
            ctypes.memmove(base + target * row, base + int(start) * row, int(end - start) * row)
    return array


def _concat(parts: Sequence[Triples]) -> Triples:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore[return-value]


def _blocks(positions: np.ndarray, size: int) -> Iterable[np.ndarray]:
    for start in range(0, len(positions), size):
        yield positions[start : start + size]


class _Hnsw:
    """faiss HNSW index over the corpus vectors; removed vectors stay in it, filtered out, until a rebuild.

    Defaults measured on 100k clustered 384-d vectors, 2 cores: recall@10 0.97 against exact;
    M=24/efConstruction=48 reached 0.996 but took twice as long to build.
    """

    def __init__(self, dim: int, m: int = 16, ef_construction: int = 40, ef_search: int = 48) -> None:
        try:
            import faiss
        except ImportError as error:
            raise ImportError("mode='approx' needs faiss: pip install faiss-cpu") from error
        self._faiss = faiss
        self._dim, self._m, self._ef_construction, self._ef_search = dim, m, ef_construction, ef_search
        self._reset()

    def _reset(self) -> None:
        self.index = self._faiss.IndexHNSWFlat(self._dim, self._m, self._faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = self._ef_construction
        self.position = np.zeros(0, dtype=np.int64)  # corpus position of each faiss id; -1 once removed
        self.appended: list[int] | None = None  # sizes of the adds since a saved index was adopted

    def insert(self, old_to_new: np.ndarray, new_positions: np.ndarray, unit: np.ndarray) -> None:
        self.forget(old_to_new)
        if self.appended is None:
            self.index.add(unit)
        else:  # replayable from a journal: the saved index plus these adds gives this very graph
            append_in_order(self.index, unit)
            self.appended.append(len(unit))
        self.position = np.concatenate([self.position, new_positions])

    def forget(self, old_to_new: np.ndarray) -> None:
        """Mark removed rows dead; they stay in the graph, filtered out of results."""
        self.position = np.where(self.position >= 0, old_to_new[np.maximum(self.position, 0)], -1)

    def mostly_dead(self) -> bool:
        """A quarter of the index removed: time to rebuild, to keep the graph navigable and small."""
        return np.count_nonzero(self.position < 0) * 4 > len(self.position)

    def rebuild(self, unit: np.ndarray) -> None:
        self._reset()
        self.insert(np.zeros(0, dtype=np.int64), np.arange(len(unit)), unit)

    def faiss_ids(self, count: int) -> np.ndarray:
        """faiss id of each corpus position: with the index, what a later process needs to reuse it."""
        ids = np.full(count, -1, dtype=np.int64)
        live = np.flatnonzero(self.position >= 0)
        ids[self.position[live]] = live
        return ids

    def adopt(self, index: object, faiss_ids: np.ndarray, unit: Callable[[np.ndarray], np.ndarray]) -> None:
        """Use a saved index in which faiss id ``faiss_ids[p]`` holds corpus position p (ids not listed are
        dead). Raises AnnIndexError unless it holds exactly these vectors there: wrong positions would
        silently give wrong neighbours."""
        faiss = self._faiss
        if not isinstance(index, faiss.IndexHNSWFlat) or index.d != self._dim \
                or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise AnnIndexError(f"not an inner-product HNSW index of dimension {self._dim}")
        total = int(index.ntotal)
        if len(faiss_ids) and (int(faiss_ids.min()) < 0 or int(faiss_ids.max()) >= total
                               or len(np.unique(faiss_ids)) != len(faiss_ids)):
            raise AnnIndexError(f"its {total} vectors do not match the saved position map")
        for rows in _blocks(np.arange(len(faiss_ids)), _COL_BLOCK):
            if not np.array_equal(index.reconstruct_batch(faiss_ids[rows]), unit(rows)):
                raise AnnIndexError("it holds other vectors than the corpus at the saved positions")
        index.hnsw.efConstruction = self._ef_construction
        self.index = index
        self.position = np.full(total, -1, dtype=np.int64)
        self.position[faiss_ids] = np.arange(len(faiss_ids))
        self.appended = []

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """Corpus positions of up to k live nearest vectors per query; -1 where fewer exist."""
        width = min(k, int(np.count_nonzero(self.position >= 0)))
        if width == 0 or len(queries) == 0:
            return np.full((len(queries), width), -1, dtype=np.int64)
        params = self._faiss.SearchParametersHNSW(efSearch=max(self._ef_search, width))
        alive = self.position >= 0
        if not bool(alive.all()):
            # Both must outlive the search: faiss holds raw pointers to them.
            bitmap = np.packbits(alive, bitorder="little")
            selector = self._faiss.IDSelectorBitmap(len(alive), self._faiss.swig_ptr(bitmap))
            params.sel = selector
        _, labels = self.index.search(queries, width, params=params)
        return np.where(labels >= 0, self.position[np.maximum(labels, 0)], -1)


def append_in_order(index, vectors: np.ndarray) -> None:
    """Add vectors to an HNSW index on one thread: faiss' parallel insertion orders them as the threads
    run, so only this way does replaying the same batches onto the same saved index give the same graph."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    finally:
        faiss.omp_set_num_threads(threads)


class _VectorCorpus:
    """Chunk embeddings on an integer grid, searched exactly in tiles or through faiss HNSW."""

    kind = SEMANTIC

    def __init__(self, dim: int, mode: Mode) -> None:
        if mode not in ("exact", "approx"):
            raise ValueError(f"mode must be 'exact' or 'approx', got {mode!r}")
        self.grid = np.zeros((0, dim), dtype=np.int32)
        self.hnsw = _Hnsw(dim) if mode == "approx" else None
        self.ann_status = "exact" if self.hnsw is None else "rebuilt: built from the vectors"

    def _quantise(self, vectors: npt.ArrayLike, count: int) -> np.ndarray:
        array = np.asarray(vectors)
        if array.ndim != 2 or array.shape != (count, self.grid.shape[1]):
            raise ValueError(f"expected vectors of shape ({count}, {self.grid.shape[1]}), got {array.shape}")
        if array.dtype != np.float32:
            array = array.astype(np.float64, copy=False)
        # Scaling by a power of two is exact in float32 too, so rounding there gives the float64 grid.
        scale = array.dtype.type(_GRID)
        grid = np.empty(array.shape, dtype=np.int32)
        for start in range(0, count, _COL_BLOCK):
            block = array[start : start + _COL_BLOCK]
            norms = np.sqrt(np.einsum("ij,ij->i", block, block))
            if not bool(np.all(np.abs(norms - 1.0) <= _NORM_TOLERANCE)):
                raise ValueError("vectors must be finite and L2-normalised")
            grid[start : start + _COL_BLOCK] = np.rint(block * scale)
        return grid

    def _unit(self, rows: np.ndarray) -> np.ndarray:
        return self.grid[rows].astype(np.float32) * np.float32(1.0 / _GRID)

    def _place(self, old_to_new: np.ndarray, new_positions: np.ndarray, vectors: npt.ArrayLike) -> None:
        added = self._quantise(vectors, len(new_positions))
        if not len(old_to_new) and bool(np.array_equal(new_positions, np.arange(len(new_positions)))):
            self.grid = added  # loaded in order: no copy
            return
        self.grid = _spread(self.grid, old_to_new, len(old_to_new) + len(new_positions))
        self.grid[new_positions] = added

    def insert(self, old_to_new: np.ndarray, new_positions: np.ndarray, vectors: npt.ArrayLike) -> np.ndarray:
        self._place(old_to_new, new_positions, vectors)
        if self.hnsw is not None:
            self.hnsw.insert(old_to_new, new_positions, self._unit(new_positions))
        return np.zeros(0, dtype=np.int64)  # an embedding never changes another chunk's similarities

    def load(self, positions: np.ndarray, vectors: npt.ArrayLike, ann: AnnIndex | None) -> None:
        """Place saved chunks without searching; reuse a saved ANN index when it matches them."""
        self._place(np.zeros(0, dtype=np.int64), positions, vectors)
        if self.hnsw is None:
            return
        reason = "no saved index"
        if ann is not None:
            faiss_ids = np.empty(len(positions), dtype=np.int64)
            faiss_ids[positions] = np.asarray(ann[1], dtype=np.int64)
            try:
                self.hnsw.adopt(ann[0], faiss_ids, self._unit)
                if not self.hnsw.mostly_dead():
                    self.ann_status = "loaded"
                    return
                reason = "a quarter of its vectors were removed"
            except AnnIndexError as error:
                reason = f"saved index refused: {error}"
        self.hnsw.rebuild(self._unit(np.arange(len(self.grid))))
        self.ann_status = f"rebuilt: {reason}"

    def ann_index(self) -> AnnIndex | None:
        """The HNSW index and the faiss id of each chunk position, to save (None in exact mode)."""
        return None if self.hnsw is None else (self.hnsw.index, self.hnsw.faiss_ids(len(self.grid)))

    def ann_appended(self) -> list[int] | None:
        return None if self.hnsw is None else self.hnsw.appended

    def delete(self, old_to_new: np.ndarray) -> np.ndarray:
        self.grid = self.grid[old_to_new >= 0]
        if self.hnsw is not None:
            self.hnsw.forget(old_to_new)
            if self.hnsw.mostly_dead():
                self.hnsw.rebuild(self._unit(np.arange(len(self.grid))))
                self.ann_status = "rebuilt: a quarter of its vectors were removed"
        return np.zeros(0, dtype=np.int64)

    def search(self, rows: np.ndarray, k: int) -> Triples:
        """Candidates holding each row's top-k over the whole corpus (all of it in exact mode)."""
        if self.hnsw is None:
            return self._exact(rows, np.arange(len(self.grid)), k)
        parts = []
        for block in _blocks(rows, _PAIR_BLOCK):
            found = self.hnsw.search(self._unit(block), k + 1)  # +1: the row itself is in the index
            parts.append(self._pairs(np.repeat(block, found.shape[1]), found.ravel()))
        return _concat(parts)

    def search_among(self, rows: np.ndarray, cols: np.ndarray, k: int) -> Triples:
        """Candidates holding each row's top-k among ``cols`` (the new or changed chunks).

        Approximate mode searches from ``cols`` instead: cosine is symmetric, so a chunk whose
        list a new chunk enters is usually among that new chunk's own nearest; 2k widens the net.
        """
        if self.hnsw is None:
            return self._exact(rows, cols, k)
        wanted = np.zeros(len(self.grid), dtype=bool)
        wanted[rows] = True
        parts = []
        for block in _blocks(cols, _PAIR_BLOCK):
            found = self.hnsw.search(self._unit(block), 2 * k + 1)
            near, new = found.ravel(), np.repeat(block, found.shape[1])
            keep = (near >= 0) & wanted[np.maximum(near, 0)]
            parts.append(self._pairs(near[keep], new[keep]))
        return _concat(parts)

    def _pairs(self, rows: np.ndarray, cols: np.ndarray) -> Triples:
        """Exact similarity of each (row, col) pair, dropping self-pairs and empty slots."""
        keep = (cols >= 0) & (cols != rows)
        rows, cols = rows[keep], cols[keep]
        sims = np.empty(len(rows))
        for span in _blocks(np.arange(len(rows)), _PAIR_BLOCK):
            left = self.grid[rows[span]].astype(np.float64)
            right = self.grid[cols[span]].astype(np.float64)
            sims[span] = np.einsum("ij,ij->i", left, right) * _SIM_UNIT
        return rows, cols, sims

    def _exact(self, rows: np.ndarray, cols: np.ndarray, k: int) -> Triples:
        """Blocked brute force: memory is one tile, never rows x cols."""
        found = []
        for row_block in _blocks(rows, _ROW_BLOCK):
            left = self.grid[row_block].astype(np.float64)
            best: Triples = _concat([])
            for col_block in _blocks(cols, _COL_BLOCK):
                dots = left @ self.grid[col_block].astype(np.float64).T
                is_self = np.isin(row_block, col_block)
                dots[np.flatnonzero(is_self), np.searchsorted(col_block, row_block[is_self])] = -np.inf
                if dots.shape[1] > k:
                    kth = np.partition(dots, dots.shape[1] - k, axis=1)[:, dots.shape[1] - k]
                    candidate = dots >= kth[:, None]
                else:
                    candidate = np.ones(dots.shape, dtype=bool)
                r, c = np.nonzero(candidate & (dots > 0))
                tile = (row_block[r], col_block[c], dots[r, c] * _SIM_UNIT)
                best = _top_k(*_concat([best, tile]), k)[:3]
            found.append(best)
        return _concat(found)


def _check_rows(indptr: np.ndarray, indices: np.ndarray, width: int) -> None:
    """A saved sparse matrix: offsets that add up, column ids in range and ascending within each row (a
    repeated id would count a shared word twice)."""
    if len(indptr) == 0 or indptr[0] != 0 or indptr[-1] != len(indices) or bool(np.any(np.diff(indptr) < 0)):
        raise ValueError("the saved word matrix has inconsistent row offsets")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= width):
        raise ValueError("the saved word matrix names words outside its vocabulary")
    step = np.diff(indices.astype(np.int64))
    row_start = np.zeros(len(step), dtype=bool)
    starts = indptr[1:-1].astype(np.int64) - 1  # a step into the first id of a row may go down
    row_start[starts[(starts >= 0) & (starts < len(step))]] = True
    if bool(np.any((step <= 0) & ~row_start)):
        raise ValueError("the saved word matrix repeats or disorders a row's words")


class _WordCorpus:
    """Distinct content words per chunk as a sparse 0/1 matrix; words in over ``max_df`` chunks are ignored.

    Similarity is the shared distinct-word count divided by sqrt(|A|·|B|) (cosine of the binary
    word vectors): it ranks like the raw count for a fixed pair size, but stops long chunks from
    becoming everyone's neighbour, and is on the same [0, 1] scale as the semantic edges that
    share one PageRank graph with it.
    """

    kind = LEXICAL

    def __init__(self, max_df: int) -> None:
        if isinstance(max_df, bool) or not isinstance(max_df, int) or max_df < 1:
            raise ValueError(f"max_df must be a positive integer, got {max_df!r}")
        self.max_df = max_df
        self.vocabulary: dict[str, int] = {}
        self.incidence = sp.csr_matrix((0, 0), dtype=np.int32)
        self.df = np.zeros(0, dtype=np.int64)
        self._cache: tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray] | None = None

    def _rows(self, words: Sequence[Iterable[str]], count: int) -> sp.csr_matrix:
        if len(words) != count:
            raise ValueError(f"expected {count} word lists, got {len(words)}")
        for chunk_words in words:
            if isinstance(chunk_words, str):
                raise TypeError("each chunk's words must be a list of words, not one string")
        indptr, indices = array("i", [0]), array("i")  # compact: a list of ints costs ~9x the memory
        vocabulary = self.vocabulary
        for chunk_words in words:
            indices.extend(sorted({vocabulary.setdefault(word, len(vocabulary)) for word in chunk_words}))
            indptr.append(len(indices))
        columns = np.frombuffer(indices, dtype=np.int32) if len(indices) else np.zeros(0, np.int32)
        offsets = np.frombuffer(indptr, dtype=np.int32)
        return sp.csr_matrix((np.ones(len(columns), np.int32), columns, offsets), shape=(count, len(vocabulary)))

    def _widen(self) -> None:
        width = len(self.vocabulary)
        self.incidence.resize((self.incidence.shape[0], width))
        self.df = np.concatenate([self.df, np.zeros(width - len(self.df), dtype=np.int64)])

    def _flipped(self, old_df: np.ndarray, exclude: np.ndarray) -> np.ndarray:
        """Rows (not in ``exclude``) holding a word that crossed ``max_df``: all their similarities moved."""
        flipped = (old_df <= self.max_df) != (self.df <= self.max_df)
        if not bool(flipped.any()):
            return np.zeros(0, dtype=np.int64)
        holders = np.flatnonzero(self.incidence[:, flipped].getnnz(axis=1))
        return np.setdiff1d(holders, exclude)

    def insert(
        self, old_to_new: np.ndarray, new_positions: np.ndarray, words: Sequence[Iterable[str]]
    ) -> np.ndarray:
        added = self._rows(words, len(new_positions))
        self._widen()
        old_df = self.df.copy()
        self.df += np.asarray(added.sum(axis=0)).ravel().astype(np.int64)
        source = np.empty(len(old_to_new) + len(new_positions), dtype=np.int64)
        source[np.concatenate([old_to_new, new_positions])] = np.arange(len(source))
        self.incidence = sp.vstack([self.incidence, added], format="csr")[source]
        self._cache = None
        return self._flipped(old_df, new_positions)

    ann_status = "exact"

    def load(self, positions: np.ndarray, words: Sequence[Iterable[str]] | WordMatrix, ann: AnnIndex | None) -> None:
        if isinstance(words, WordMatrix):
            self._adopt(positions, words)
        else:
            self.insert(np.zeros(0, dtype=np.int64), positions, words)

    def _adopt(self, positions: np.ndarray, saved: WordMatrix) -> None:
        """Take a saved matrix whose row i belongs at ``positions[i]``, after checking it is well formed."""
        matrix, width = saved.incidence, len(saved.vocabulary)
        vocabulary = dict(zip(saved.vocabulary, range(width)))
        if len(vocabulary) != width:
            raise ValueError("the saved vocabulary repeats a word")
        if matrix.shape != (len(positions), width):
            raise ValueError(f"the saved word matrix is {matrix.shape}, not {len(positions)} chunks x {width} words")
        _check_rows(matrix.indptr, matrix.indices, width)
        incidence = sp.csr_matrix((np.ones(len(matrix.indices), np.int32), matrix.indices, matrix.indptr),
                                  shape=matrix.shape)
        if not bool(np.array_equal(positions, np.arange(len(positions)))):
            source = np.empty(len(positions), dtype=np.int64)
            source[positions] = np.arange(len(positions))
            incidence = incidence[source]
        self.vocabulary, self.incidence = vocabulary, incidence
        self.df = np.bincount(incidence.indices, minlength=width).astype(np.int64)
        self._cache = None

    def matrix(self) -> WordMatrix:
        return WordMatrix(list(self.vocabulary), self.incidence)

    def ann_index(self) -> None:
        return None

    def ann_appended(self) -> None:
        return None

    def delete(self, old_to_new: np.ndarray) -> np.ndarray:
        keep = old_to_new >= 0
        old_df = self.df.copy()
        self.df -= np.asarray(self.incidence[~keep].sum(axis=0)).ravel().astype(np.int64)
        self.incidence = self.incidence[keep]
        self._cache = None
        return self._flipped(old_df, np.zeros(0, dtype=np.int64))

    def _kept(self) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray]:
        """Incidence restricted to words within the cap, its transpose, and each row's word count."""
        if self._cache is None:
            matrix = self.incidence.copy()
            matrix.data = (self.df[matrix.indices] <= self.max_df).astype(np.int32)
            matrix.eliminate_zeros()
            self._cache = (matrix, matrix.T.tocsr(), matrix.getnnz(axis=1).astype(np.int64))
        return self._cache

    def search(self, rows: np.ndarray, k: int) -> Triples:
        matrix, transposed, _ = self._kept()
        return self._shared(rows, transposed, np.arange(matrix.shape[0]), k)

    def search_among(self, rows: np.ndarray, cols: np.ndarray, k: int) -> Triples:
        matrix, _, _ = self._kept()
        return self._shared(rows, matrix[cols].T.tocsr(), cols, k)

    def _shared(self, rows: np.ndarray, targets: sp.csr_matrix, target_positions: np.ndarray, k: int) -> Triples:
        """Exact top-k by normalised shared-word count; each block costs its rows' posting lists."""
        matrix, _, sizes = self._kept()
        found = []
        for block in _blocks(rows, max(_WORD_ROW_BLOCK, _WORD_PAIRS // max(len(target_positions), 1))):
            shared = (matrix[block] @ targets).tocoo()
            r, c = block[shared.row], target_positions[shared.col]
            keep = r != c
            r, c, count = r[keep], c[keep], shared.data[keep].astype(np.float64)
            sims = count / np.sqrt((sizes[r] * sizes[c]).astype(np.float64))
            found.append(_top_k(r, c, sims, k)[:3])
        return _concat(found)


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

    def __init__(self, corpus: _VectorCorpus | _WordCorpus, k: int) -> None:
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
            self._set_rows(hit, _concat([self._entries(hit), offered]))
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
        r, c, s, rank = _top_k(*candidates, self.k)
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
        if not isinstance(self._corpus, _WordCorpus):
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


def _names(chunk_ids: np.ndarray, positions: np.ndarray) -> pl.Series:
    """The chunk ids at these positions. A few are picked out before they become a Series: turning all of a
    100k-id array into one costs about 0.1 s, and the edge diffs ask for a few hundred ids, eight times."""
    if len(positions) < len(chunk_ids):
        return pl.Series(chunk_ids[positions], dtype=pl.String)
    return pl.Series(chunk_ids, dtype=pl.String).gather(positions)


def _edge_frame(chunk_ids: np.ndarray, src: np.ndarray, dst: np.ndarray, kind: str, weights: np.ndarray) -> pl.DataFrame:
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
    corpus = _WordCorpus(DEFAULT_MAX_DF)
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
    return (pl.concat([_edge_frame(before.chunk_ids, gone_low, gone_high, graph.kind,
                                   _pair_weight(old_neighbors, old_sims, gone_low, gone_high)),
                       _edge_frame(graph.chunk_ids, low[removed], high[removed], graph.kind, old_weight[removed])]),
            _edge_frame(graph.chunk_ids, low[added], high[added], graph.kind, new_weight[added]),
            _edge_frame(graph.chunk_ids, low[reweighted], high[reweighted], graph.kind, new_weight[reweighted]))


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


def position_map(old_ids: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """Position in ``new_ids`` of each of ``old_ids``; -1 for those not there."""
    old = pl.DataFrame({"chunk_id": pl.Series(old_ids, dtype=pl.String)}).with_row_index("old")
    new = pl.DataFrame({"chunk_id": pl.Series(new_ids, dtype=pl.String)}).with_row_index("new")
    pairs = old.join(new, on="chunk_id", how="inner")
    mapping = np.full(len(old_ids), -1, dtype=np.int64)
    mapping[pairs["old"].to_numpy()] = pairs["new"].to_numpy()
    return mapping


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
    graph = KnnGraph(_VectorCorpus(dim, mode), k)
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
    graph = KnnGraph(_WordCorpus(max_df), k)
    if state is None:
        graph.add(chunk_ids, words)
    else:
        graph._restore(chunk_ids, words, state)
    return graph
