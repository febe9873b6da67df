"""The memory backend of the chunk channels: the index's vectors, BM25 weights and keyword graph held in memory
(retrieval.load_index), every query a few dense/sparse products. The lance backend
(lexgraph.query.lance_backend.LanceBackend) answers the same calls from LanceDB's indexes; the retriever and
the engine call either through RetrievalIndex.backend and never ask which it is."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from lexgraph.extract.keywords import sentence_keywords
from lexgraph.query import graph_channels
from lexgraph.query.bm25 import BM25
from lexgraph.query.retrieval_types import RetrievalIndex, RetrievalParams


class MemoryBackend:
    name = "memory"
    evidence_limit = None  # every chunk with evidence is re-scored: its vector is at hand

    def dense(self, index: RetrievalIndex, query_vector: np.ndarray) -> np.ndarray:
        """Cosine of the query with every chunk (vectors are L2-normalised)."""
        return index.vectors @ query_vector

    def bm25(self, index: RetrievalIndex, query: str, params: RetrievalParams) -> np.ndarray:
        scores = index.bm25.scores(query)
        scores[scores <= 0] = -np.inf
        return scores

    def keyword(self, index: RetrievalIndex, query: str, query_vector: np.ndarray,
                params: RetrievalParams) -> np.ndarray:
        """The query's nearest keyword vectors and its own keywords found verbatim, then the chunks those
        keywords link to, ranked by query–chunk cosine plus the keyword evidence (Σ keyword weight × idf over
        the chunk's matched keywords, scaled to [0, 1])."""
        graph = index.keywords
        scores = np.full(index.size, -np.inf)
        if graph is None:
            return scores
        similarity = graph.unit_vectors @ query_vector
        weights = np.zeros(len(graph.names))
        top = min(params.keyword_top, len(graph.names))
        if top:
            chosen = np.argpartition(-similarity, top - 1)[:top]
            weights[chosen] = np.clip(similarity[chosen], 0, None)
        for keyword in sentence_keywords(query):
            if keyword in graph.position:
                i = graph.position[keyword]
                weights[i] = max(weights[i], params.keyword_exact_weight)
        active = np.flatnonzero(weights)
        if not len(active):
            return scores
        evidence = graph.links[active].T @ (weights[active] * graph.idf[active])
        return graph_channels.rerank_by_evidence(index, query_vector, evidence, params.keyword_evidence_weight)

    def hybrid(self, index: RetrievalIndex, texts: list[str], embed_many, params: RetrievalParams,
               parts: int) -> None:
        """No batched pass: the retriever fuses the channels text by text."""
        return None

    def chunk_cosines(self, index: RetrievalIndex, query_vector: np.ndarray,
                      refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows and query cosines of these chunks; the memory graph's chunk refs are rows already."""
        rows = np.asarray(refs, dtype=np.int64)
        return rows, index.vectors[rows] @ query_vector

    def chunk_refs(self, index: RetrievalIndex, rows) -> list[int]:
        """The memory graph's refs of these chunk rows: the rows."""
        return [int(r) for r in rows]

    def fetch(self, index: RetrievalIndex, rows: np.ndarray) -> None:
        """Rows about to be read: all are in memory already."""

    def with_params(self, index: RetrievalIndex, params: RetrievalParams) -> RetrievalIndex:
        """The index for other knobs: BM25 rebuilt when its own knobs changed."""
        if (params.bm25_k1, params.bm25_b, params.split_camel_case) == (
                index.bm25.k1, index.bm25.b, index.bm25.split_camel_case):
            return index
        return replace(index, bm25=BM25(index.chunks["text"].to_list(), params.bm25_k1, params.bm25_b,
                                        params.split_camel_case))
