"""The semantic KNN graph's corpus: chunk embeddings on an integer grid, searched exactly in tiles or
through a faiss HNSW index (approximate mode), which a later process can adopt from a save.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Literal

import numpy as np
import numpy.typing as npt

from lexgraph.indexing.knn_edges import SEMANTIC
from lexgraph.indexing.knn_top_k import Triples, blocks, concat_triples, top_k

Mode = Literal["exact", "approx"]


# Unit vectors are stored as integers on a 2^-24 grid. Their dot products, computed in float64,
# are integers below 2^53 at every partial sum, hence exact whatever the summation order: a
# pair's similarity is bit-identical from a full build, an update or any block cut.
_GRID = float(2**24)
_SIM_UNIT = 2.0**-48
_NORM_TOLERANCE = 1e-3
_ROW_BLOCK = 1024  # query rows per dense tile
_COL_BLOCK = 8192  # corpus rows per dense tile: a tile is 64 MiB of float64
_PAIR_BLOCK = 4096  # pairs rescored at once (and HNSW queries per call)


class AnnIndexError(ValueError):
    """A saved ANN index that does not belong to the corpus it is loaded with."""


# A saved HNSW index and the faiss id of each of its chunks (same order as the chunk ids given with it).
AnnIndex = tuple[object, np.ndarray]


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
        for rows in blocks(np.arange(len(faiss_ids)), _COL_BLOCK):
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


class VectorCorpus:
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
        for block in blocks(rows, _PAIR_BLOCK):
            found = self.hnsw.search(self._unit(block), k + 1)  # +1: the row itself is in the index
            parts.append(self._pairs(np.repeat(block, found.shape[1]), found.ravel()))
        return concat_triples(parts)

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
        for block in blocks(cols, _PAIR_BLOCK):
            found = self.hnsw.search(self._unit(block), 2 * k + 1)
            near, new = found.ravel(), np.repeat(block, found.shape[1])
            keep = (near >= 0) & wanted[np.maximum(near, 0)]
            parts.append(self._pairs(near[keep], new[keep]))
        return concat_triples(parts)

    def _pairs(self, rows: np.ndarray, cols: np.ndarray) -> Triples:
        """Exact similarity of each (row, col) pair, dropping self-pairs and empty slots."""
        keep = (cols >= 0) & (cols != rows)
        rows, cols = rows[keep], cols[keep]
        sims = np.empty(len(rows))
        for span in blocks(np.arange(len(rows)), _PAIR_BLOCK):
            left = self.grid[rows[span]].astype(np.float64)
            right = self.grid[cols[span]].astype(np.float64)
            sims[span] = np.einsum("ij,ij->i", left, right) * _SIM_UNIT
        return rows, cols, sims

    def _exact(self, rows: np.ndarray, cols: np.ndarray, k: int) -> Triples:
        """Blocked brute force: memory is one tile, never rows x cols."""
        found = []
        for row_block in blocks(rows, _ROW_BLOCK):
            left = self.grid[row_block].astype(np.float64)
            best: Triples = concat_triples([])
            for col_block in blocks(cols, _COL_BLOCK):
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
                best = top_k(*concat_triples([best, tile]), k)[:3]
            found.append(best)
        return concat_triples(found)
