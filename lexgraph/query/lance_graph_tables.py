"""The lexical graph as LanceDB tables, for the graph channels on the lance query backend (lexgraph.query.lance_graph).

From LEXGRAPH_LANCE_THRESHOLD chunks on (or with LEXGRAPH_QUERY_BACKEND=lance) no query process loads the lexical
graph into memory; it reads what one question needs, by row number, from these tables:

- graph_entities: one row per resolved entity (row, entity_id, name, entity_type, idf, unit vector, the chunk ids
  that mention it, its related entities' rows and each relation's share of the entity's relation strength);
- graph_entity_names: compact name key -> entity row, kind "name" (a name or a surface form, what the memory
  graph's lookup holds) or "part" (a run of two or more words of a longer name that names one entity);
- graph_statements: one row per statement (row, statement_id, text, topic, topic_row, chunk_id, doc_id, unit
  vector, the rows of its bridging nodes: the facts it supports and their entities);
- graph_topics and graph_links: each topic's and bridging node's member statements (links also their id and idf).
- graph_mentions: (entity row, chunk id) of the hub entities, those mentioned in more than MEMBER_CAP chunks.

A list longer than MEMBER_CAP (a hub entity's chunks, a hub node's or a huge topic's statements) is not stored in
its row, only its length: a question reads a hub's members among the statements and chunks nearest the question
(lexgraph.query.lance_graph), never the whole list, so one name in every document costs a query no more than a
rare one.

A BTREE on each table's key; an ANN index (cosine) on the entity and statement vectors from ANN_FROM_ROWS rows
(below it LanceDB searches flat, exact). The numbers are the memory graph's (graph_channels.load_lexical_graph
builds both), so both backends walk the same graph. The graph_tables corpus step (update_graph_tables) writes
them after the lexical graph, whole; corpus/graph_tables.json records the lexical graph they were made from.
"""
from __future__ import annotations

import time
import numpy as np
import polars as pl
import pyarrow as pa
from lancedb.index import BTree

from lexgraph.atomic_json import write_json
from lexgraph.indexing.corpus_state import GRAPH_TABLES, GRAPH_TABLES_FORMAT, CorpusFiles, catalog_digest, read_json
from lexgraph.indexing.corpus_update import StepOutcome
from lexgraph.query import graph_channels, path_channel
from lexgraph.query.retrieval_types import LexicalGraph
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import CHUNKS, ENTITIES, VectorStore

GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_STATEMENTS = "graph_entities", "graph_entity_names", "graph_statements"
GRAPH_TOPICS, GRAPH_LINKS, GRAPH_MENTIONS = "graph_topics", "graph_links", "graph_mentions"
GRAPH_TABLE_NAMES = (GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_STATEMENTS, GRAPH_TOPICS, GRAPH_LINKS, GRAPH_MENTIONS)
VECTOR_ANN = "vector_ann"  # the entity and statement tables' ANN index
ANN_FROM_ROWS = 20_000  # below: flat (exact) search, a few ms at this size
BATCH_ROWS = 200_000  # statement rows written at a time
MEMBER_CAP = 2_000  # longer member lists are left out of their row (read through the question's nearest instead)
FORMAT = GRAPH_TABLES_FORMAT


def read_state(files: CorpusFiles) -> dict:
    """What the tables were written from ({} when never written or unreadable)."""
    state = read_json(files.graph_tables)
    return state if state.get("format") == FORMAT else {}


def _rows_of(matrix, row: int) -> np.ndarray:
    return matrix.indices[matrix.indptr[row]:matrix.indptr[row + 1]]


def _members(matrix) -> tuple[list[list[int]], np.ndarray]:
    """Each row's members as a list (empty past MEMBER_CAP) and each row's count."""
    counts = np.diff(matrix.indptr).astype(np.int64)
    return [(_rows_of(matrix, r).astype(np.int64).tolist() if counts[r] <= MEMBER_CAP else [])
            for r in range(matrix.shape[0])], counts


def _vectors(frame: pl.DataFrame, vectors: np.ndarray) -> pl.DataFrame:
    return frame.with_columns(pl.Series("vector", vectors.astype(np.float32), dtype=pl.Array(pl.Float32, vectors.shape[1])))


def _entity_frames(store: VectorStore, graph, chunk_ids: list[str], types=None) -> tuple[pl.DataFrame, pl.DataFrame]:
    if types is not None:
        types = np.asarray(types, dtype=object)
    elif ENTITIES not in store.table_names():
        types = np.full(graph.size, "other", dtype=object)
    else:
        table = store.scan(ENTITIES, ["entity_id", "entity_type"])
        kind = dict(zip(table["entity_id"].to_list(), table["entity_type"].to_list()))
        types = np.array([kind.get(e) or "other" for e in graph.ids], dtype=object)
    mentions, relations = graph.mentions.tocsr(), graph.relations.tocsr()
    ids = np.array(chunk_ids, dtype=object)
    members, counts = _members(mentions)
    entities = _vectors(pl.DataFrame({
        "row": np.arange(graph.size, dtype=np.int64), "entity_id": graph.ids, "name": graph.names,
        "entity_type": types.tolist(), "idf": graph.idf.astype(np.float64),
        "chunk_ids": [ids[m].tolist() for m in members], "chunk_count": counts,
        "neighbours": [_rows_of(relations, r).astype(np.int64).tolist() for r in range(graph.size)],
        "shares": [relations.data[relations.indptr[r]:relations.indptr[r + 1]].astype(np.float64).tolist()
                   for r in range(graph.size)],
    }, schema_overrides={"chunk_ids": pl.List(pl.String), "neighbours": pl.List(pl.Int64),
                         "shares": pl.List(pl.Float64)}), graph.unit_vectors)
    names = [(key, row, "name") for key, row in graph.lookup.items()]
    names += [(key, row, "part") for key, row in path_channel.partial_names(graph).items()]
    hubs = np.flatnonzero(counts > MEMBER_CAP)
    hub_rows = [np.full(counts[h], h, dtype=np.int64) for h in hubs]
    hub_mentions = pl.DataFrame({
        "entity_row": np.concatenate(hub_rows) if hub_rows else np.zeros(0, dtype=np.int64),
        "chunk_id": ids[np.concatenate([_rows_of(mentions, h) for h in hubs])].tolist() if len(hubs) else []},
        schema={"entity_row": pl.Int64, "chunk_id": pl.String})
    return (entities, pl.DataFrame(names, schema={"key": pl.String, "row": pl.Int64, "kind": pl.String}, orient="row"),
            hub_mentions)


def _statement_batches(graph, chunk_ids: list[str], doc_ids: list[str]):
    """The statements table a batch at a time: a million-chunk corpus has millions of statement vectors."""
    for start in range(0, graph.size, BATCH_ROWS):
        rows = np.arange(start, min(graph.size, start + BATCH_ROWS))
        chunk_rows = graph.chunk_rows[rows].tolist()
        yield _vectors(pl.DataFrame({
            "row": rows.astype(np.int64), "statement_id": graph.ids[start:rows[-1] + 1],
            "text": graph.texts[start:rows[-1] + 1], "topic": graph.topics[start:rows[-1] + 1],
            "topic_row": graph.topic[rows].astype(np.int64), "chunk_id": [chunk_ids[r] for r in chunk_rows],
            "doc_id": [doc_ids[r] for r in chunk_rows],
            "links": [_rows_of(graph.links, s).astype(np.int64).tolist() for s in rows.tolist()],
        }, schema_overrides={"links": pl.List(pl.Int64)}), graph.unit_vectors[rows])


def _statement_frames(graph, chunk_ids: list[str], doc_ids: list[str]):
    topics, links = graph.topic_members.tocsr(), graph.link_members.tocsr()
    topic_members, topic_counts = _members(topics)
    link_members, link_counts = _members(links)
    statements = _statement_batches(graph, chunk_ids, doc_ids)
    topic_frame = pl.DataFrame({"topic_row": np.arange(topics.shape[0], dtype=np.int64), "members": topic_members,
                                "member_count": topic_counts}, schema_overrides={"members": pl.List(pl.Int64)})
    link_frame = pl.DataFrame({"node": np.arange(links.shape[0], dtype=np.int64), "node_id": graph.link_ids,
                               "idf": graph.link_idf.astype(np.float64), "members": link_members,
                               "member_count": link_counts}, schema_overrides={"members": pl.List(pl.Int64)})
    return statements, topic_frame, link_frame


def _plain(kind: pa.DataType) -> pa.DataType:
    """Arrow's large string and list types (what polars writes) as the plain ones LanceDB's BTREE takes."""
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_list(kind):
        return pa.list_(_plain(kind.value_type))
    return kind


def _write(store: VectorStore, name: str, frames, key: str, vectors: bool = False) -> int:
    """Write a table from one frame or an iterable of batches, then its BTREE and (past ANN_FROM_ROWS) its ANN
    index; its row count."""
    table, rows = None, 0
    for frame in [frames] if isinstance(frames, pl.DataFrame) else frames:
        data = frame.to_arrow()
        data = data.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in data.schema]))
        if table is None:
            table = store.db.create_table(name, data=data, mode="overwrite")
        else:
            table.add(data)
        rows += frame.height
    if rows:
        table.create_index(key, config=BTree(), replace=True, name=f"{key}_btree")
    if vectors and rows >= ANN_FROM_ROWS:
        li.build_ann(table, rows, name=VECTOR_ANN)
    return rows


def write_graph_tables(store: VectorStore, graph: LexicalGraph, chunk_ids: list[str], doc_ids: list[str],
                       entity_types=None) -> dict:
    """The memory graph (built over chunks `chunk_ids`, rows aligned) as the graph tables; their row counts.
    entity_types: aligned with the entities (default: read from the LanceDB entities table)."""
    counts = {}
    if graph.entities is not None and graph.entities.size:
        entities, names, hub_mentions = _entity_frames(store, graph.entities, chunk_ids, entity_types)
        _write(store, GRAPH_ENTITIES, entities, "row", vectors=True)
        _write(store, GRAPH_NAMES, names, "key")
        _write(store, GRAPH_MENTIONS, hub_mentions, "chunk_id")
        counts.update({GRAPH_ENTITIES: entities.height, GRAPH_NAMES: names.height, GRAPH_MENTIONS: hub_mentions.height})
    else:
        _drop(store, (GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_MENTIONS))
    if graph.statements is not None and graph.statements.size:
        statements, topics, links = _statement_frames(graph.statements, chunk_ids, doc_ids)
        written = _write(store, GRAPH_STATEMENTS, statements, "row", vectors=True)
        store.db.open_table(GRAPH_STATEMENTS).create_index("chunk_id", config=BTree(), replace=True,
                                                           name="chunk_id_btree")
        _write(store, GRAPH_TOPICS, topics, "topic_row")
        _write(store, GRAPH_LINKS, links, "node")
        counts.update({GRAPH_STATEMENTS: written, GRAPH_TOPICS: topics.height, GRAPH_LINKS: links.height})
    else:
        _drop(store, (GRAPH_STATEMENTS, GRAPH_TOPICS, GRAPH_LINKS))
    return counts


def _drop(store: VectorStore, names) -> None:
    for name in names:
        if name in store.table_names():
            store.db.drop_table(name)


def update_graph_tables(files: CorpusFiles, store: VectorStore, extract: ExtractStore, settings) -> StepOutcome:
    """graph_tables: the lexical graph written as the graph tables when queries use the lance backend (below the
    threshold, only the record that none are needed), then recorded as built (the crash-safety commit)."""
    indexed = store.indexed_hashes()  # the catalog this build is made from
    digest = catalog_digest(indexed)
    chunks = store.count(CHUNKS)
    lexical_inputs = files.recorded_lexical_inputs()
    figures = {"chunks": chunks, "threshold": settings.lance_threshold, "query_backend": settings.query_backend,
               "catalog_digest": digest}
    if chunks == 0 or not settings.uses_lance(chunks):
        files.record_built(GRAPH_TABLES, digest, settings)
        return StepOutcome(digest, figures={**figures, "decision": "below threshold: none"})
    started = time.perf_counter()
    frame = store.scan(CHUNKS, ["chunk_id", "doc_id"])
    chunk_ids, doc_ids = frame["chunk_id"].to_list(), frame["doc_id"].to_list()
    graph = graph_channels.load_lexical_graph(store, extract, {c: i for i, c in enumerate(chunk_ids)})
    counts = write_graph_tables(store, graph, chunk_ids, doc_ids)
    record_tables(files, graph, counts, digest, lexical_inputs)
    files.record_built(GRAPH_TABLES, digest, settings)
    return StepOutcome(digest, figures={**figures, "decision": "written", "seconds": round(time.perf_counter() - started, 2),
                                        "bridge_pair_share": round(graph.bridge_pair_share, 4)},
                       details={"rows": counts}, paths={"state": str(files.graph_tables)})


def record_tables(files: CorpusFiles, graph: LexicalGraph, counts: dict, digest: str, lexical_inputs: str | None) -> None:
    """What the tables were written from, and the graph-wide figures a query needs without reading them."""
    entities = graph.entities
    write_json(files.graph_tables, {
        "format": FORMAT, "catalog_digest": digest, "lexical_inputs": lexical_inputs,
        "bridge_pair_share": graph.bridge_pair_share,
        "entity_idf_max": entities.idf_max if entities is not None else 0.0,
        "entity_mentions": int(entities.mentions.nnz) if entities is not None else 0,
        "entity_relations": int(entities.relations.nnz) if entities is not None else 0, "counts": counts,
        "member_cap": MEMBER_CAP}, indent=1)


def tables_current(files: CorpusFiles) -> bool:
    """Whether the graph tables were written from the lexical graph as it is now."""
    return read_state(files).get("lexical_inputs") == files.recorded_lexical_inputs()
