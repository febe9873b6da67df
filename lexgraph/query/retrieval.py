"""Query channels over an indexed corpus, each giving ranked chunk hits: dense, BM25, KET-RAG's
keyword channel, their fusion, and the lexical graph's statement and entity channels (in
lexgraph.query.graph_channels) and path channel (lexgraph.query.path_channel); the graph channels are not
part of the hybrid's default fusion. What the channels and this module share (the index, the knobs, a hit) is
in lexgraph.query.retrieval_types, BM25 in lexgraph.query.bm25 and the fusion arithmetic in
lexgraph.query.fusion: the channels import those, and this module, which runs and fuses them, imports the
channels.

Why one in-memory view: a benchmark asks hundreds of questions of the same index, so the chunk
vectors, the BM25 weights, the keyword vectors and the keyword→chunk links are read once from
LanceDB and the Extract store, and every query is a few sparse/dense products (numpy/scipy).
Each channel returns a score per chunk (``-inf`` for chunks it did not retrieve), which makes
fusion and graph expansion plain array arithmetic. No Dagster here (DESIGN.md §2).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

import numpy as np
import polars as pl
import scipy.sparse as sp

from lexgraph.indexing import corpus_keywords, corpus_state, knn_state
from lexgraph.query import graph_channels, path_channel
from lexgraph.query.bm25 import BM25, tokenize
from lexgraph.query.memory_backend import MemoryBackend
from lexgraph.query.fusion import ranks_of, reciprocal_rank_fusion, score_fusion
from lexgraph.query.retrieval_types import PREFETCH_ROWS, Hit, KeywordGraph, RetrievalIndex, RetrievalParams
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import KEYWORDS, VectorStore

if TYPE_CHECKING:
    from lexgraph.query import lance_backend

METHODS = ("dense", "bm25", "keyword", "hybrid", "statement", "entity", "path")
DEFAULT_TOP_N = 50
CHUNK_COLUMNS = ("chunk_id", "doc_id", "order", "text", "char_start", "char_end", "token_count", "source_path",
                 "heading_path", "page_start", "page_end")


# ---------------------------------------------------------------------------------------------
# loading the index (the types it loads into: retrieval_types)


class EmptyIndexError(LookupError):
    """Nothing is indexed under these settings yet."""


def index_loader(settings: Settings, vectors: VectorStore | None = None):
    """How queries read this index: (load function, True when it queries LanceDB's search indexes), as the
    query backend setting chooses for this many chunks, so that every command decides the same way.
    EmptyIndexError when there is nothing to query."""
    chunks = (VectorStore(settings.lance_uri) if vectors is None else vectors).count("chunks")
    if chunks == 0:
        raise EmptyIndexError(f"the index {settings.index_dir} is empty")
    lance = settings.uses_lance(chunks)
    return (load_lance_index if lance else load_index), lance


def load_index(settings: Settings, params: RetrievalParams | None = None) -> RetrievalIndex:
    """Read an indexed corpus (LanceDB chunks, keywords, statements and entities, Extract-store keyword
    links and lexical tables, corpus KNN/PageRank files) into memory. Raises ValueError when nothing is
    indexed."""
    params = params or RetrievalParams()
    store = VectorStore(settings.lance_uri)
    chunks, vectors = store.chunk_vectors(CHUNK_COLUMNS)
    if chunks.height == 0:
        raise ValueError(f"{settings.index_dir}: no chunks are indexed; ingest the corpus first")
    position = {chunk: i for i, chunk in enumerate(chunks["chunk_id"].to_list())}
    files = corpus_state.CorpusFiles(settings.index_dir)
    extract = ExtractStore(settings.extract_dir)
    return RetrievalIndex(
        chunks=chunks, vectors=vectors,
        bm25=BM25(chunks["text"].to_list(), params.bm25_k1, params.bm25_b, params.split_camel_case),
        keywords=_load_keywords(store, extract, chunks, position),
        neighbours=_load_neighbours(files, position), pagerank=_load_pagerank(files, position),
        settings=settings, position=position, graph=graph_channels.load_lexical_graph(store, extract, position),
        backend=MemoryBackend())


def load_lance_index(settings: Settings, params: RetrievalParams | None = None,
                     lance_params: "lance_backend.LanceParams | None" = None) -> RetrievalIndex:
    """An index whose semantic channels query LanceDB's ANN and full-text indexes: only each chunk's row id
    and token count are read up front. Raises ValueError when nothing is indexed."""
    from lexgraph.query import lance_backend, lance_graph

    params = params or RetrievalParams()
    store = VectorStore(settings.lance_uri)
    if store.count("chunks") == 0:
        raise ValueError(f"{settings.index_dir}: no chunks are indexed; ingest the corpus first")
    rows, search, terms = lance_backend.load(store, params.bm25_k1, params.bm25_b, params.split_camel_case,
                                             lance_params)
    graph, missing = lance_graph.load_lance_graph(store, corpus_state.CorpusFiles(settings.index_dir),
                                                  search.params)
    return RetrievalIndex(chunks=rows, vectors=None, bm25=terms, keywords=None, neighbours=None, pagerank=None,
                          settings=settings, position=lance_backend.FetchedPositions(rows), graph=graph,
                          backend=lance_backend.LanceBackend(search), graph_missing=missing)


def _load_keywords(store: VectorStore, extract: ExtractStore, chunks: pl.DataFrame,
                   position: dict[str, int]) -> KeywordGraph | None:
    if KEYWORDS not in store.table_names():
        return None
    table = store.db.open_table(KEYWORDS).to_arrow()
    if table.num_rows == 0:
        return None
    names = table.column("keyword").to_pylist()
    matrix = table.column("vector").combine_chunks().values.to_numpy().reshape(table.num_rows, -1).astype(np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    lookup = {name: i for i, name in enumerate(names)}
    links = corpus_keywords.keyword_chunk_links(extract, chunks["doc_id"].unique().to_list())
    links = links.filter(pl.col("keyword").is_in(names) & pl.col("chunk_id").is_in(list(position)))
    rows = [lookup[k] for k in links["keyword"].to_list()]
    cols = [position[c] for c in links["chunk_id"].to_list()]
    graph = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(position)))
    graph.data[:] = 1.0
    df = np.asarray(graph.sum(axis=1)).ravel()
    idf = np.log(len(position) / np.maximum(df, 1)) + 1.0
    return KeywordGraph(names, lookup, matrix, graph, idf)


def _load_neighbours(files: corpus_state.CorpusFiles, position: dict[str, int]) -> sp.csr_matrix | None:
    edges = knn_state.read_edges(files)
    if edges is None or edges.height == 0:
        return None
    # the saved chunks' positions in this index (-1: not loaded here), then the edges between loaded chunks
    here = np.array([position.get(chunk_id, -1) for chunk_id in edges.chunk_ids.tolist()], dtype=np.int64)
    src, dst = here[edges.src], here[edges.dst]
    both = (src >= 0) & (dst >= 0)
    if not bool(both.any()):
        return None
    src, dst, weight = src[both], dst[both], edges.weight[both].astype(float)
    n = len(position)
    graph = sp.csr_matrix((np.concatenate([weight, weight]), (np.concatenate([src, dst]), np.concatenate([dst, src]))),
                          shape=(n, n))
    totals = np.asarray(graph.sum(axis=1)).ravel()
    return sp.diags(1 / np.maximum(totals, 1e-12)) @ graph


def _load_pagerank(files: corpus_state.CorpusFiles, position: dict[str, int]) -> np.ndarray | None:
    if not files.pagerank.exists():
        return None
    frame = pl.read_parquet(files.pagerank)
    scores = np.zeros(len(position))
    for chunk, value in zip(frame["chunk_id"].to_list(), frame["pagerank"].to_list()):
        if chunk in position:
            scores[position[chunk]] = value
    return scores


# ---------------------------------------------------------------------------------------------
# channels


Embed = Callable[[str], np.ndarray]


def dense_scores(index: RetrievalIndex, query_vector: np.ndarray) -> np.ndarray:
    """NaiveRAG: cosine of the query with the chunks (on the lance backend, the ANN index's top hits)."""
    return index.backend.dense(index, query_vector)


def keyword_scores(index: RetrievalIndex, query: str, query_vector: np.ndarray, params: RetrievalParams) -> np.ndarray:
    """KET-RAG's keyword channel: the query's nearest keyword vectors and its own keywords found verbatim, then
    the chunks those keywords link to, ranked by query–chunk cosine plus the keyword evidence."""
    return index.backend.keyword(index, query, query_vector, params)


_CLAUSE_SPLIT = re.compile(r"\b(?:before|after|when|while|once|and)\b", re.IGNORECASE)


def sub_queries(question: str, min_words: int = 3) -> list[str]:
    """LLM-free decomposition of a compound question into its clauses, split at before / after /
    when / while / once / and ("did X before Y?" → X, Y), so that each hop can find its own document. Clauses of fewer than min_words content words are
    dropped; a question with one clause gives []."""
    parts = [p.strip(" ,?.") for p in _CLAUSE_SPLIT.split(question)]
    parts = [p for p in parts if len(tokenize(p, False)) >= min_words]
    return parts if len(parts) > 1 else []


class Retriever:
    """Runs one retrieval method for a query: the query is embedded inside the call, so the
    measured latency of dense, keyword and hybrid includes the embedding, as a user would see it.
    embed_batch, when given, embeds a question and its clauses in one model call."""

    def __init__(self, index: RetrievalIndex, embed: Embed, params: RetrievalParams | None = None,
                 embed_batch: Callable[[list[str]], np.ndarray] | None = None):
        self.index, self.embed, self.params = index, embed, params or RetrievalParams()
        self.embed_batch = embed_batch

    def scores(self, method: str, query: str) -> np.ndarray:
        if method == "bm25":
            return self._bm25(query)
        if method == "hybrid":
            return self._hybrid(query)
        if method not in METHODS:
            raise ValueError(f"unknown retrieval method {method!r}; expected one of {', '.join(METHODS)}")
        query_vector = self.embed(query)
        if method == "dense":
            return dense_scores(self.index, query_vector)
        if method == "statement":
            return graph_channels.statement_scores(self.index, query, query_vector, self.params)
        if method == "entity":
            return graph_channels.entity_scores(self.index, query, query_vector, self.params)
        if method == "path":
            return path_channel.path_scores(self.index, query, query_vector, self.params)
        return keyword_scores(self.index, query, query_vector, self.params)

    def embed_many(self, texts: list[str]) -> list[np.ndarray]:
        if self.embed_batch is not None:
            return list(self.embed_batch(texts))
        return [self.embed(t) for t in texts]

    def _bm25(self, query: str) -> np.ndarray:
        return self.index.backend.bm25(self.index, query, self.params)

    def _channels(self, query: str, query_vector: np.ndarray) -> dict[str, np.ndarray]:
        wanted = {name for name, weight in self.params.fusion_weights if weight}
        out: dict[str, np.ndarray] = {}
        if "dense" in wanted:
            out["dense"] = dense_scores(self.index, query_vector)
        if "bm25" in wanted:
            out["bm25"] = self._bm25(query)
        if "keyword" in wanted:
            out["keyword"] = keyword_scores(self.index, query, query_vector, self.params)
        return out

    def _fuse(self, query: str, query_vector: np.ndarray) -> list[tuple[np.ndarray, float]]:
        channels = self._channels(query, query_vector)
        return [(channels[name], weight) for name, weight in self.params.fusion_weights if weight]

    def _hybrid(self, query: str) -> np.ndarray:
        p = self.params
        parts = sub_queries(query) if p.decompose else []
        texts = [query, *parts]
        backend = self.index.backend
        batched = backend.hybrid(self.index, texts, self.embed_many, p, len(parts))
        if batched is not None:
            return batched
        vectors = self.embed_many(texts)
        per_text = [self._fuse(text, vector) for text, vector in zip(texts, vectors)]
        rankings = per_text[0]
        for ranking in per_text[1:]:
            rankings += [(s, w * p.decompose_weight / len(parts)) for s, w in ranking]
        if p.fusion == "score":
            fused = score_fusion(rankings, self.index.size, p.fusion_depth)
        else:
            fused = reciprocal_rank_fusion(rankings, self.index.size, p.rrf_k, p.fusion_depth)
        fused = self._expand(fused)
        backend.fetch(self.index, ranks_of(fused, PREFETCH_ROWS)[0])  # the context reads the best of these
        return fused

    def _expand(self, fused: np.ndarray) -> np.ndarray:
        """Graph channel: pass a share of each hit's fused score to its KNN neighbours, and add a
        PageRank prior; both off unless tuned on (measured in docs/decisions/hybrid-fusion.md)."""
        p = self.params
        finite = np.isfinite(fused)
        if not finite.any():
            return fused
        base = np.where(finite, fused, 0.0)
        out = base.copy()
        if p.neighbour_weight and self.index.neighbours is not None:
            out += p.neighbour_weight * (self.index.neighbours.T @ base)
        if p.pagerank_weight and self.index.pagerank is not None:
            prior = self.index.pagerank / max(self.index.pagerank.max(), 1e-12)
            out += p.pagerank_weight * base.max() * prior * (out > 0)
        out[out <= 0] = -np.inf
        return out

    def search(self, method: str, query: str, top_n: int = DEFAULT_TOP_N) -> list[Hit]:
        return self.hits(self.scores(method, query), top_n)

    def hits(self, scores: np.ndarray, top_n: int = DEFAULT_TOP_N) -> list[Hit]:
        rows, _ = ranks_of(scores, top_n)
        chunks = self.index.chunks
        self.index.backend.fetch(self.index, rows)
        out = []
        for rank, row in enumerate(rows.tolist(), 1):
            r = chunks.row(row, named=True)
            out.append(Hit(r["chunk_id"], r["doc_id"], float(scores[row]), r["text"], int(r["char_start"]),
                           int(r["char_end"]), int(r["token_count"]), r["source_path"], rank,
                           r.get("heading_path") or "", r.get("page_start"), r.get("page_end")))
        return out


def with_params(retriever: Retriever, **changes) -> Retriever:
    """The same index with other knobs (BM25 is rebuilt only when its own knobs change)."""
    params = replace(retriever.params, **changes)
    index = retriever.index.backend.with_params(retriever.index, params)
    return Retriever(index, retriever.embed, params, retriever.embed_batch)
