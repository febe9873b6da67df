"""Query channels over an indexed corpus, each giving ranked chunk hits: dense, BM25, KET-RAG's
keyword channel, their fusion, and the lexical graph's statement and entity channels (in
lexgraph.query.graph_channels) and path channel (lexgraph.query.path_channel); the graph channels are not
part of the hybrid's default fusion.

Why one in-memory view: a benchmark asks hundreds of questions of the same index, so the chunk
vectors, the BM25 weights, the keyword vectors and the keyword→chunk links are read once from
LanceDB and the Extract store, and every query is a few sparse/dense products (numpy/scipy).
Each channel returns a score per chunk (``-inf`` for chunks it did not retrieve), which makes
fusion and graph expansion plain array arithmetic. No Dagster here (DESIGN.md §2).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import polars as pl
import scipy.sparse as sp

from lexgraph.indexing import corpus_index as ci
from lexgraph.evaluation.metrics import document_key
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.extract.keywords import STOPWORDS, sentence_keywords
from lexgraph.query import graph_channels, path_channel

if TYPE_CHECKING:
    from lexgraph.query import lance_backend
from lexgraph.settings import Settings
from lexgraph.storage.vector_store import KEYWORDS, VectorStore

METHODS = ("dense", "bm25", "keyword", "hybrid", "statement", "entity", "path")
DEFAULT_TOP_N = 50
PREFETCH_ROWS = 40  # the lance backend's hybrid ranking: rows read ahead in one take for the context
_TOKEN = re.compile(r"[^\W_]+")
# "WolfgangSchulz" (a chat speaker) and "Wolfgang" (in the question) must meet: split camel case.
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
CHUNK_COLUMNS = ("chunk_id", "doc_id", "order", "text", "char_start", "char_end", "token_count", "source_path",
                 "heading_path", "page_start", "page_end")


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk, with what a citation needs: its document and character span."""

    chunk_id: str
    doc_id: str
    score: float
    text: str
    char_start: int
    char_end: int
    token_count: int
    source_path: str
    rank: int = 0
    heading_path: str = ""
    page_start: int | None = None  # pages where the format has them (PDF pages, PPTX slides)
    page_end: int | None = None

    @property
    def citation(self) -> str:
        """``report.pdf p. 3 [chars 120–480]``: what a reader needs to find the passage."""
        pages = ""
        if self.page_start is not None:
            pages = f" p. {self.page_start}" if self.page_end in (None, self.page_start) else \
                f" pp. {self.page_start}–{self.page_end}"
        return f"{self.source_path}{pages} [chars {self.char_start}–{self.char_end}]"

    @property
    def doc_key(self) -> str:
        """The document as evidence ids name it (file name without extension)."""
        return document_key(self.source_path)


@dataclass(frozen=True)
class RetrievalParams:
    """Every knob of the channels. The defaults were tuned on LiHua-World's dev questions only
    (docs/BENCH_RETRIEVAL.md has the figures of the alternatives tried)."""

    bm25_k1: float = 1.2  # Okapi defaults: k1 0.9–2.0 × b 0.4–1.0 moved BM25 recall@5 by ≤ 0.016, no consistent way
    bm25_b: float = 0.75
    split_camel_case: bool = True  # +0.015 Single / +0.056 Multi recall@5 for the hybrid
    keyword_top: int = 20  # keywords taken by query↔keyword-vector similarity
    keyword_exact_weight: float = 1.0  # weight of a query keyword found verbatim in the vocabulary
    keyword_evidence_weight: float = 0.5  # λ in cos(q, chunk) + λ·evidence/max(evidence)
    fusion: str = "score"  # score (weighted sum of min-max-normalised channel scores) | rrf
    rrf_k: float = 60.0
    fusion_depth: int = 30  # ranks of each channel that enter the fusion
    fusion_weights: tuple[tuple[str, float], ...] = (("dense", 0.5), ("bm25", 1.0), ("keyword", 0.5))
    neighbour_weight: float = 0.0  # KNN expansion: share of a hit's score passed to its neighbours
    pagerank_weight: float = 0.0  # prior added to fused scores, in units of the top fused score
    decompose: bool = True  # also retrieve for the clauses of compound questions (sub_queries)
    decompose_weight: float = 1.0  # the clauses together weigh as much as the whole question
    # the lexical graph's channels (lexgraph.query.graph_channels), tuned on LiHua-World and MuSiQue dev together
    entity_top: int = 20  # entities taken by query↔entity-vector similarity
    entity_exact_weight: float = 1.0  # weight of an entity named verbatim in the query
    entity_hop_weight: float = 0.3  # share of an entity's weight passed along its relations (one hop)
    entity_neighbours: int = 20  # neighbouring entities added at most
    entity_evidence_weight: float = 0.25  # λ in cos(q, chunk) + λ·evidence/max(evidence)
    statement_top: int = 50  # seed statements by query↔statement-vector similarity
    statement_hops: int = 2  # traversal hops from the seeds (topics in a source, facts/entities across sources)
    statement_nodes: int = 100  # bridging nodes (topics, facts, entities) expanded at most, all hops together
    statement_limit: int = 300  # statements scored at most, seeds included
    statement_topic_weight: float = 0.5  # weight of a statement reached through its topic
    statement_link_weight: float = 0.5  # weight of a statement reached through a shared fact or entity
    statement_sum_weight: float = 0.1  # a chunk's score: best statement + this × the sum of its others
    statement_dense_weight: float = 1.0  # + this × query–chunk cosine
    # path channel (lexgraph.query.path_channel): entity paths toward the answer type, tuned on LiHua-World and
    # MuSiQue dev together (recall@5 Single / Multi, coverage@12k): these 0.858 / 0.597, 0.720; path_hops=1
    # 0.842 / 0.590, 0.740; hop decay 0.7, type bonus 0.5, self weight 0.5: 0.834 / 0.575, 0.704
    path_start_top: int = 10  # start entities taken by query↔entity-vector similarity (plus verbatim names)
    path_exact_weight: float = 1.0  # weight of a start entity named verbatim in the query
    path_hops: int = 2  # hops along relations (1–2; at most 3 are ever expanded)
    path_fanout: int = 20  # strongest relations followed from each node
    path_beam: int = 50  # partial paths carried to the next hop
    path_max_paths: int = 200  # paths kept in all (start entities' 0-hop paths included)
    path_hop_decay: float = 0.3  # a 2-hop path's score × this
    path_type_bonus: float = 1.0  # added to the end entity's relevance when its type fits the question word
    path_bridge_bonus: float = 0.5  # × its start weight, when a path ends at another of the query's entities
    path_self_weight: float = 2.0  # weight of the start entities themselves as 0-hop paths (0: off)
    path_start_share: float = 0.5  # role weights of a path's entities in a chunk: end 1, start this,
    path_mid_share: float = 0.5  # middle this
    path_sum_weight: float = 0.1  # a chunk's evidence: best path + this × the sum of the others
    path_evidence_weight: float = 0.25  # λ in cos(q, chunk) + λ·evidence/max(evidence)


# ---------------------------------------------------------------------------------------------
# BM25


def tokenize(text: str, split_camel_case: bool = True) -> list[str]:
    """Lowercase alphanumeric tokens without stopwords; camel-case words also give their parts."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text):
        word = match.group()
        lowered = word.lower()
        if lowered not in STOPWORDS:
            tokens.append(lowered)
        if split_camel_case and _CAMEL.search(word):
            tokens.extend(p.lower() for p in _CAMEL.split(word) if p.lower() not in STOPWORDS)
    return tokens


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


# ---------------------------------------------------------------------------------------------
# the in-memory index


@dataclass
class KeywordGraph:
    """KET-RAG's keyword side: unit keyword vectors and the keyword→chunk bipartite links."""

    names: list[str]
    position: dict[str, int]
    unit_vectors: np.ndarray  # keywords × dimension, L2-normalised means of sentence embeddings
    links: sp.csr_matrix  # keywords × chunks, 1 where the keyword occurs in the chunk
    idf: np.ndarray  # ln(n_chunks / chunks holding the keyword): rare keywords say more


@dataclass
class RetrievalIndex:
    chunks: pl.DataFrame  # CHUNK_COLUMNS; row i is vectors[i]
    vectors: np.ndarray
    bm25: BM25
    keywords: KeywordGraph | None
    neighbours: sp.csr_matrix | None  # chunk KNN graph (both kinds), row-normalised weights
    pagerank: np.ndarray | None
    settings: Settings | None = None
    position: dict[str, int] = field(default_factory=dict)
    graph: graph_channels.LexicalGraph | None = None  # statements and entities (None parts: no lexical graph)
    # the lance backend (lexgraph.query.lance_backend): channels answered by LanceDB's indexes; then chunks
    # is a ChunkRows (rows fetched by id), bm25 a sample's TermStats, and no vectors, keywords or graph are held
    lance: "lance_backend.LanceSearch | None" = None

    @property
    def size(self) -> int:
        return self.chunks.height


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
    files = ci.CorpusFiles(settings.index_dir)
    extract = ExtractStore(settings.extract_dir)
    return RetrievalIndex(
        chunks=chunks, vectors=vectors,
        bm25=BM25(chunks["text"].to_list(), params.bm25_k1, params.bm25_b, params.split_camel_case),
        keywords=_load_keywords(store, extract, chunks, position),
        neighbours=_load_neighbours(files, position), pagerank=_load_pagerank(files, position),
        settings=settings, position=position, graph=graph_channels.load_lexical_graph(store, extract, position))


def load_lance_index(settings: Settings, params: RetrievalParams | None = None,
                     lance_params: "lance_backend.LanceParams | None" = None) -> RetrievalIndex:
    """An index whose semantic channels query LanceDB's ANN and full-text indexes: only each chunk's row id
    and token count are read up front. Raises ValueError when nothing is indexed."""
    from lexgraph.query import lance_backend

    params = params or RetrievalParams()
    store = VectorStore(settings.lance_uri)
    if store.count("chunks") == 0:
        raise ValueError(f"{settings.index_dir}: no chunks are indexed; ingest the corpus first")
    rows, search, terms = lance_backend.load(store, params.bm25_k1, params.bm25_b, params.split_camel_case,
                                             lance_params)
    return RetrievalIndex(chunks=rows, vectors=None, bm25=terms, keywords=None, neighbours=None, pagerank=None,
                          settings=settings, position=lance_backend.FetchedPositions(rows), lance=search)


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
    links = ci.keyword_chunk_links(extract, chunks["doc_id"].unique().to_list())
    links = links.filter(pl.col("keyword").is_in(names) & pl.col("chunk_id").is_in(list(position)))
    rows = [lookup[k] for k in links["keyword"].to_list()]
    cols = [position[c] for c in links["chunk_id"].to_list()]
    graph = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(position)))
    graph.data[:] = 1.0
    df = np.asarray(graph.sum(axis=1)).ravel()
    idf = np.log(len(position) / np.maximum(df, 1)) + 1.0
    return KeywordGraph(names, lookup, matrix, graph, idf)


def _load_neighbours(files: ci.CorpusFiles, position: dict[str, int]) -> sp.csr_matrix | None:
    edges = ci.read_edges(files)
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


def _load_pagerank(files: ci.CorpusFiles, position: dict[str, int]) -> np.ndarray | None:
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
    """NaiveRAG: cosine of the query with every chunk (vectors are L2-normalised); on the lance backend,
    with the ANN index's top hits."""
    if index.lance is not None:
        return spread(index.size, *index.lance.dense(query_vector))
    return index.vectors @ query_vector


def spread(size: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A channel's few hits as a score per chunk (-inf for the others)."""
    scores = np.full(size, -np.inf)
    scores[rows] = values
    return scores


def keyword_scores(index: RetrievalIndex, query: str, query_vector: np.ndarray, params: RetrievalParams) -> np.ndarray:
    """KET-RAG's keyword channel: the query's nearest keyword vectors and its own keywords found
    verbatim, then the chunks those keywords link to, ranked by query–chunk cosine plus the keyword
    evidence (Σ keyword weight × idf over the chunk's matched keywords, scaled to [0, 1])."""
    if index.lance is not None:
        return spread(index.size, *index.lance.keyword(query, query_vector, params.keyword_top,
                                                       params.keyword_exact_weight, params.keyword_evidence_weight))
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


def ranks_of(scores: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk rows, 1-based ranks) of the best `depth` retrieved chunks, best first."""
    finite = np.flatnonzero(np.isfinite(scores))
    if not len(finite):
        return finite, finite
    depth = min(depth, len(finite))
    best = finite[np.argpartition(-scores[finite], depth - 1)[:depth]]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best, np.arange(1, len(best) + 1)


def rank_shares(count: int, weight: float, k: float) -> np.ndarray:
    """What a channel's `count` best hits (best first) add to reciprocal rank fusion: weight / (k + rank)."""
    return weight / (k + np.arange(1, count + 1))


def score_shares(scores: np.ndarray, weight: float) -> np.ndarray:
    """What a channel's best hits (their scores, best first) add to score fusion: weight × their place between
    the last (0) and the first (1), plus a floor share so that the last still counts."""
    first, floor = scores[0], scores[-1]
    span = first - floor if first > floor else 1.0
    return weight * (scores - floor) / span + weight * 1e-6


def reciprocal_rank_fusion(rankings: Sequence[tuple[np.ndarray, float]], size: int, k: float, depth: int) -> np.ndarray:
    """Σ weight / (k + rank) over channels: robust to channels whose scores are on other scales."""
    fused = np.zeros(size)
    for scores, weight in rankings:
        rows, _ = ranks_of(scores, depth)
        fused[rows] += rank_shares(len(rows), weight, k)
    fused[fused == 0] = -np.inf
    return fused


def score_fusion(rankings: Sequence[tuple[np.ndarray, float]], size: int, depth: int) -> np.ndarray:
    """Σ weight · score/max(score) over each channel's top `depth`: keeps how much better a
    channel's first hit is than its tenth, which rank fusion throws away."""
    fused = np.zeros(size)
    for scores, weight in rankings:
        rows, _ = ranks_of(scores, depth)
        if len(rows):
            fused[rows] += score_shares(scores[rows], weight)
    fused[fused == 0] = -np.inf
    return fused


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
        if self.index.lance is not None:
            tokens = tokenize(query, self.params.split_camel_case)
            return spread(self.index.size, *self.index.lance.fts(query, tokens))
        scores = self.index.bm25.scores(query)
        scores[scores <= 0] = -np.inf
        return scores

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
        lance = self.index.lance
        if lance is not None and lance.params.batched:  # every text's channels in batched LanceDB queries
            rows, values = lance.hybrid(texts, self.embed_many, p, len(parts))
            self.index.chunks.fetch(rows[:PREFETCH_ROWS])  # what the context reads first: one take
            return spread(self.index.size, rows, values)
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
        if self.index.lance is not None:  # the context reads the best of these: one LanceDB take, not one each
            self.index.chunks.fetch(ranks_of(fused, PREFETCH_ROWS)[0])
        return fused

    def _expand(self, fused: np.ndarray) -> np.ndarray:
        """Graph channel: pass a share of each hit's fused score to its KNN neighbours, and add a
        PageRank prior; both off unless tuned on (they are measured in docs/BENCH_RETRIEVAL.md)."""
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
        if self.index.lance is not None:
            chunks.fetch(rows)
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
    index = retriever.index
    if index.lance is None and (params.bm25_k1, params.bm25_b, params.split_camel_case) != (
            index.bm25.k1, index.bm25.b, index.bm25.split_camel_case):
        index = replace(index, bm25=BM25(index.chunks["text"].to_list(), params.bm25_k1, params.bm25_b,
                                         params.split_camel_case))
    return Retriever(index, retriever.embed, params, retriever.embed_batch)
