"""A synthetic lexical graph for the query-scale bench's synthetic chunks (benchmarks.bench_query_scale).

What is synthetic, besides the chunks themselves:
- entities: n/5, each with a home topic, a two-word made-up name and a vector near its topic's centroid; a chunk
  mentions two entities of its topic (Zipf-drawn within it) and one drawn Zipf(1.3) from all entities, so a few
  hubs are mentioned in a large share of the corpus, as a speaker or a company name is in real corpora;
- relations: the entities a chunk mentions are related (strength 0.9), shares of each entity's strength;
- statements: three per chunk, vectors near the chunk's topic; two topics per document (its halves);
- facts: one per statement, nine in ten its own and one in ten from a pool of n/20 shared facts (about six
  statements each, across documents); a statement's bridging nodes are its fact and one entity of its chunk.

The graph is built as the memory graph's arrays (retrieval_types.EntityGraph / StatementGraph) and written by the
product's own writer, lexgraph.query.lance_graph_tables.write_graph_tables, which the graph_tables corpus step
runs: its time is the bench's build figure for the tables. The Kùzu lexical graph is not built (no query reads it).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lexgraph.indexing.name_keys import entity_id
from lexgraph.query.graph_channels import bridge_pair_share, compact_key
from lexgraph.query.retrieval_types import EntityGraph, LexicalGraph, StatementGraph

STATEMENTS_PER_CHUNK = 3
ENTITY_SHARE = 5  # one entity per this many chunks
TYPES = np.array(["person", "organization", "location", "product", "event"], dtype=object)


def _near(centroids: np.ndarray, which: np.ndarray, noise: float, rng: np.random.Generator,
          block: int = 200_000) -> np.ndarray:
    """Unit vectors near the given centroids, float32, made a block at a time (3M × 384 doubles would be 9 GB)."""
    dim = centroids.shape[1]
    out = np.empty((len(which), dim), dtype=np.float32)
    for start in range(0, len(which), block):
        part = centroids[which[start:start + block]] + rng.standard_normal(
            (min(block, len(which) - start), dim), dtype=np.float32) * np.float32(noise / np.sqrt(dim))
        out[start:start + block] = part / np.maximum(np.linalg.norm(part, axis=1, keepdims=True), 1e-12)
    return out


def _row_shares(pairs_a: np.ndarray, pairs_b: np.ndarray, n: int) -> sp.csr_matrix:
    weight = np.full(len(pairs_a), 0.9 + 1e-3)
    graph = sp.csr_matrix((np.concatenate([weight, weight]), (np.concatenate([pairs_a, pairs_b]),
                                                              np.concatenate([pairs_b, pairs_a]))), shape=(n, n))
    graph.sum_duplicates()
    totals = np.asarray(graph.sum(axis=1)).ravel()
    return sp.csr_matrix(sp.diags(1 / np.maximum(totals, 1e-12)) @ graph)


def entities(corpus, chunk_topics: np.ndarray, rng: np.random.Generator) -> tuple[EntityGraph, np.ndarray]:
    """The entity graph over the chunks, and each chunk's three entity rows."""
    n = len(chunk_topics)
    count = max(100, n // ENTITY_SHARE)
    home = rng.choice(corpus.topics, size=count, p=corpus.topic_p)
    names, seen = [], set()
    for i in range(count):
        name = f"{corpus.words[(i * 7919) % len(corpus.words)].title()} {corpus.words[(i * 104729 + 13) % len(corpus.words)].title()}"
        while compact_key(name) in seen:
            name += " " + corpus.words[rng.integers(0, len(corpus.words))].title()
        seen.add(compact_key(name))
        names.append(name)
    by_topic = [np.flatnonzero(home == t) for t in range(corpus.topics)]
    mentioned = np.empty((n, 3), dtype=np.int64)
    hubs = np.minimum(rng.zipf(1.3, size=n) - 1, count - 1)
    for c, t in enumerate(chunk_topics.tolist()):
        own = by_topic[t] if len(by_topic[t]) else np.arange(count)
        mentioned[c, :2] = own[np.minimum(rng.zipf(1.5, size=2) - 1, len(own) - 1)]
        mentioned[c, 2] = hubs[c]
    rows, cols = mentioned.ravel(), np.repeat(np.arange(n), 3)
    mentions = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(count, n))
    mentions.data[:] = 1.0
    df = np.asarray(mentions.sum(axis=1)).ravel()
    idf = np.log(max(n, 1) / np.maximum(df, 1)) + 1.0
    a = np.concatenate([mentioned[:, 0], mentioned[:, 0], mentioned[:, 1]])
    b = np.concatenate([mentioned[:, 1], mentioned[:, 2], mentioned[:, 2]])
    keep = a != b
    relations = _row_shares(a[keep], b[keep], count)
    vectors = _near(corpus.centroids, home, 0.8, rng)
    lookup = {compact_key(name): i for i, name in enumerate(names)}
    return EntityGraph([entity_id(name) for name in names], names, vectors, lookup, mentions, relations, idf), mentioned


def statements(corpus, chunk_topics: np.ndarray, doc_chunks: int, mentioned: np.ndarray, entity_ids: list[str],
               rng: np.random.Generator) -> StatementGraph:
    n = len(chunk_topics)
    count = n * STATEMENTS_PER_CHUNK
    chunk_rows = np.repeat(np.arange(n), STATEMENTS_PER_CHUNK)
    topic = (chunk_rows // doc_chunks) * 2 + ((chunk_rows % doc_chunks) >= doc_chunks // 2)
    topic = np.unique(topic, return_inverse=True)[1].astype(np.int64)
    vectors = _near(corpus.centroids, chunk_topics[chunk_rows], 1.2, rng)
    # nine in ten facts are the statement's own; one in ten comes from a pool of n/20 shared facts (about six
    # statements each, across documents)
    shared = max(n // 20, 1)
    facts = np.where(rng.random(count) < 0.1, rng.integers(0, shared, size=count), shared + np.arange(count))
    entity = mentioned[chunk_rows, np.arange(count) % 3]
    # bridging nodes: facts first (node = fact), then entities (node = n_facts + entity row)
    n_facts = shared + count
    link_rows = np.concatenate([np.arange(count), np.arange(count)])
    link_cols = np.concatenate([facts, n_facts + entity])
    used, link_cols = np.unique(link_cols, return_inverse=True)
    links = sp.csr_matrix((np.ones(len(link_rows)), (link_rows, link_cols)), shape=(count, len(used)))
    links.data[:] = 1.0
    df = np.asarray(links.sum(axis=0)).ravel()
    link_idf = np.log1p(count / np.maximum(df, 1))
    link_idf = link_idf / link_idf.max()
    link_ids = [f"fact-{u:08d}" if u < n_facts else entity_ids[u - n_facts] for u in used.tolist()]
    members = sp.csr_matrix((np.ones(count), (topic, np.arange(count))), shape=(int(topic.max()) + 1, count))
    by_chunk = sp.csr_matrix((np.ones(count), (chunk_rows, np.arange(count))), shape=(n, count))
    words = corpus.words
    texts = [f"{words[(s * 31) % len(words)].title()} {words[(s * 17 + 3) % len(words)]} "
             f"{words[(s * 7 + 11) % len(words)]}." for s in range(count)]
    return StatementGraph([f"statement-{s:09d}" for s in range(count)], texts,
                          [f"topic {t}" for t in topic.tolist()], vectors, chunk_rows, topic, members, links,
                          links.T.tocsr(), link_ids, link_idf, by_chunk)


def lexical_graph(corpus, chunk_topics: np.ndarray, doc_chunks: int, seed: int = 3) -> tuple[LexicalGraph, np.ndarray]:
    """The graph, and its entities' types (drawn uniformly)."""
    rng = np.random.default_rng(seed)
    entity_graph, mentioned = entities(corpus, chunk_topics, rng)
    statement_graph = statements(corpus, chunk_topics, doc_chunks, mentioned, entity_graph.ids, rng)
    types = TYPES[rng.integers(0, len(TYPES), size=entity_graph.size)]
    return LexicalGraph(statement_graph, entity_graph, bridge_pair_share(statement_graph, len(chunk_topics))), types
