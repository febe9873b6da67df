"""The lexical graph as LanceDB tables, for the graph channels on the lance query backend (lexgraph.query.lance_graph).

From LEXGRAPH_LANCE_THRESHOLD chunks on (or with LEXGRAPH_QUERY_BACKEND=lance) no query process loads the lexical
graph into memory; it reads what one question needs, by row number, from these tables:

- graph_entities: one row per resolved entity (row, entity_id, name, entity_type, unit vector, the chunk ids that
  mention it and their count, its related entities' rows and each relation's share of the entity's relation
  strength);
- graph_entity_names: compact name key -> entity row, kind "name" (rank 0: the entity's name; rank 1: a surface
  form, with the document it was seen in) or "part" (a run of two or more words of a longer name); a query takes
  a name's rank-0 entity, else the smallest entity id, and a part only when it names one entity and no name has
  that key, so the choice depends on no row order;
- graph_statements: one row per statement (row, statement_id, text, topic, topic_row, chunk_id, doc_id, unit
  vector, the rows of its bridging nodes: the facts it supports and their entities);
- graph_topics and graph_links: each topic's and bridging node's member statements (links also the node id and
  the number of chunks its statements are in);
- graph_mentions: (entity row, chunk id, doc id) of every mention; graph_relations: (entity rows a and b, weight,
  doc id) of every relation, what an entity's row is made from again when a document changes.

A list longer than MEMBER_CAP (a hub entity's chunks, a hub node's or a huge topic's statements) is not stored in
its row, only its length: a question reads a hub's members among the statements and chunks nearest the question
(lexgraph.query.lance_graph), never the whole list, so one name in every document costs a query no more than a
rare one. The idfs are not stored: they depend on the corpus size, so a query computes them from the counts and
the corpus figures in corpus/graph_tables.json.

A BTREE on each table's keys; an ANN index (cosine) on the entity and statement vectors from ANN_FROM_ROWS rows
(below it LanceDB searches flat, exact). The graph_tables corpus step (graph_tables_step) writes them after the
lexical graph: by difference when the lexical graph was itself updated by difference from the graph the tables
hold (lexgraph.query.graph_tables_diff: only the changed documents' rows and the entities, nodes and topics they
touch), else whole from the memory graph (graph_channels.load_lexical_graph), so both backends walk the same
graph. Row numbers are keys, not positions: a diff gives new rows numbers after the largest ever given.
corpus/graph_tables.json records the lexical graph the tables were made from and the corpus figures.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
from lancedb.index import BTree

from lexgraph.atomic_json import write_json
from lexgraph.indexing.corpus_state import GRAPH_TABLES_FORMAT, CorpusFiles, read_json
from lexgraph.query import graph_channels
from lexgraph.query.path_channel import name_parts
from lexgraph.query.retrieval_types import LexicalGraph
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.vector_store import ENTITIES, VectorStore

GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_STATEMENTS = "graph_entities", "graph_entity_names", "graph_statements"
GRAPH_TOPICS, GRAPH_LINKS, GRAPH_MENTIONS = "graph_topics", "graph_links", "graph_mentions"
GRAPH_RELATIONS = "graph_relations"
GRAPH_TABLE_NAMES = (GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_STATEMENTS, GRAPH_TOPICS, GRAPH_LINKS, GRAPH_MENTIONS,
                     GRAPH_RELATIONS)
# each table's keys (a BTREE each; the first is the row key)
KEYS = {GRAPH_ENTITIES: ("row", "entity_id"), GRAPH_NAMES: ("key", "row", "doc_id"),
        GRAPH_STATEMENTS: ("row", "chunk_id", "doc_id"), GRAPH_TOPICS: ("topic_row", "topic_id"),
        GRAPH_LINKS: ("node", "node_id"), GRAPH_MENTIONS: ("chunk_id", "entity_row", "doc_id"),
        GRAPH_RELATIONS: ("a", "b", "doc_id")}
VECTOR_ANN = "vector_ann"  # the entity and statement tables' ANN index
ANN_FROM_ROWS = 20_000  # below: flat (exact) search, a few ms at this size
BATCH_ROWS = 200_000  # statement rows written at a time
MEMBER_CAP = 2_000  # longer member lists are left out of their row (read through the question's nearest instead)
FORMAT = GRAPH_TABLES_FORMAT
SCHEMAS = {
    GRAPH_NAMES: {"key": pl.Utf8, "row": pl.Int64, "entity_id": pl.Utf8, "kind": pl.Utf8, "rank": pl.Int64,
                  "doc_id": pl.Utf8},
    GRAPH_MENTIONS: {"entity_row": pl.Int64, "chunk_id": pl.Utf8, "doc_id": pl.Utf8},
    GRAPH_RELATIONS: {"a": pl.Int64, "b": pl.Int64, "weight": pl.Float64, "doc_id": pl.Utf8},
    GRAPH_TOPICS: {"topic_row": pl.Int64, "topic_id": pl.Utf8, "members": pl.List(pl.Int64), "member_count": pl.Int64},
    GRAPH_LINKS: {"node": pl.Int64, "node_id": pl.Utf8, "members": pl.List(pl.Int64), "member_count": pl.Int64,
                  "chunk_count": pl.Int64},
}


def read_state(files: CorpusFiles) -> dict:
    """What the tables were written from ({} when never written, unreadable, or of another format)."""
    state = read_json(files.graph_tables)
    return state if state.get("format") == FORMAT else {}


def _rows_of(matrix, row: int) -> np.ndarray:
    return matrix.indices[matrix.indptr[row]:matrix.indptr[row + 1]]


def _capped(members: list, count: int) -> list:
    return members if count <= MEMBER_CAP else []


def _members(matrix) -> tuple[list[list[int]], np.ndarray]:
    """Each row's members as a list (empty past MEMBER_CAP) and each row's count."""
    counts = np.diff(matrix.indptr).astype(np.int64)
    return [(_rows_of(matrix, r).astype(np.int64).tolist() if counts[r] <= MEMBER_CAP else [])
            for r in range(matrix.shape[0])], counts


def _vectors(frame: pl.DataFrame, vectors: np.ndarray) -> pl.DataFrame:
    return frame.with_columns(pl.Series("vector", vectors.astype(np.float32), dtype=pl.Array(pl.Float32, vectors.shape[1])))


# --- entity rows, from mention and relation rows (a whole write and a diff make them alike) ---------------------


def entity_link_rows(rows: list[int], mentions: pl.DataFrame, relations: pl.DataFrame) -> pl.DataFrame:
    """row, chunk_ids (empty past MEMBER_CAP), chunk_count, neighbours, shares of these entity rows, from all their
    mention rows (entity_row, chunk_id) and all relation rows (a, b, weight) they are in: each relation both ways,
    summed per pair, as shares of the row's total (as graph_channels.relation_shares)."""
    base = pl.DataFrame({"row": rows}, schema={"row": pl.Int64})
    chunks = (mentions.select("entity_row", "chunk_id").unique().group_by("entity_row")
              .agg(pl.col("chunk_id").sort().alias("chunk_ids"), pl.len().cast(pl.Int64).alias("chunk_count"))
              .with_columns(pl.when(pl.col("chunk_count") <= MEMBER_CAP).then(pl.col("chunk_ids"))
                            .otherwise(pl.lit([], dtype=pl.List(pl.Utf8))).alias("chunk_ids")))
    both = pl.concat([relations.select(pl.col("a").alias("from"), pl.col("b").alias("to"), "weight"),
                      relations.select(pl.col("b").alias("from"), pl.col("a").alias("to"), "weight")])
    pairs = both.group_by("from", "to").agg(pl.col("weight").sum())
    pairs = pairs.with_columns((pl.col("weight") / pl.col("weight").sum().over("from").clip(1e-12, None)).alias("share"))
    related = (pairs.sort("from", "to").group_by("from", maintain_order=True)
               .agg(pl.col("to").alias("neighbours"), pl.col("share").alias("shares")))
    out = (base.join(chunks, left_on="row", right_on="entity_row", how="left")
           .join(related, left_on="row", right_on="from", how="left"))
    return out.with_columns(pl.col("chunk_ids").fill_null(pl.lit([], dtype=pl.List(pl.Utf8))),
                            pl.col("chunk_count").fill_null(0),
                            pl.col("neighbours").fill_null(pl.lit([], dtype=pl.List(pl.Int64))),
                            pl.col("shares").fill_null(pl.lit([], dtype=pl.List(pl.Float64))))


def entity_base_rows(store: VectorStore, rows: dict[str, int], where: str) -> pl.DataFrame:
    """row, entity_id, name, entity_type, unit vector of the entities in `rows` (entity id -> row; `where` selects
    them), from the entities vector table (the vectors through Arrow and numpy, never as Python floats)."""
    table = store.db.open_table(ENTITIES)
    columns = [c for c in ("entity_id", "name", "entity_type", "vector") if c in table.schema.names]
    arrow = table.search().where(where).select(columns).limit(None).to_arrow()
    vector = arrow.column("vector").combine_chunks()
    dimension = vector.type.list_size if hasattr(vector.type, "list_size") else len(vector[0]) if len(vector) else 0
    values = vector.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    found = pl.from_arrow(arrow.drop_columns(["vector"]))
    types = found["entity_type"] if "entity_type" in found.columns else pl.Series([None] * found.height, dtype=pl.Utf8)
    return _vectors(_base_frame(found["entity_id"].replace_strict(rows, return_dtype=pl.Int64), found["entity_id"],
                                found["name"], types), graph_channels._unit(values.reshape(len(vector), dimension)))


def _base_frame(rows, ids, names, types) -> pl.DataFrame:
    """row, entity_id, name, entity_type ("other" where none is said)."""
    return pl.DataFrame({"row": rows, "entity_id": ids, "name": names, "entity_type": types},
                        schema={"row": pl.Int64, "entity_id": pl.Utf8, "name": pl.Utf8, "entity_type": pl.Utf8}) \
        .with_columns(pl.col("entity_type").fill_null("other").replace("", "other"))


def name_rows(entities: pl.DataFrame, surface: pl.DataFrame) -> pl.DataFrame:
    """The names table's rows: each entity's name (rank 0) and its name's parts (kind "part"), from `entities`
    (row, entity_id, name), and the surface forms (rank 1) of `surface` (row, entity_id, entity_name, doc_id)."""
    out = []
    for row, entity, name in entities.select("row", "entity_id", "name").iter_rows():
        key = graph_channels.name_key(name)
        if key is not None:
            out.append((key, row, entity, "name", 0, ""))
        out.extend((part, row, entity, "part", 2, "") for part in sorted(name_parts(name)))
    for row, entity, name, doc in surface.select("row", "entity_id", "entity_name", "doc_id").unique().iter_rows():
        key = graph_channels.name_key(name)
        if key is not None:
            out.append((key, row, entity, "name", 1, doc))
    return pl.DataFrame(out, schema=SCHEMAS[GRAPH_NAMES], orient="row").unique()


# --- the whole write --------------------------------------------------------------------------------------------


def _entity_frames(store: VectorStore, graph, mentions: pl.DataFrame, relations: pl.DataFrame,
                   doc_of: dict[str, str]) -> dict[str, pl.DataFrame]:
    row_of = {e: i for i, e in enumerate(graph.ids)}
    # the mentions with their entity's row and document: the mention rows and the surface forms
    placed = mentions.select(pl.col("entity_id").replace_strict(row_of, return_dtype=pl.Int64).alias("row"),
                             "entity_id", "entity_name", "chunk_id",
                             pl.col("chunk_id").replace_strict(doc_of, return_dtype=pl.Utf8).alias("doc_id"))
    mention_rows = placed.select(pl.col("row").alias("entity_row"), "chunk_id", "doc_id").unique()
    relation_rows = pl.DataFrame({"a": [row_of[e] for e in relations["a"].to_list()],
                                  "b": [row_of[e] for e in relations["b"].to_list()],
                                  "weight": relations["weight"].to_list(),
                                  "doc_id": [doc_of[c] for c in relations["chunk_id"].to_list()]},
                                 schema=SCHEMAS[GRAPH_RELATIONS])
    # names and vectors as the memory graph holds them (read from the entities table once); the types alone
    kinds = store.scan(ENTITIES, ["entity_id", "entity_type"]) if "entity_type" in \
        store.db.open_table(ENTITIES).schema.names else pl.DataFrame()
    kind = dict(zip(kinds["entity_id"].to_list(), kinds["entity_type"].to_list())) if kinds.height else {}
    base = _vectors(_base_frame(np.arange(graph.size, dtype=np.int64), graph.ids, graph.names,
                                [kind.get(e) for e in graph.ids]), graph.unit_vectors)
    links = entity_link_rows(list(range(graph.size)), mention_rows, relation_rows)
    entities = base.join(links, on="row").sort("row")
    return {GRAPH_ENTITIES: entities, GRAPH_NAMES: name_rows(entities, placed), GRAPH_MENTIONS: mention_rows,
            GRAPH_RELATIONS: relation_rows}


def _statement_batches(graph, chunk_ids: list[str], doc_ids: list[str]):
    """The statements table a batch at a time: a million-chunk corpus has millions of statement vectors."""
    for start in range(0, graph.size, BATCH_ROWS):
        rows = np.arange(start, min(graph.size, start + BATCH_ROWS))
        yield statement_frame(graph, rows, rows, graph.topic[rows], [chunk_ids[r] for r in graph.chunk_rows[rows]],
                              [doc_ids[r] for r in graph.chunk_rows[rows]],
                              [_rows_of(graph.links, s).astype(np.int64).tolist() for s in rows.tolist()])


def statement_frame(graph, local: np.ndarray, rows: np.ndarray, topic_rows, chunk_ids: list[str], doc_ids: list[str],
                    links: list[list[int]]) -> pl.DataFrame:
    """The statements table's rows of the graph's statements `local`, numbered `rows`."""
    return _vectors(pl.DataFrame({
        "row": np.asarray(rows, dtype=np.int64), "statement_id": [graph.ids[i] for i in local],
        "text": [graph.texts[i] for i in local], "topic": [graph.topics[i] for i in local],
        "topic_row": np.asarray(topic_rows, dtype=np.int64), "chunk_id": chunk_ids, "doc_id": doc_ids,
        "links": links}, schema_overrides={"links": pl.List(pl.Int64)}), graph.unit_vectors[np.asarray(local)])


def node_chunk_counts(graph) -> np.ndarray:
    """Each bridging node's number of distinct chunks among its statements."""
    return np.asarray((graph.link_members @ graph.by_chunk.T).astype(bool).sum(axis=1), dtype=np.int64).ravel()


def _statement_frames(graph, chunk_ids: list[str], doc_ids: list[str]):
    topics, links = graph.topic_members.tocsr(), graph.link_members.tocsr()
    topic_members, topic_counts = _members(topics)
    link_members, link_counts = _members(links)
    topic_ids = graph.topic_ids or [str(t) for t in range(topics.shape[0])]
    topic_frame = pl.DataFrame({"topic_row": np.arange(topics.shape[0], dtype=np.int64), "topic_id": topic_ids,
                                "members": topic_members, "member_count": topic_counts}, schema=SCHEMAS[GRAPH_TOPICS])
    link_frame = pl.DataFrame({"node": np.arange(links.shape[0], dtype=np.int64), "node_id": graph.link_ids,
                               "members": link_members, "member_count": link_counts,
                               "chunk_count": node_chunk_counts(graph)}, schema=SCHEMAS[GRAPH_LINKS])
    return _statement_batches(graph, chunk_ids, doc_ids), topic_frame, link_frame


def _plain(kind: pa.DataType) -> pa.DataType:
    """Arrow's large string and list types (what polars writes) as the plain ones LanceDB's BTREE takes."""
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_list(kind):
        return pa.list_(_plain(kind.value_type))
    return kind


def to_arrow(frame: pl.DataFrame) -> pa.Table:
    data = frame.to_arrow()
    return data.cast(pa.schema([pa.field(f.name, _plain(f.type)) for f in data.schema]))


def _write(store: VectorStore, name: str, frames, vectors: bool = False) -> int:
    """Write a table from one frame or an iterable of batches, then a BTREE on each of its keys and (past
    ANN_FROM_ROWS) its ANN index; its row count."""
    table, rows = None, 0
    for frame in [frames] if isinstance(frames, pl.DataFrame) else frames:
        if table is None:
            table = store.db.create_table(name, data=to_arrow(frame), mode="overwrite")
        else:
            table.add(to_arrow(frame))
        rows += frame.height
    if rows:
        for key in KEYS[name]:
            table.create_index(key, config=BTree(), replace=True, name=f"{key}_btree")
    if vectors and rows >= ANN_FROM_ROWS:
        li.build_ann(table, rows, name=VECTOR_ANN)
    return rows


def write_graph_tables(store: VectorStore, graph: LexicalGraph, chunk_ids: list[str], doc_ids: list[str],
                       rows: dict) -> dict:
    """The memory graph (built over chunks `chunk_ids`, rows aligned; `rows`: the mention and relation rows its
    entity graph was made from, load_lexical_graph's) as the graph tables -> the corpus figures to record."""
    counts: dict[str, int] = {}
    figures = {"chunks": len(chunk_ids), "statements": 0, "entity_df_min": 1, "link_df_min": 1, "bridge_pairs": 0,
               "entity_mentions": 0, "entity_relations": 0,
               "next": {"entity": 0, "statement": 0, "topic": 0, "node": 0}}
    if graph.entities is not None and graph.entities.size:
        doc_of = dict(zip(chunk_ids, doc_ids))
        mentions = rows.get("mentions")
        if mentions is None:
            mentions = pl.DataFrame(schema={"entity_name": pl.Utf8, "entity_id": pl.Utf8, "chunk_id": pl.Utf8})
        frames = _entity_frames(store, graph.entities, mentions, rows["relations"], doc_of)
        for name, frame in frames.items():
            counts[name] = _write(store, name, frame, vectors=name == GRAPH_ENTITIES)
        entity_counts = frames[GRAPH_ENTITIES]["chunk_count"]
        figures.update(entity_df_min=max(1, int(entity_counts.min())), entity_mentions=frames[GRAPH_MENTIONS].height,
                       entity_relations=frames[GRAPH_RELATIONS].height)
        figures["next"]["entity"] = graph.entities.size
    else:
        _drop(store, (GRAPH_ENTITIES, GRAPH_NAMES, GRAPH_MENTIONS, GRAPH_RELATIONS))
    if graph.statements is not None and graph.statements.size:
        statements, topics, links = _statement_frames(graph.statements, chunk_ids, doc_ids)
        counts[GRAPH_STATEMENTS] = _write(store, GRAPH_STATEMENTS, statements, vectors=True)
        counts[GRAPH_TOPICS] = _write(store, GRAPH_TOPICS, topics)
        counts[GRAPH_LINKS] = _write(store, GRAPH_LINKS, links)
        chunk_counts = links["chunk_count"].to_numpy()
        figures.update(statements=graph.statements.size, bridge_pairs=int((chunk_counts * (chunk_counts - 1)).sum()),
                       link_df_min=max(1, int(links["member_count"].min())) if links.height else 1)
        figures["next"].update(statement=graph.statements.size, topic=topics.height, node=links.height)
    else:
        _drop(store, (GRAPH_STATEMENTS, GRAPH_TOPICS, GRAPH_LINKS))
    return {**figures, "counts": counts}


def _drop(store: VectorStore, names) -> None:
    for name in names:
        if name in store.table_names():
            store.db.drop_table(name)


def corpus_figures(figures: dict) -> dict:
    """The graph-wide figures a query needs without reading the tables, from the recorded counts."""
    chunks = figures["chunks"]
    pairs = figures["bridge_pairs"]
    share = 1.0 if not figures["statements"] or chunks < 2 else min(1.0, pairs / (chunks * (chunks - 1)))
    return {"entity_idf_max": float(graph_channels.entity_idf(np.array([figures["entity_df_min"]]), chunks)[0])
            if figures["next"]["entity"] else 0.0, "bridge_pair_share": share}


def mark_writing(files: CorpusFiles, state: dict) -> None:
    """Before any table is written: a process killed from here until record_tables leaves tables that are not
    current (no lexical inputs recorded), so the next run writes them whole."""
    write_json(files.graph_tables, {**state, "format": FORMAT, "lexical_inputs": None, "writing": True}, indent=1)


def record_tables(files: CorpusFiles, figures: dict, digest: str, lexical_inputs: str | None) -> None:
    """What the tables were written from, and the graph-wide figures a query needs without reading them."""
    write_json(files.graph_tables, {"format": FORMAT, "catalog_digest": digest, "lexical_inputs": lexical_inputs,
                                    **figures, **corpus_figures(figures), "member_cap": MEMBER_CAP}, indent=1)


def tables_current(files: CorpusFiles) -> bool:
    """Whether the graph tables were written from the lexical graph as it is now."""
    state = read_state(files)
    return bool(state) and state.get("lexical_inputs") == files.recorded_lexical_inputs()
