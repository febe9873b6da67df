"""The lexical KNN graph's corpus: each chunk's distinct content words as a sparse 0/1 matrix, and the
form it is saved in (:class:`WordMatrix`).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from lexgraph.indexing.knn_edges import LEXICAL
from lexgraph.indexing.knn_top_k import Triples, blocks, concat_triples, top_k
from lexgraph.indexing.knn_vectors import AnnIndex

_WORD_ROW_BLOCK = 128  # query rows per sparse lexical product: up to ~rows x words x max_df pairs
# Against few targets (offering new chunks to all others) a block may hold more rows: rows x targets
# bounds its pairs. One product instead of n/128 small ones, each with a fixed cost.
_WORD_PAIRS = 1 << 21


@dataclass(frozen=True)
class WordMatrix:
    """A lexical corpus as saved: row i of ``incidence`` holds the vocabulary ids of chunk i's distinct words.

    Why: rebuilding it means a dictionary look-up per word of every chunk; loaded, it is two arrays.
    """

    vocabulary: list[str]  # word of each column
    incidence: sp.csr_matrix  # [chunks, words], ones; each row's ids ascending


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


class WordCorpus:
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
        for block in blocks(rows, max(_WORD_ROW_BLOCK, _WORD_PAIRS // max(len(target_positions), 1))):
            shared = (matrix[block] @ targets).tocoo()
            r, c = block[shared.row], target_positions[shared.col]
            keep = r != c
            r, c, count = r[keep], c[keep], shared.data[keep].astype(np.float64)
            sims = count / np.sqrt((sizes[r] * sizes[c]).astype(np.float64))
            found.append(top_k(r, c, sims, k)[:3])
        return concat_triples(found)
