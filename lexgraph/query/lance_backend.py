"""The query side at scale: the semantic channels answered by LanceDB's own indexes instead of arrays held in
the process (LEXGRAPH_QUERY_BACKEND=lance, or auto from LEXGRAPH_LANCE_THRESHOLD chunks on).

- dense: the ANN vector index (IVF_PQ, cosine; nprobes partitions searched, refine_factor × k candidates
  re-scored on their stored vectors);
- bm25: LanceDB's native full-text index (its own BM25 and tokenizer: stemmed, stopwords dropped, so its
  ranking is close to, not the same as, the in-memory BM25);
- keyword: the query's nearest keyword vectors and verbatim keywords, their links read from the
  keyword_links table (BTREE on keyword), the linked chunks' vectors fetched by id and re-scored as in
  memory (cos + λ·evidence/max), on the KEYWORD_CANDIDATES chunks with the most evidence.

Each channel returns its top few hundred hits as row numbers into the chunk table's scan order, so the
context and answer code keep working on score arrays of N floats. The hybrid ranking (`hybrid`) runs a
question's and its clauses' channels together: one multi-vector ANN query for every text's dense hits, one
for their nearest keywords, one read of all their keyword links and one fetch of all their candidate
vectors, the full-text queries side by side; it fuses on the hits (a few hundred rows), not on arrays of N.
Queries project `_rowid` (and the score) explicitly: an empty projection made LanceDB read every column of
each hit (dense 28 → 12 ms, full text 21 → 3 ms at 1M chunks), and a projection without `_distance` logs a
deprecation warning on every vector query. What the process holds: each
row's LanceDB row id and token count (12 bytes a chunk), rows fetched for answers (bounded cache), and the
idf of terms in a sample of chunk texts (what the extractive answerer weighs question words by). No
vectors: nothing of size N × dimension. The graph channels (statements, entities, paths) are not loaded.
Without an index LanceDB searches flat: slower, still exact; `/health` says which indexes are missing or
stale."""
from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from lexgraph.extract.keywords import sentence_keywords
from lexgraph.query.bm25 import tokenize
from lexgraph.query.fusion import rank_shares, score_shares, spread
from lexgraph.query.retrieval_types import PREFETCH_ROWS
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.vector_store import CHUNKS, KEYWORDS, SEARCH_TEXT, VectorStore, _in_list

Hits = tuple[np.ndarray, np.ndarray]  # (rows, scores)
# the full-text and dense queries of a hybrid ranking run here beside its keyword channel (LanceDB releases
# the GIL); the tasks never submit to it
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lance-query")
ROW_COLUMNS = ["chunk_id", "doc_id", "text", "char_start", "char_end", "token_count", "source_path", "heading_path",
               "page_start", "page_end"]


@dataclass(frozen=True)
class LanceParams:
    # hits taken from each channel: the hybrid fuses the top 30 of each (RetrievalParams.fusion_depth)
    candidates: int = 50
    # at 100k synthetic chunks: nprobes 40, refine 10 → recall@10 0.98 in 11 ms; 20/5 → 0.94 in 8 ms; limit 200
    # (not 50) cost 47 ms
    nprobes: int = 40  # IVF partitions searched (of ≈ √N), at least
    # ... or this share of the partitions, if more: at 1M synthetic chunks (1,000 partitions) 80 probes gave
    # recall@10 0.950 in 14 ms against 0.926 in 12 ms with 40 (refine 10, limit 50)
    probe_share: float = 0.08
    refine_factor: int = 10  # PQ candidates re-scored on their stored vectors: refine_factor × candidates
    batched: bool = True  # the hybrid's clauses in batched queries (False: one retrieval per clause, as before)
    term_sample: int = 5000  # chunk texts the answerer's idf is estimated from
    # chunks with the most keyword evidence re-scored by cosine: the graph channels' bound; at 100 the keyword
    # channel's top 10 equalled the memory backend's on 35 of 50 MuSiQue questions, at 500 on 45 (as unbounded)
    keyword_candidates: int = 500
    evidence_candidates: int = 500  # the graph channels' chunks with the most evidence re-scored by cosine
    row_cache: int = 20_000  # fetched chunk rows kept


class TermStats:
    """What the answerer reads of BM25 (vocabulary, idf, k1, b, split_camel_case), from a sample of chunk
    texts: document frequencies scaled to the whole table. Terms outside the sample count as rare."""

    def __init__(self, texts: list[str], k1: float, b: float, split_camel_case: bool):
        self.k1, self.b, self.split_camel_case = k1, b, split_camel_case
        df = Counter(t for text in texts for t in set(tokenize(text, split_camel_case)))
        self.vocabulary = {term: i for i, term in enumerate(df)}
        n = max(len(texts), 1)
        counts = np.fromiter(df.values(), dtype=float, count=len(df))
        self.idf = np.log1p((n - counts + 0.5) / (counts + 0.5))
        self.n_docs = n


class ChunkRows:
    """Stands in for the in-memory chunk frame: `height`, `["token_count"]` (held) and `row(i)` (fetched from
    LanceDB by row id, cached). Row i is the i-th row of the chunk table's scan at load."""

    def __init__(self, table, rowids: np.ndarray, token_count: np.ndarray, cache_size: int):
        self.table, self.rowids, self.token_count = table, rowids, token_count
        self.height = len(rowids)
        self._cache: OrderedDict[int, dict] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.ids: dict[str, int] = {}  # chunk id -> row, for every row fetched (the context orders by it)

    def __getitem__(self, column: str):
        if column == "token_count":
            return self.token_count
        raise KeyError(f"column {column!r} is not held in memory on the lance query backend; fetch rows by id")

    def __len__(self) -> int:
        return self.height

    def fetch(self, rows) -> None:
        """Read these rows in one LanceDB take (the ones not cached yet)."""
        with self._lock:
            missing = sorted({int(r) for r in rows} - set(self._cache))
        if not missing:
            return
        found = self.table.take_row_ids([int(self.rowids[r]) for r in missing]).select(ROW_COLUMNS).with_row_id() \
            .to_arrow()
        records = found.to_pylist()
        positions = np.searchsorted(self.rowids, np.asarray(found.column("_rowid").to_pylist(), dtype=np.uint64))
        with self._lock:
            for row, record in zip(positions.tolist(), records):
                record.pop("_rowid", None)
                self._cache[row] = record
                self.ids[record["chunk_id"]] = row
            while len(self._cache) > self._cache_size:
                _, old = self._cache.popitem(last=False)
                self.ids.pop(old["chunk_id"], None)

    def row(self, row: int, named: bool = True) -> dict:
        row = int(row)
        with self._lock:
            record = self._cache.get(row)
        if record is None:
            self.fetch([row])
            with self._lock:
                record = self._cache.get(row)
        if record is None:
            raise LookupError(f"chunk row {row} is no longer in the chunk table (the index changed under the query)")
        return record


class FetchedPositions(Mapping):
    """chunk id -> row, for the rows fetched so far (what the context builder looks its items up in)."""

    def __init__(self, rows: ChunkRows):
        self.rows = rows

    def __getitem__(self, chunk_id: str) -> int:
        return self.rows.ids[chunk_id]

    def __iter__(self):
        return iter(list(self.rows.ids))

    def __len__(self) -> int:
        return len(self.rows.ids)


class LanceSearch:
    """The semantic channels over LanceDB's indexes; every method returns (rows, scores), best first."""

    def __init__(self, store: VectorStore, rows: ChunkRows, params: LanceParams):
        self.store, self.rows, self.params = store, rows, params
        self.chunks = store.db.open_table(CHUNKS)
        names = store.table_names()
        self.keywords = store.db.open_table(KEYWORDS) if KEYWORDS in names else None
        self.links = store.db.open_table(li.KEYWORD_LINKS) if li.KEYWORD_LINKS in names else None
        self.states = li.chunk_index_states(store)
        ann = self.states[li.ANN_INDEX]
        partitions = li.ann_partitions(ann.indexed) if ann.indexed else 0
        self.nprobes = max(params.nprobes, math.ceil(params.probe_share * partitions))
        # the keyword vectors' ANN index, searched as the chunks' is (its own probe share, PQ refined)
        self.keyword_probe = li.ann_probe(self.keywords, li.KEYWORD_ANN, params.nprobes, params.probe_share,
                                          params.refine_factor) if self.keywords is not None else None

    def _rows(self, rowids) -> tuple[np.ndarray, np.ndarray]:
        """(rows, mask of the row ids found): a row id missing from the scan at load (the table changed
        since) is dropped rather than mapped to the wrong chunk."""
        rowids = np.asarray(rowids, dtype=np.uint64)
        position = np.searchsorted(self.rows.rowids, rowids)
        position = np.minimum(position, max(self.rows.height - 1, 0))
        found = self.rows.rowids[position] == rowids if self.rows.height else np.zeros(len(rowids), bool)
        return position[found], found

    def _ranked(self, result, scores: np.ndarray, mask: np.ndarray | None = None) -> Hits:
        rowids = result.column("_rowid").to_numpy()
        if mask is not None:
            rowids, scores = rowids[mask], scores[mask]
        rows, found = self._rows(rowids)
        return rows, scores[found]

    def dense(self, query_vector: np.ndarray, k: int | None = None) -> Hits:
        return self.dense_many([query_vector], k)[0]

    def dense_many(self, vectors: list[np.ndarray], k: int | None = None) -> list[Hits]:
        """Each vector's ANN hits, all in one LanceDB query (the same hits as one query each)."""
        if not vectors:
            return []
        k = k or self.params.candidates
        batch = [v.astype(np.float32) for v in vectors]
        query = self.chunks.search(batch if len(batch) > 1 else batch[0]).distance_type("cosine").limit(k) \
            .nprobes(self.nprobes).select(["_rowid", "_distance"])
        if self.states[li.ANN_INDEX].kind == "IVF_PQ":
            query = query.refine_factor(self.params.refine_factor)
        result = query.to_arrow()
        scores = 1.0 - result.column("_distance").to_numpy().astype(float)
        return [self._ranked(result, scores, mask) for mask in _per_query(result, len(batch))]

    def fts(self, text: str, tokens: list[str], k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Full-text hits for the query's tokens: lexgraph.terms', as the chunks' search_text holds them, so the
        scores are the memory BM25's terms (and punctuation never reaches the query parser); none without a
        full-text index (LanceDB has no flat full-text search)."""
        if not tokens or not self.states[li.FTS_INDEX].present:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        result = self.chunks.search(" ".join(dict.fromkeys(tokens)), query_type="fts", fts_columns=SEARCH_TEXT) \
            .limit(k or self.params.candidates).select(["_rowid", "_score"]).to_arrow()
        return self._ranked(result, result.column("_score").to_numpy().astype(float))

    def keyword(self, query: str, query_vector: np.ndarray, keyword_top: int, exact_weight: float,
                evidence_weight: float) -> Hits:
        """KET-RAG's keyword channel as in memory, its links and chunk vectors read for this query only."""
        return self.keyword_many([query], [query_vector], keyword_top, exact_weight, evidence_weight)[0]

    def keyword_many(self, queries: list[str], vectors: list[np.ndarray], keyword_top: int, exact_weight: float,
                     evidence_weight: float) -> list[Hits]:
        """The keyword channel of several queries: one nearest-keyword query, one read of their links, one
        fetch of their candidate chunks' vectors; each query's hits as `keyword` would give them."""
        empty = np.zeros(0, dtype=np.int64), np.zeros(0)
        if self.keywords is None or self.links is None or not queries:
            return [empty for _ in queries]
        links, weights = self._keyword_links(queries, vectors, keyword_top, exact_weight)
        n = max(self.rows.height, 1)
        evidence = []
        for query_weights in weights:
            if not query_weights:
                evidence.append(None)
                continue
            evidence.append(links.filter(pl.col("keyword").is_in(list(query_weights))).with_columns(
                (pl.col("keyword").replace_strict(query_weights, return_dtype=pl.Float64)
                 * ((n / pl.col("chunk_count").clip(1)).log() + 1.0)).alias("e")
            ).explode("chunk_ids").group_by("chunk_ids").agg(pl.col("e").sum()).sort(
                ["e", "chunk_ids"], descending=[True, False]).head(self.params.keyword_candidates))
        wanted = list(dict.fromkeys(c for e in evidence if e is not None for c in e["chunk_ids"].to_list()))
        if not wanted:
            return [empty for _ in queries]
        found = self.chunks.search().where(_in_list("chunk_id", wanted)).select(
            ["chunk_id", "vector", "_rowid"]).limit(len(wanted)).to_arrow()
        if found.num_rows == 0:
            return [empty for _ in queries]
        matrix = found.column("vector").combine_chunks().values.to_numpy().reshape(found.num_rows, -1)
        rows, present = self._rows(found.column("_rowid").to_numpy())
        row_of = np.full(found.num_rows, -1, dtype=np.int64)  # -1: not in the scan at load (table changed)
        row_of[present] = rows
        at = {c: i for i, c in enumerate(found.column("chunk_id").to_pylist())}
        out = []
        for e, vector in zip(evidence, vectors):
            picked = [(at[c], s) for c, s in zip(e["chunk_ids"].to_list(), e["e"].to_list()) if c in at] \
                if e is not None else []
            if not picked:
                out.append(empty)
                continue
            index = np.array([i for i, _ in picked])
            strength = np.array([s for _, s in picked])
            scores = matrix[index] @ vector + evidence_weight * strength / strength.max()
            keep = row_of[index] >= 0
            out.append((row_of[index][keep], scores[keep]))
        return out

    def _keyword_links(self, queries: list[str], vectors: list[np.ndarray], top: int,
                       exact_weight: float) -> tuple[pl.DataFrame, list[dict[str, float]]]:
        """The links of the queries' nearest keywords and of their own keywords found verbatim (one read),
        and per query each keyword's weight: its cosine with the query, or exact_weight when named verbatim."""
        weights: list[dict[str, float]] = [{} for _ in queries]
        if top:
            batch = [v.astype(np.float32) for v in vectors]
            near = self.keyword_probe.apply(self.keywords.search(batch if len(batch) > 1 else batch[0])
                                            .distance_type("cosine").limit(top), top) \
                .select(["keyword", "_distance"]) \
                .to_arrow()
            keywords, distances = near.column("keyword").to_pylist(), near.column("_distance").to_pylist()
            which = near.column("query_index").to_pylist() if len(batch) > 1 else [0] * near.num_rows
            for i, keyword, distance in zip(which, keywords, distances):
                if 1.0 - distance > 0:
                    weights[i][keyword] = 1.0 - distance
        verbatim = [list(dict.fromkeys(sentence_keywords(q))) for q in queries]
        wanted = list(dict.fromkeys([k for w in weights for k in w] + [k for v in verbatim for k in v]))
        if not wanted:
            return pl.DataFrame(), weights
        links = pl.from_arrow(self.links.search().where(_in_list("keyword", wanted)).select(
            ["keyword", "chunk_ids", "chunk_count"]).limit(len(wanted)).to_arrow())
        linked = set(links["keyword"].to_list())
        for query_weights, named in zip(weights, verbatim):
            for keyword in linked.intersection(named):
                query_weights[keyword] = max(query_weights.get(keyword, 0.0), exact_weight)
        return links, weights

    def hybrid(self, texts: list[str], embed_many, params, clauses: int) -> Hits:
        """The hybrid ranking of a question (texts[0]) and its clauses (texts[1:]) as Retriever's would be:
        every channel of every text, score or rank fusion over each channel's top fusion_depth (the clauses
        weighing decompose_weight together), on the hits only. embed_many: texts -> their vectors (the
        full-text queries, which need none, start before it); params: RetrievalParams. Returns the fused
        (rows, scores), best first."""
        wanted = {name for name, weight in params.fusion_weights if weight}
        fts = [_POOL.submit(self.fts, t, tokenize(t, params.split_camel_case)) for t in texts] \
            if "bm25" in wanted else []
        vectors = list(embed_many(texts))
        dense = _POOL.submit(self.dense_many, vectors) if "dense" in wanted else None
        keyword = self.keyword_many(texts, vectors, params.keyword_top, params.keyword_exact_weight,
                                    params.keyword_evidence_weight) if "keyword" in wanted else None
        channels = {"dense": dense.result() if dense else None, "bm25": [f.result() for f in fts] or None,
                    "keyword": keyword}
        rankings = []
        for i in range(len(texts)):
            share = 1.0 if i == 0 else params.decompose_weight / clauses
            rankings += [(*channels[name][i], weight * share) for name, weight in params.fusion_weights if weight]
        return fuse(rankings, params.fusion, params.fusion_depth, params.rrf_k)


def _per_query(result, queries: int) -> list[np.ndarray | None]:
    """Masks of a multi-vector result's rows by query (None: a single query, every row)."""
    if queries == 1:
        return [None]
    which = result.column("query_index").to_numpy()
    return [which == i for i in range(queries)]


def top(rows: np.ndarray, scores: np.ndarray, depth: int) -> Hits:
    """The best `depth` finite hits, best first (ties: lower row first), as ranks_of orders them."""
    finite = np.isfinite(scores)
    rows, scores = np.asarray(rows)[finite], np.asarray(scores, dtype=float)[finite]
    order = np.lexsort((rows, -scores))[:depth]
    return rows[order], scores[order]


def fuse(rankings: list[tuple[np.ndarray, np.ndarray, float]], fusion: str, depth: int, rrf_k: float) -> Hits:
    """fusion.score_fusion or reciprocal_rank_fusion (then Retriever._expand's drop of non-positive scores) on
    (rows, scores, weight) hits instead of arrays of N: the same fused scores, best first."""
    parts_rows, parts_scores = [], []
    for rows, scores, weight in rankings:
        rows, scores = top(rows, scores, depth)
        if not len(rows):
            continue
        parts_scores.append(score_shares(scores, weight) if fusion == "score" else
                            rank_shares(len(rows), weight, rrf_k))
        parts_rows.append(rows)
    if not parts_rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    unique, inverse = np.unique(np.concatenate(parts_rows), return_inverse=True)
    fused = np.bincount(inverse, weights=np.concatenate(parts_scores), minlength=len(unique))
    keep = fused > 0
    return top(unique[keep], fused[keep], len(unique))


class LanceBackend:
    """The chunk channels of RetrievalIndex.backend answered by LanceDB (:class:`LanceSearch`); the memory
    backend (lexgraph.query.memory_backend) answers the same calls from arrays. Hits come back as score
    arrays of N floats (-inf where none), so fusion and the answer code need not know which backend ran."""

    name = "lance"

    def __init__(self, search: LanceSearch):
        self.search = search

    def dense(self, index, query_vector: np.ndarray) -> np.ndarray:
        return spread(index.size, *self.search.dense(query_vector))

    def bm25(self, index, query: str, params) -> np.ndarray:
        return spread(index.size, *self.search.fts(query, tokenize(query, params.split_camel_case)))

    def keyword(self, index, query: str, query_vector: np.ndarray, params) -> np.ndarray:
        return spread(index.size, *self.search.keyword(query, query_vector, params.keyword_top,
                                                       params.keyword_exact_weight, params.keyword_evidence_weight))

    def hybrid(self, index, texts: list[str], embed_many, params, parts: int) -> np.ndarray | None:
        """Every text's channels in batched LanceDB queries (None when the batching is off: the retriever then
        fuses channel by channel)."""
        if not self.search.params.batched:
            return None
        rows, values = self.search.hybrid(texts, embed_many, params, parts)
        index.chunks.fetch(rows[:PREFETCH_ROWS])  # what the context reads first: one take
        return spread(index.size, rows, values)

    @property
    def evidence_limit(self) -> int:
        """The entity and path channels re-score only this many chunks, those with the most evidence: each is a
        vector read here (the keyword channel's rule, keyword_candidates)."""
        return self.search.params.evidence_candidates

    def chunk_cosines(self, index, query_vector: np.ndarray, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows and query cosines of the chunks these ids name (the lance graph's refs): one read of their vectors
        through the chunk_id BTREE; row -1 for an id the table does not hold (or not in the scan at load)."""
        ids = [str(r) for r in refs]
        rows, cosine = np.full(len(ids), -1, dtype=np.int64), np.zeros(len(ids))
        if not ids:
            return rows, cosine
        at = {c: i for i, c in enumerate(ids)}
        for start in range(0, len(ids), 2_000):
            part = ids[start:start + 2_000]
            found = self.search.chunks.search().where(_in_list("chunk_id", part)).select(
                ["chunk_id", "vector", "_rowid"]).limit(len(part)).to_arrow()
            if not found.num_rows:
                continue
            matrix = found.column("vector").combine_chunks().values.to_numpy().reshape(found.num_rows, -1)
            where = np.array([at[c] for c in found.column("chunk_id").to_pylist()], dtype=np.int64)
            mapped, present = self.search._rows(found.column("_rowid").to_numpy())
            rows[where[present]] = mapped
            cosine[where] = matrix @ query_vector
        return rows, cosine

    def chunk_refs(self, index, rows) -> list[str]:
        """The lance graph's refs of these chunk rows: their chunk ids (one take for the rows not cached)."""
        index.chunks.fetch(rows)
        return [index.chunks.row(r)["chunk_id"] for r in rows]

    def fetch(self, index, rows: np.ndarray) -> None:
        """Rows about to be read: one LanceDB take, not one each."""
        index.chunks.fetch(rows)

    def with_params(self, index, params):
        """LanceDB's full-text index has its own BM25: the knobs change nothing here."""
        return index


def warm_lance(index) -> None:
    """One query through each channel and a row fetch, on words of the term sample, so that LanceDB opens
    the ANN, full-text, BTREE and keyword indexes now rather than at the first question. index: the
    RetrievalIndex of load_lance_index. Best effort: a failure here is the first question's to report."""
    search = index.backend.search
    try:
        words = list(index.bm25.vocabulary)[:3] or ["index"]
        vector = np.zeros(search.chunks.schema.field("vector").type.list_size, dtype=np.float32)
        vector[0] = 1.0
        search.fts(" ".join(words), words)
        search.keyword(" ".join(words), vector, 20, 1.0, 0.5)
        rows, _ = search.dense(vector)
        search.rows.fetch(rows[:1])
    except Exception:  # noqa: BLE001 - warming only
        pass


def index_health(states: dict[str, li.IndexState], has_links: bool = True) -> dict:
    """Each chunk-table index (type, rows indexed, rows LanceDB still searches flat) and what is degraded."""
    indexes = {name: {"type": s.kind, "indexed_rows": s.indexed, "unindexed_rows": s.unindexed}
               for name, s in states.items()}
    notes = []
    if not states[li.ANN_INDEX].present:
        notes.append("no ANN vector index: dense search is flat (exact, slower); the corpus job builds it")
    if not states[li.FTS_INDEX].present:
        notes.append("no full-text index: the bm25 channel returns nothing; the corpus job builds it")
    if not has_links:
        notes.append(f"no {li.KEYWORD_LINKS} table: the keyword channel returns nothing; the corpus job writes it")
    stale = [name for name, s in states.items() if s.stale]
    if stale:
        notes.append(f"stale: {', '.join(stale)} (rows added since are searched flat until the next optimize)")
    return {"indexes": indexes, "degraded": notes}


def scan_rows(table) -> tuple[np.ndarray, np.ndarray]:
    """(row ids, token counts) of every chunk, in scan order: the row numbering of the lance backend."""
    data = table.search().select(["token_count"]).with_row_id(True).limit(None).to_arrow()
    rowids = data.column("_rowid").to_numpy().astype(np.uint64)
    tokens = data.column("token_count").to_numpy().astype(np.int32)
    order = np.argsort(rowids, kind="stable")  # already sorted in practice; searchsorted needs it
    return rowids[order], tokens[order]


def sample_texts(table, rows: int, size: int, seed: int = 0) -> list[str]:
    if rows == 0 or size <= 0:
        return []
    offsets = sorted(np.random.default_rng(seed).choice(rows, size=min(size, rows), replace=False).tolist())
    return table.take_offsets(offsets).select(["text"]).to_arrow().column("text").to_pylist()


def load(store: VectorStore, k1: float, b: float, split_camel_case: bool,
         params: LanceParams | None = None) -> tuple[ChunkRows, LanceSearch, TermStats]:
    params = params or LanceParams()
    table = store.db.open_table(CHUNKS)
    rowids, tokens = scan_rows(table)
    rows = ChunkRows(table, rowids, tokens, params.row_cache)
    terms = TermStats(sample_texts(table, len(rowids), params.term_sample), k1, b, split_camel_case)
    return rows, LanceSearch(store, rows, params), terms


