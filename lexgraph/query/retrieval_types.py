"""What the retrieval channels, their fusion and the answer layer share: the knobs (RetrievalParams), the loaded
index (RetrievalIndex, with its keyword graph and the lexical graph's statements and entities) and a scored
chunk (Hit). The channels (graph_channels, path_channel, lance_backend) and the retriever that fuses them
(retrieval) import this module; it imports none of them but for types."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import polars as pl
import scipy.sparse as sp

from lexgraph.ids import document_key
from lexgraph.query.bm25 import BM25
from lexgraph.settings import Settings



PREFETCH_ROWS = 40  # the hybrid ranking's best rows, read ahead in one take for the context (lance backend)


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
    (docs/decisions/hybrid-fusion.md has the figures of the alternatives tried)."""

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
# the in-memory index


@dataclass
class KeywordGraph:
    """KET-RAG's keyword side: unit keyword vectors and the keyword→chunk bipartite links."""

    names: list[str]
    position: dict[str, int]
    unit_vectors: np.ndarray  # keywords × dimension, L2-normalised means of sentence embeddings
    links: sp.csr_matrix  # keywords × chunks, 1 where the keyword occurs in the chunk
    idf: np.ndarray  # ln(n_chunks / chunks holding the keyword): rare keywords say more


class ChunkBackend(Protocol):
    """The chunk channels as a backend answers them; each returns a score per chunk row, -inf where none."""

    name: str
    evidence_limit: int | None  # graph-channel chunks re-scored by cosine at most, those with the most evidence

    def dense(self, index: "RetrievalIndex", query_vector: np.ndarray) -> np.ndarray: ...

    def bm25(self, index: "RetrievalIndex", query: str, params: RetrievalParams) -> np.ndarray: ...

    def keyword(self, index: "RetrievalIndex", query: str, query_vector: np.ndarray,
                params: RetrievalParams) -> np.ndarray: ...

    def hybrid(self, index: "RetrievalIndex", texts: list[str], embed_many: Callable[[list[str]], list],
               params: RetrievalParams, parts: int) -> np.ndarray | None:
        """The hybrid ranking of texts[0] and its clauses in one batched pass, or None: fuse channel by channel."""

    def chunk_cosines(self, index: "RetrievalIndex", query_vector: np.ndarray,
                      refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, cosine with the query) of the chunks the lexical graph's refs name; row -1 for a ref the chunk
        table does not hold."""

    def chunk_refs(self, index: "RetrievalIndex", rows) -> list:
        """What the lexical graph names these chunk rows by (rows in memory, chunk ids on LanceDB)."""

    def fetch(self, index: "RetrievalIndex", rows: np.ndarray) -> None:
        """Rows about to be read (the context's best hits): read together where reading costs."""

    def with_params(self, index: "RetrievalIndex", params: RetrievalParams) -> "RetrievalIndex": ...


@dataclass
class RetrievalIndex:
    chunks: pl.DataFrame  # retrieval.CHUNK_COLUMNS; row i is vectors[i]
    vectors: np.ndarray
    bm25: BM25  # a TermStats on the lance backend
    keywords: KeywordGraph | None
    neighbours: sp.csr_matrix | None  # chunk KNN graph (both kinds), row-normalised weights
    pagerank: np.ndarray | None
    settings: Settings | None = None
    position: dict[str, int] = field(default_factory=dict)
    graph: LexicalGraph | None = None  # statements and entities (None parts: no lexical graph)
    # what answers the chunk channels: MemoryBackend (lexgraph.query.memory_backend) over the arrays above, or
    # LanceBackend (lexgraph.query.lance_backend) over LanceDB's indexes; with the latter chunks is a ChunkRows
    # (rows fetched by id), bm25 a sample's TermStats, and no vectors, keywords or graph are held
    backend: ChunkBackend | None = None
    graph_missing: str = ""  # why a lance-backed index has no lexical graph (graph is None), for the answer's log

    @property
    def size(self) -> int:
        return self.chunks.height


# ---------------------------------------------------------------------------------------------
# the in-memory lexical graph (loaded by graph_channels.load_lexical_graph)


class _UnitVectorRows:
    """Nearest rows and cosines over a graph's unit vectors held in memory."""

    unit_vectors: np.ndarray

    def nearest(self, query_vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k rows nearest the query (unordered) and their cosines."""
        similarity = self.unit_vectors @ query_vector.astype(np.float32)
        rows = np.argpartition(-similarity, k - 1)[:k]
        return rows, similarity[rows]

    def similarity(self, query_vector: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.unit_vectors[rows] @ query_vector.astype(np.float32)


@dataclass
class StatementGraph(_UnitVectorRows):
    """Statements with their vectors, chunks and topics, and the fact/entity nodes they share."""

    ids: list[str]
    texts: list[str]
    topics: list[str]
    unit_vectors: np.ndarray  # statements × dimension, L2-normalised
    chunk_rows: np.ndarray  # row of each statement's chunk in RetrievalIndex.chunks
    topic: np.ndarray  # topic number of each statement
    topic_members: sp.csr_matrix  # topics × statements
    links: sp.csr_matrix  # statements × bridging nodes (facts and entities)
    link_members: sp.csr_matrix  # bridging nodes × statements (links transposed)
    link_ids: list[str]
    link_idf: np.ndarray  # ln(1 + statements / statements holding the node), scaled to max 1
    by_chunk: sp.csr_matrix  # chunks × statements
    topic_ids: list[str] | None = None  # each topic number's topic id

    # What the statement channel and the answer layer read, row by row (lexgraph.query.lance_graph answers the
    # same calls from LanceDB tables). Chunk refs are rows of RetrievalIndex.chunks here.

    @property
    def size(self) -> int:
        return len(self.ids)

    def prefetch(self, statements=(), topics=(), links=()) -> None:
        """Rows about to be read one by one: all are in memory already."""

    def topic_of(self, row: int) -> int:
        return int(self.topic[row])

    def links_of(self, row: int) -> np.ndarray:
        return self.links.indices[self.links.indptr[row]:self.links.indptr[row + 1]]

    def link_strength(self, node: int) -> float:
        return float(self.link_idf[node])

    def link_name(self, node: int) -> str:
        return self.link_ids[node]

    def topic_statements(self, topic: int, query_vector=None) -> np.ndarray:
        return self.topic_members.indices[self.topic_members.indptr[topic]:self.topic_members.indptr[topic + 1]]

    def link_statements(self, node: int, query_vector=None) -> np.ndarray:
        return self.link_members.indices[self.link_members.indptr[node]:self.link_members.indptr[node + 1]]

    def chunk_refs(self, rows: np.ndarray) -> np.ndarray:
        return self.chunk_rows[rows]

    def of_chunks(self, refs: list) -> np.ndarray:
        """The statements of these chunks (refs: rows), by row."""
        return np.unique(self.by_chunk[refs].indices)

    def describe(self, rows: np.ndarray, chunks) -> list[tuple[str, str, str, str, str]]:
        """(statement id, text, topic, chunk id, document id) of each row; chunks: RetrievalIndex.chunks."""
        chunk_ids, doc_ids = chunks["chunk_id"], chunks["doc_id"]
        return [(self.ids[s], self.texts[s], self.topics[s], chunk_ids[int(self.chunk_rows[s])],
                 doc_ids[int(self.chunk_rows[s])]) for s in rows.tolist()]


@dataclass
class EntityGraph(_UnitVectorRows):
    """Resolved entities: vectors, verbatim-name keys, the chunks that mention them, their relations."""

    ids: list[str]
    names: list[str]
    unit_vectors: np.ndarray  # entities × dimension
    lookup: dict[str, int]  # compact name key (resolver key without spaces) -> entity
    mentions: sp.csr_matrix  # entities × chunks, 1 where the entity is mentioned in the chunk
    relations: sp.csr_matrix  # entities × entities, each row's relation strengths as shares of 1
    idf: np.ndarray  # ln(chunks / chunks mentioning the entity) + 1

    # What the entity and path channels read, row by row (lexgraph.query.lance_graph answers the same calls from
    # LanceDB tables). Chunk refs are rows of RetrievalIndex.chunks here.

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def has_mentions(self) -> bool:
        return bool(self.mentions.nnz)

    @property
    def has_relations(self) -> bool:
        return bool(self.relations.nnz)

    @property
    def idf_max(self) -> float:
        return float(self.idf.max()) if len(self.idf) else 0.0

    def named(self, keys: list[str]) -> list[int]:
        """The entities these compact name keys name, in the keys' order (unknown keys skipped)."""
        return [self.lookup[key] for key in keys if key in self.lookup]

    def relations_of(self, rows: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each row's related entities and the relation's share of the row's relation strength."""
        out = {}
        for row in rows:
            lo, hi = self.relations.indptr[row], self.relations.indptr[row + 1]
            out[row] = (self.relations.indices[lo:hi], self.relations.data[lo:hi])
        return out

    def chunks_of(self, rows: list[int], query_vector=None) -> list[np.ndarray]:
        """The chunks (refs) each row is mentioned in (all of them: the query vector bounds only a store-backed
        graph's hubs)."""
        return [self.mentions.indices[self.mentions.indptr[r]:self.mentions.indptr[r + 1]] for r in rows]

    def idf_of(self, rows) -> np.ndarray:
        return self.idf[np.asarray(rows, dtype=np.int64)]


@dataclass
class LexicalGraph:
    statements: StatementGraph | None
    entities: EntityGraph | None
    bridge_pair_share: float = 1.0  # see graph_channels.bridge_pair_share(); 1.0 (no selective bridges) without statements
