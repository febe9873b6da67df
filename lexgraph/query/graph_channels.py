"""The lexical graph's two retrieval channels: ``entity`` (DESIGN.md §5's skeleton/entity channel) and
``statement`` (statement traversal), plus :func:`statements_for`, the statements behind chunk hits.

Both read what the lexical graph load wrote (``lexgraph.indexing.lexical``): the LanceDB ``statements`` and
``entities`` vector tables and the Extract store's per-document ``entities``, ``relations`` and ``facts``
Parquet. Never Kùzu: the query side must not need the single graph writer, and a benchmark asks hundreds of
questions, so :func:`load_lexical_graph` reads everything once into sparse matrices (it is called by
``retrieval.load_index``) and a query is a few dense and sparse products. An index without a lexical graph
loads with ``RetrievalIndex.graph`` parts set to None, and both channels then retrieve nothing (all -inf).

**entity** (:func:`entity_scores`): the query's nearest entity vectors ("name: description", the top
``entity_top`` by cosine, weighted by it) and the entity names found verbatim in the query (n-grams matched by
the resolver's key, :func:`lexgraph.indexing.name_keys.normalise_entity_name`, so "the Kestrel Propulsion GmbH"
finds "Kestrel Propulsion"; spaces are ignored, so "Li Hua" finds the chat speaker "LiHua"; weight
``entity_exact_weight``). One hop along their relations adds up to ``entity_neighbours`` neighbouring
entities, down-weighted by ``entity_hop_weight`` × the relation's share of the entity's relation strength.
Each chunk's evidence is Σ entity weight × idf over the entities mentioned in it (idf: rare entities say more);
the channel scores the chunks with evidence by query–chunk cosine + ``entity_evidence_weight`` ×
evidence / max evidence, as the keyword channel does.

**statement** (:func:`statement_scores`, :func:`traverse_statements`): the top ``statement_top`` statements
by query–statement cosine seed a traversal of at most ``statement_hops`` hops. Each hop goes from the
statements found so far through bridging nodes, ranked by their strongest parent:

- a statement's **topic** (topics are scoped to one source): to the topic's other statements, and
- its **facts and entities** (the fact ids it supports, its facts' subject and object entities, and the
  chunk's entities named in its text): to other statements sharing them, in other sources
  (the node's strength is scaled by its idf, so a name in every document bridges little).

At most ``statement_nodes`` bridging nodes are expanded in all and at most ``statement_limit`` statements
scored in all. A statement reached through a node scores
``weight × sqrt(node strength × its own cosine)``, so it needs both a strong path and some relevance of its
own (weights ``statement_topic_weight`` and ``statement_link_weight``). A chunk's score aggregates its
statements: the best one + ``statement_sum_weight`` × the sum of the others (+ ``statement_dense_weight`` ×
query–chunk cosine).

**For the answer layer**: :func:`statements_for` ``(index, query_vector, chunk_rows, limit)`` returns the
statements of the given chunks (row numbers of ``index.chunks`` or chunk ids, e.g. from
``Retriever.hits``), best first by cosine with the query, as :class:`StatementHit` (statement id, text,
chunk id, document id, topic, score): the claims a cited chunk stands on. :func:`traverse_statements`
returns the statement channel's own statements with their scores, hop and the node that led to them.

No Dagster here (DESIGN.md §2).
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl
import scipy.sparse as sp

from lexgraph.indexing.entity_resolution import entity_ids_of_rows
from lexgraph.indexing.name_keys import entity_id, normalise_entity_name
from lexgraph.extract.keywords import STOPWORDS
from lexgraph.query.retrieval_types import (EntityGraph, LexicalGraph, RetrievalIndex, RetrievalParams,
                                            StatementGraph)
from lexgraph.storage.extract_store import CorruptExtractError, ExtractStore
from lexgraph.storage.vector_store import ENTITIES, STATEMENTS, VectorStore, _in_list

# Words of a query looked at for verbatim entity names: a hostile 100 kB query stays cheap.
MAX_QUERY_WORDS = 512
MAX_NAME_WORDS = 6  # longest entity name matched verbatim, in words
_WORD = re.compile(r"\S+")


# ---------------------------------------------------------------------------------------------
# the in-memory lexical graph (its dataclasses: retrieval_types)


def bridge_pair_share(graph: StatementGraph | None, n_chunks: int) -> float:
    """The share of chunk pairs that share a bridging node (a fact or entity), summed over the nodes (an upper
    bound, capped at 1): how selective the graph is. Near 1, a few hubs join everything (every chat log names its
    speaker) and a traversal reaches the whole corpus; near 0, bridges are specific (Wikipedia's entities)."""
    if graph is None or graph.size == 0 or n_chunks < 2:
        return 1.0
    node_chunks = (graph.link_members @ graph.by_chunk.T).astype(bool)  # nodes × chunks
    counts = np.asarray(node_chunks.sum(axis=1), dtype=np.float64).ravel()
    return float(min(1.0, (counts * (counts - 1)).sum() / (n_chunks * (n_chunks - 1))))


def compact_key(name: str) -> str:
    """The resolver's key without spaces: "Li Hua", "LiHua" and "the Li-Hua" meet."""
    return normalise_entity_name(name).replace(" ", "")


def _unit(matrix: np.ndarray) -> np.ndarray:
    matrix = matrix.astype(np.float32, copy=False)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def _vector_table(store: VectorStore, name: str, columns: list[str],
                  where: str | None = None) -> tuple[pl.DataFrame, np.ndarray] | None:
    if name not in store.table_names():
        return None
    table = store.db.open_table(name)
    if where is not None and "vector" in table.schema.names and all(c in table.schema.names for c in columns):
        table = table.search().where(where).select([*columns, "vector"]).limit(None).to_arrow()
    else:
        table = table.to_arrow()
    if table.num_rows == 0 or "vector" not in table.schema.names or any(c not in table.schema.names for c in columns):
        return None
    vectors = table.column("vector").combine_chunks().values.to_numpy().reshape(table.num_rows, -1)
    return pl.from_arrow(table.select(columns)), _unit(np.asarray(vectors, dtype=np.float32))


def _extract_table(extract: ExtractStore, stage: str, columns: list[str], chunks: list[str],
                   doc_ids: list[str] | None = None) -> pl.DataFrame | None:
    """All documents' rows (or these documents') of one lexical stage for the indexed chunks (None without any,
    or when a file is damaged: the channels then do without it rather than fail every query)."""
    try:
        if doc_ids is not None:
            parts = [extract.read(stage, d, lambda scan: scan.select(columns)) for d in doc_ids if extract.exists(stage, d)]
            if not parts:
                return None
            return pl.concat(parts, how="vertical_relaxed").filter(pl.col("chunk_id").is_in(chunks))
        scan = extract.scan(stage)
        if scan is None:
            return None
        return scan.select(columns).filter(pl.col("chunk_id").is_in(chunks)).collect()
    except (CorruptExtractError, pl.exceptions.PolarsError, OSError) as error:
        warnings.warn(f"lexical graph: {stage} not readable ({error}); the graph channels do without it", stacklevel=3)
        return None


def _entity_ids(names: pl.Series) -> pl.Series:
    """Resolved entity ids of extracted names (None for a name with no letter or digit)."""
    names = names.fill_null("").rechunk()  # replace_strict builds its mapping once per chunk
    mapping = {}
    for name in names.unique().to_list():
        mapping[name] = entity_id(name) if name and normalise_entity_name(name) else None
    return names.replace_strict(mapping, return_dtype=pl.Utf8)


def _ids_in_chunk(frame: pl.DataFrame, column: str, mentions: pl.DataFrame | None) -> pl.Series:
    """Entity ids of the names in ``column``, each resolved as the same chunk's entity row of that name was
    (a name split by type, a person and a place, resolves by its type there), else by the name alone."""
    plain = _entity_ids(frame[column])
    if mentions is None or not mentions.height:
        return plain
    typed = mentions.select("chunk_id", pl.col("entity_name").alias(column), pl.col("entity_id").alias("_typed"))
    joined = frame.select("chunk_id", column).with_row_index("_row").join(
        typed.unique(subset=["chunk_id", column]), on=["chunk_id", column], how="left").sort("_row")
    return joined["_typed"].fill_null(plain).alias(plain.name)


def load_lexical_graph(store: VectorStore, extract: ExtractStore, position: dict[str, int],
                       rows: dict | None = None) -> LexicalGraph:
    """Read the lexical graph's vectors (LanceDB) and links (Extract-store Parquet) for the indexed chunks.
    rows: a dict given is filled with the rows the entity graph was made from, "mentions" (resolved_mentions of
    the known entities) and "relations" (relation_rows), for the graph tables."""
    chunks = list(position)
    mentions = resolved_mentions(_extract_table(extract, "entities", MENTION_COLUMNS, chunks))
    statements = _load_statements(store, extract, position, mentions)
    return LexicalGraph(statements, _load_entities(store, extract, position, mentions, rows),
                        bridge_pair_share(statements, len(position)))


MENTION_COLUMNS = ["entity_name", "entity_type", "chunk_id"]
RELATION_COLUMNS = ["source", "target", "strength", "chunk_id"]


def resolved_mentions(mentions: pl.DataFrame | None, senses=None) -> pl.DataFrame | None:
    """Entity rows (MENTION_COLUMNS), each once, with their resolved ``entity_id`` (rows without one dropped).
    senses: the names split by type (entity_resolution.entity_senses), from these rows when not given; rows of a
    few documents need every document's rows of their names' senses."""
    if mentions is None:
        return None
    mentions = mentions.unique()
    return mentions.with_columns(entity_ids_of_rows(mentions, senses)).drop_nulls("entity_id")


def relation_rows(relations: pl.DataFrame | None, mentions: pl.DataFrame | None, ids) -> pl.DataFrame:
    """Relations between two different known entities (``ids``): a, b (entity ids), weight (the strength clipped
    at 0, + 1e-3), chunk_id. Each relation's names resolve as its chunk's entity rows of them did."""
    empty = pl.DataFrame(schema={"a": pl.Utf8, "b": pl.Utf8, "weight": pl.Float64, "chunk_id": pl.Utf8})
    if relations is None or not relations.height:
        return empty
    relations = relations.with_columns(_ids_in_chunk(relations, "source", mentions).alias("a"),
                                       _ids_in_chunk(relations, "target", mentions).alias("b"))
    relations = relations.filter(pl.col("a").is_not_null() & pl.col("b").is_not_null() & (pl.col("a") != pl.col("b")))
    if ids is not None:  # None: every resolved entity (the caller checks them)
        known = list(ids)
        relations = relations.filter(pl.col("a").is_in(known) & pl.col("b").is_in(known))
    return relations.select("a", "b", (pl.col("strength").fill_null(0.0).cast(pl.Float64).clip(0, None) + 1e-3)
                            .alias("weight"), "chunk_id")


def name_key(name: str | None) -> str | None:
    """The compact key a name is looked up by (None for one too short or a stopword)."""
    key = compact_key(name or "")
    return key if len(key) > 1 and key not in STOPWORDS else None


def best_names(candidates) -> dict[str, str]:
    """(key, rank, entity id) candidates -> key: entity id. An entity's own name (rank 0) comes before a surface
    form (rank 1), then the smallest id: the choice depends on no row order, so tables written by difference
    choose as a whole rewrite does."""
    best: dict[str, tuple[int, str]] = {}
    for key, rank, entity in candidates:
        if key is not None and (key not in best or (rank, entity) < best[key]):
            best[key] = (rank, entity)
    return {key: entity for key, (_, entity) in best.items()}


def _load_entities(store: VectorStore, extract: ExtractStore, position: dict[str, int],
                   mentions: pl.DataFrame | None, out: dict | None = None) -> EntityGraph | None:
    table = _vector_table(store, ENTITIES, ["entity_id", "name"])
    if table is None:
        return None
    frame, vectors = table
    ids, names = frame["entity_id"].to_list(), frame["name"].to_list()
    row_of = {e: i for i, e in enumerate(ids)}
    n, n_chunks = len(ids), len(position)
    candidates = [(name_key(name), 0, entity) for entity, name in zip(ids, names)]
    if mentions is not None:
        rows = mentions.filter(pl.col("entity_id").is_in(ids))
        matrix = sp.csr_matrix((np.ones(rows.height), ([row_of[e] for e in rows["entity_id"].to_list()],
                                                         [position[c] for c in rows["chunk_id"].to_list()])),
                               shape=(n, n_chunks))
        matrix.data[:] = 1.0
        # surface forms seen in the chunks also find their entity verbatim ("Kestrel Propulsion GmbH")
        candidates += [(name_key(name), 1, entity) for name, entity in rows.select("entity_name", "entity_id").unique().iter_rows()]
    else:
        matrix = sp.csr_matrix((n, n_chunks))
    lookup = {key: row_of[entity] for key, entity in best_names(candidates).items()}
    df = np.asarray(matrix.sum(axis=1)).ravel()
    idf = entity_idf(df, n_chunks)
    relations = relation_rows(_extract_table(extract, "relations", RELATION_COLUMNS, list(position)), mentions, ids)
    graph = sp.csr_matrix((n, n))
    if relations.height:
        a = np.array([row_of[e] for e in relations["a"].to_list()])
        b = np.array([row_of[e] for e in relations["b"].to_list()])
        graph = relation_shares(a, b, relations["weight"].to_numpy(), n)
    if out is not None:
        out.update(mentions=rows if mentions is not None else None, relations=relations)
    return EntityGraph(ids, names, vectors, lookup, matrix, graph, idf)


def entity_idf(df: np.ndarray, n_chunks: int) -> np.ndarray:
    """ln(chunks / chunks mentioning the entity) + 1 (an entity mentioned nowhere counts as mentioned once)."""
    return np.log(max(n_chunks, 1) / np.maximum(np.asarray(df, dtype=np.float64), 1)) + 1.0


def node_idf(df: np.ndarray, n_statements: int, df_min: float) -> np.ndarray:
    """A bridging node's idf, ln(1 + statements / its statements), divided by the largest (that of the node with
    the fewest statements, df_min)."""
    top = math.log1p(n_statements / max(df_min, 1))
    idf = np.log1p(n_statements / np.maximum(np.asarray(df, dtype=np.float64), 1))
    return idf / top if top > 0 else idf


def relation_shares(a: np.ndarray, b: np.ndarray, weight: np.ndarray, n: int) -> sp.csr_matrix:
    """entities × entities: each relation both ways, summed per pair, each row as shares of its total."""
    graph = sp.csr_matrix((np.concatenate([weight, weight]), (np.concatenate([a, b]), np.concatenate([b, a]))),
                          shape=(n, n))
    graph.sum_duplicates()
    totals = np.asarray(graph.sum(axis=1)).ravel()
    shares = sp.csr_matrix(sp.diags(1 / np.maximum(totals, 1e-12)) @ graph)
    shares.sort_indices()  # neighbours by row, as the graph tables hold them (a tie in share goes by row)
    return shares


def _load_statements(store: VectorStore, extract: ExtractStore, position: dict[str, int],
                     mentions: pl.DataFrame | None, doc_ids: list[str] | None = None) -> StatementGraph | None:
    """The statement graph over the chunks in `position` (of these documents only, when given: the statements,
    their topics and bridging nodes; a node's idf then counts only them)."""
    where = _in_list("doc_id", doc_ids) if doc_ids is not None else None
    table = _vector_table(store, STATEMENTS, ["statement_id", "chunk_id", "topic_id", "topic", "text"], where)
    if table is None:
        return None
    frame, vectors = table
    keep = np.array([c in position for c in frame["chunk_id"].to_list()], dtype=bool)
    if not keep.any():
        return None
    frame, vectors = frame.filter(pl.Series(keep)), vectors[keep]
    frame = frame.with_row_index("row").with_columns(pl.col("text").fill_null(""), pl.col("topic").fill_null(""))
    n, n_chunks = frame.height, len(position)
    chunk_rows = np.array([position[c] for c in frame["chunk_id"].to_list()], dtype=np.int64)
    topic_ids, topic = np.unique(np.array(frame["topic_id"].fill_null("").to_list(), dtype=object), return_inverse=True)
    n_topics = int(topic.max()) + 1 if n else 0
    members = sp.csr_matrix((np.ones(n), (topic, np.arange(n))), shape=(n_topics, n))
    by_chunk = sp.csr_matrix((np.ones(n), (chunk_rows, np.arange(n))), shape=(n_chunks, n))
    # bridging nodes: the facts a statement supports, their subject and object entities, and the chunk's
    # entities named in the statement's text
    parts = []
    facts = _extract_table(extract, "facts", ["fact_id", "statement_id", "subject", "object", "chunk_id"], list(position),
                           doc_ids)
    ids = frame.select("statement_id", "row")
    if facts is not None and facts.height:
        facts = facts.join(ids, on="statement_id")
        parts.append(facts.select("row", pl.col("fact_id").alias("node")))
        for column in ("subject", "object"):
            parts.append(facts.select("row", _ids_in_chunk(facts, column, mentions).alias("node")))
    if mentions is not None and mentions.height:
        named = (frame.select("row", "chunk_id", pl.col("text").str.to_lowercase().alias("lower"))
                 .join(mentions.select("chunk_id", pl.col("entity_name").str.to_lowercase().alias("name"), "entity_id"),
                       on="chunk_id")
                 .filter((pl.col("name").str.len_chars() > 1) & pl.col("lower").str.contains(pl.col("name"), literal=True)))
        parts.append(named.select("row", pl.col("entity_id").alias("node")))
    links = pl.concat(parts).drop_nulls().unique() if parts else pl.DataFrame(schema={"row": pl.UInt32, "node": pl.Utf8})
    node_ids = sorted(set(links["node"].to_list()))
    node_of = {node: i for i, node in enumerate(node_ids)}
    matrix = sp.csr_matrix((np.ones(links.height), (links["row"].to_numpy().astype(np.int64),
                                                    [node_of[x] for x in links["node"].to_list()])),
                           shape=(n, len(node_ids)))
    df = np.asarray(matrix.sum(axis=0)).ravel()
    idf = node_idf(df, n, df.min() if len(df) else 1)
    return StatementGraph(frame["statement_id"].to_list(), frame["text"].to_list(), frame["topic"].to_list(), vectors,
                          chunk_rows, topic.astype(np.int64), members, matrix, matrix.T.tocsr(), node_ids, idf,
                          by_chunk, topic_ids.tolist())


# ---------------------------------------------------------------------------------------------
# entity channel


def query_name_keys(query: str, max_words: int = MAX_QUERY_WORDS) -> list[str]:
    """The compact keys of the query's word n-grams of up to MAX_NAME_WORDS words among its first max_words words,
    in order: what a verbatim entity name is looked up by."""
    words = _WORD.findall(query[: max_words * 64])[:max_words]
    return [compact_key(" ".join(words[start:end])) for start in range(len(words))
            for end in range(start + 1, min(start + MAX_NAME_WORDS, len(words)) + 1)]


def query_entities(graph: EntityGraph, query: str, max_words: int = MAX_QUERY_WORDS) -> list[int]:
    """Entities whose name (by the resolver's key, spaces ignored) occurs verbatim in the query, as word
    n-grams of up to MAX_NAME_WORDS words among its first max_words words; first named first."""
    return list(dict.fromkeys(graph.named(query_name_keys(query, max_words))))


def entity_weights(graph: EntityGraph, query: str, query_vector: np.ndarray, params: RetrievalParams) -> dict[int, float]:
    """The query's entities and their weights (all > 0): nearest vectors, verbatim names, and one hop of relations."""
    weights: dict[int, float] = {}
    top = min(params.entity_top, graph.size)
    if top > 0:
        rows, similarity = graph.nearest(query_vector, top)
        weights = {int(r): float(v) for r, v in zip(rows, similarity) if v > 0}
    for i in query_entities(graph, query):
        weights[i] = max(weights.get(i, 0.0), params.entity_exact_weight)
    if params.entity_neighbours > 0 and params.entity_hop_weight > 0 and graph.has_relations and weights:
        passed: dict[int, float] = {}
        for row, (neighbours, shares) in graph.relations_of(sorted(weights)).items():
            for n, share in zip(neighbours.tolist(), shares.tolist()):
                if n not in weights:
                    passed[n] = passed.get(n, 0.0) + params.entity_hop_weight * share * weights[row]
        candidates = np.array(sorted(n for n, v in passed.items() if v > 0), dtype=np.int64)
        values = np.array([passed[n] for n in candidates.tolist()])
        if len(candidates) > params.entity_neighbours:
            keep = np.argpartition(-values, params.entity_neighbours - 1)[:params.entity_neighbours]
            candidates, values = candidates[keep], values[keep]
        weights.update(zip(candidates.tolist(), values.tolist()))
    return weights


def entity_scores(index: RetrievalIndex, query: str, query_vector: np.ndarray, params: RetrievalParams) -> np.ndarray:
    """The entity channel: a score per chunk (-inf where none of the query's entities is mentioned)."""
    graph = index.graph.entities if index.graph is not None else None
    if graph is None or graph.size == 0 or not graph.has_mentions:
        return np.full(index.size, -np.inf)
    weights = entity_weights(graph, query, query_vector, params)
    rows = sorted(weights)
    mass = np.array([weights[r] for r in rows]) * graph.idf_of(rows)
    refs = graph.chunks_of(rows, query_vector)
    if not any(len(r) for r in refs):
        return np.full(index.size, -np.inf)
    evidence = np.concatenate([np.full(len(r), m) for r, m in zip(refs, mass)])
    return rerank_refs(index, query_vector, np.concatenate(refs), evidence, params.entity_evidence_weight)


def rerank_by_evidence(index: RetrievalIndex, query_vector: np.ndarray, evidence: np.ndarray,
                       weight: float) -> np.ndarray:
    """The keyword channel's chunk score: cos(query, chunk) + weight · evidence / max(evidence) on the chunks with
    evidence (a value per chunk row), -inf elsewhere."""
    candidates = np.flatnonzero(evidence > 0)
    return rerank_refs(index, query_vector, candidates, evidence[candidates], weight)


def rerank_refs(index: RetrievalIndex, query_vector: np.ndarray, refs: np.ndarray, evidence: np.ndarray,
                weight: float) -> np.ndarray:
    """The entity, path and keyword channels' chunk score, cos(query, chunk) + weight · evidence / max(evidence),
    from evidence given per chunk ref (a ref may repeat: its values add up); -inf for chunks without any."""
    scores = np.full(index.size, -np.inf)
    if not len(refs):
        return scores
    unique, inverse = np.unique(refs, return_inverse=True)
    total = np.bincount(inverse, weights=evidence, minlength=len(unique))
    keep = total > 0
    if not keep.any():
        return scores
    limit = index.backend.evidence_limit
    if limit is not None and keep.sum() > limit:  # the most evidence first (ties by ref), as many as the backend reads
        order = np.lexsort((unique, -total))[:limit]
        keep = np.zeros(len(unique), dtype=bool)
        keep[order] = True
    rows, cosine = index.backend.chunk_cosines(index, query_vector, unique[keep])
    total = total[keep]
    found = rows >= 0  # a ref the chunk table no longer holds (the index moved on) is left out
    scores[rows[found]] = cosine[found] + weight * total[found] / total.max()
    return scores


# ---------------------------------------------------------------------------------------------
# statement channel


@dataclass(frozen=True)
class TraversedStatement:
    row: int  # row in StatementGraph
    score: float
    hop: int  # 0 for a seed (found by its vector)
    via: str  # "vector", "topic:<topic id row>" or the fact/entity id that led to it


def traverse_statements(graph: StatementGraph, query_vector: np.ndarray,
                        params: RetrievalParams) -> list[TraversedStatement]:
    """The statement channel's statements, best first: seeds by vector, then hops through topics (same
    source) and shared facts/entities (other sources), within the hop, node and statement budgets. Reads the
    graph row by row (the seeds, then each hop's frontier and the members of the nodes it chooses)."""
    limit = max(params.statement_limit, 0)
    top = min(params.statement_top, graph.size, limit)
    if top <= 0:
        return []
    seeds, similarity = graph.nearest(query_vector, top)
    positive = similarity > 0
    seeds, similarity = seeds[positive], similarity[positive]
    found: dict[int, TraversedStatement] = {int(s): TraversedStatement(int(s), float(v), 0, "vector")
                                            for s, v in zip(seeds, similarity)}
    frontier = [int(s) for s in seeds]
    nodes_left = max(params.statement_nodes, 0)
    used_topics: set[int] = set()
    used_links: set[int] = set()
    for hop in range(1, max(params.statement_hops, 0) + 1):
        if not frontier or nodes_left <= 0 or len(found) >= limit:
            break
        chosen = _bridging_nodes(graph, frontier, found, used_topics, used_links, params)[:nodes_left]
        nodes_left -= len(chosen)
        reached = _reached_statements(graph, query_vector, chosen, found, used_topics, used_links, params)
        room = limit - len(found)
        best = sorted(reached.items(), key=lambda item: (-item[1][0], item[0]))[:room]
        frontier = []
        for t, (score, via) in best:
            if score <= 0:
                continue
            found[t] = TraversedStatement(t, score, hop, via)
            frontier.append(t)
    return sorted(found.values(), key=lambda s: (-s.score, s.row))


def _bridging_nodes(graph: StatementGraph, frontier: list[int], found: dict[int, TraversedStatement],
                    used_topics: set[int], used_links: set[int], params: RetrievalParams):
    """The frontier's bridging nodes not yet expanded, each as strong as its best parent (links scaled by idf),
    strongest first."""
    graph.prefetch(statements=frontier)  # one read for the frontier, one for its link nodes (on LanceDB)
    if params.statement_link_weight > 0:
        graph.prefetch(links=[n for s in frontier for n in graph.links_of(s).tolist() if n not in used_links])
    candidates: dict[tuple[str, int], float] = {}
    for s in frontier:
        score = found[s].score
        t = graph.topic_of(s)
        if t not in used_topics and params.statement_topic_weight > 0:
            key = ("topic", t)
            candidates[key] = max(candidates.get(key, 0.0), score)
        if params.statement_link_weight > 0:
            for node in graph.links_of(s).tolist():
                if node not in used_links:
                    key = ("link", node)
                    candidates[key] = max(candidates.get(key, 0.0), score * graph.link_strength(node))
    return sorted(candidates.items(), key=lambda item: (-item[1], item[0]))


def _reached_statements(graph: StatementGraph, query_vector: np.ndarray, chosen, found: dict[int, TraversedStatement],
                        used_topics: set[int], used_links: set[int], params: RetrievalParams) -> dict[int, tuple[float, str]]:
    """The statements the chosen nodes lead to, not found yet, each with its best score and the node."""
    graph.prefetch(topics=[node for (kind, node), _ in chosen if kind == "topic"],
                   links=[node for (kind, node), _ in chosen if kind == "link"])
    expanded = []
    for (kind, node), strength in chosen:
        if kind == "topic":
            used_topics.add(node)
            expanded.append((graph.topic_statements(node, query_vector), strength, params.statement_topic_weight,
                             f"topic:{node}"))
        else:
            used_links.add(node)
            expanded.append((graph.link_statements(node, query_vector), strength, params.statement_link_weight,
                             graph.link_name(node)))
    members = sorted({int(t) for rows, *_ in expanded for t in rows.tolist()} - set(found))
    if not members:
        return {}
    relevance = dict(zip(members, np.clip(graph.similarity(query_vector, np.array(members, dtype=np.int64)), 0,
                                          None).tolist()))
    reached: dict[int, tuple[float, str]] = {}
    for rows, strength, weight, via in expanded:
        for t in rows.tolist():
            if t in found:
                continue
            score = weight * math.sqrt(strength * relevance[t])
            if score > reached.get(t, (0.0, ""))[0]:
                reached[t] = (score, via)
    return reached


def statement_scores(index: RetrievalIndex, query: str, query_vector: np.ndarray,
                     params: RetrievalParams) -> np.ndarray:
    """The statement channel: a score per chunk from its traversed statements (-inf where none)."""
    graph = index.graph.statements if index.graph is not None else None
    if graph is None or graph.size == 0:
        return np.full(index.size, -np.inf)
    return scores_of_statements(index, traverse_statements(graph, query_vector, params), query_vector, params)


def scores_of_statements(index: RetrievalIndex, statements: list[TraversedStatement], query_vector: np.ndarray,
                         params: RetrievalParams) -> np.ndarray:
    """Chunk scores from statements already traversed: the best statement, plus a share of the others, plus
    the query–chunk cosine (-inf for chunks without one). Split from the traversal so a caller that has
    walked the graph (the graph route's budget check) does not walk it again."""
    scores = np.full(index.size, -np.inf)
    if not statements:
        return scores
    graph = index.graph.statements
    rows = np.array([s.row for s in statements], dtype=np.int64)
    values = np.array([s.score for s in statements])
    unique, inverse = np.unique(graph.chunk_refs(rows), return_inverse=True)
    best = np.zeros(len(unique))
    np.maximum.at(best, inverse, values)
    total = np.bincount(inverse, weights=values, minlength=len(unique))
    chunk_rows, cosine = index.backend.chunk_cosines(index, query_vector, unique)
    found = chunk_rows >= 0
    value = best + params.statement_sum_weight * (total - best)
    if params.statement_dense_weight:
        value = value + params.statement_dense_weight * cosine
    scores[chunk_rows[found]] = value[found]
    return scores


# ---------------------------------------------------------------------------------------------
# for the answer layer


@dataclass(frozen=True)
class StatementHit:
    statement_id: str
    text: str
    chunk_id: str
    doc_id: str
    topic: str
    score: float  # cosine of the statement with the query


def statements_for(index: RetrievalIndex, query_vector: np.ndarray, chunk_rows: Sequence[int | str],
                   limit: int = 10) -> list[StatementHit]:
    """The statements of these chunks (rows of index.chunks, or chunk ids), best first by cosine with the
    query, at most `limit`. Empty when the index has no lexical graph or the chunks no statements."""
    graph = index.graph.statements if index.graph is not None else None
    if graph is None or limit <= 0:
        return []
    rows = sorted({index.position[c] if isinstance(c, str) else int(c) for c in chunk_rows
                   if (c in index.position if isinstance(c, str) else 0 <= int(c) < index.size)})
    if not rows:
        return []
    members = graph.of_chunks(index.backend.chunk_refs(index, rows))
    if not len(members):
        return []
    similarity = graph.similarity(query_vector, members)
    order = np.argsort(-similarity, kind="stable")[:limit]
    described = graph.describe(members[order], index.chunks)
    return [StatementHit(statement_id, text, chunk_id, doc_id, topic, float(similarity[i]))
            for i, (statement_id, text, topic, chunk_id, doc_id) in zip(order.tolist(), described)]
