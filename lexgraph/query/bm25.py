"""Query and chunk text as terms, and Okapi BM25 over chunk texts: the sparse channel of the in-memory index,
and the term weights the extractive answerer and the router read."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse as sp

from lexgraph.terms import tokenize


class BM25:
    """Okapi BM25 over chunk texts with the term weights precomputed as a sparse matrix.

    idf = ln(1 + (N − df + 0.5)/(df + 0.5)) (never negative), term weight
    idf · tf·(k1+1) / (tf + k1·(1 − b + b·len/avglen)); a query scores the sum over its distinct
    terms, so scoring is one column slice and a row sum.
    """

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75, split_camel_case: bool = True):
        self.k1, self.b, self.split_camel_case = k1, b, split_camel_case
        self.vocabulary: dict[str, int] = {}
        rows, cols, lengths = [], [], []
        for row, text in enumerate(texts):
            tokens = tokenize(text, split_camel_case)
            lengths.append(len(tokens))
            for token in tokens:
                rows.append(row)
                cols.append(self.vocabulary.setdefault(token, len(self.vocabulary)))
        n_docs = len(texts)
        tf = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n_docs, len(self.vocabulary)))
        tf.sum_duplicates()
        length = np.asarray(lengths, dtype=float)
        average = length.mean() if n_docs and length.mean() > 0 else 1.0
        df = np.bincount(tf.indices, minlength=len(self.vocabulary))
        self.idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        norm = np.repeat(k1 * (1 - b + b * length / average), np.diff(tf.indptr))
        weights = tf.data * (k1 + 1) / (tf.data + norm) * self.idf[tf.indices]
        self.weights = sp.csr_matrix((weights, tf.indices, tf.indptr), shape=tf.shape).tocsc()
        self.n_docs = n_docs

    def scores(self, query: str) -> np.ndarray:
        ids = sorted({self.vocabulary[t] for t in tokenize(query, self.split_camel_case) if t in self.vocabulary})
        if not ids:
            return np.zeros(self.n_docs)
        return np.asarray(self.weights[:, ids].sum(axis=1)).ravel()
