"""The lexical graph read from its LanceDB tables (lexgraph.query.lance_graph_tables), a question at a time: what
the statement, entity and path channels and the answer layer need on the lance query backend.

LanceEntities and LanceStatements answer the same calls as the memory graph (retrieval_types.EntityGraph and
StatementGraph): nearest (the vector table's ANN index, or a flat search below it), similarity of given rows,
names, relations, mentions, topic and link members. Rows are fetched by number through the tables' BTREE and
kept in a bounded cache, so a question reads its neighbourhood once and the process holds no graph-sized array.
Chunk refs are chunk ids here: the lance chunk backend turns them into rows and cosines (LanceBackend.chunk_cosines).

A hub (an entity mentioned in more than MEMBER_CAP chunks, a fact, entity or topic with more than MEMBER_CAP
statements) is read through the question's FOCUS nearest statements: its members among them, and its chunks
among theirs (graph_mentions). Below the cap, and so on every graph where no list is that long, the walk is the
memory graph's exactly; above it, a hub reaches what is near the question instead of everything it touches.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from lexgraph.query.lance_graph_tables import (GRAPH_ENTITIES, GRAPH_LINKS, GRAPH_MENTIONS, GRAPH_NAMES,
                                               GRAPH_STATEMENTS, GRAPH_TOPICS, VECTOR_ANN, FORMAT, read_state,
                                               tables_current)
from lexgraph.indexing.corpus_state import read_json
from lexgraph.query import graph_channels
from lexgraph.query.retrieval_types import LexicalGraph
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.vector_store import VectorStore, _in_list

CACHE_ROWS = 20_000  # rows of each table kept between questions
FOCUS = 1_000  # nearest statements a hub's members are read among
FOCUS_CACHE = 64  # questions whose nearest statements are kept
_IN_BATCH = 2_000  # ids in one IN (...) filter


class _RowCache:
    """Rows of one graph table by key, fetched in batches and kept in a bounded LRU."""

    def __init__(self, table, key: str, columns: list[str], size: int = CACHE_ROWS):
        self.table, self.key, self.columns, self.size = table, key, columns, size
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def one(self, key):
        """The record of one key (None when the table has none); no copy of a list for a cached one."""
        with self._lock:
            record = self._cache.get(key)
        return record if record is not None else self.get([key]).get(key)

    def get(self, keys) -> dict:
        """key -> record (a dict of the columns) for the keys the table holds."""
        keys = list(dict.fromkeys(keys))
        with self._lock:
            missing = [k for k in keys if k not in self._cache]
        fetched = {}
        for start in range(0, len(missing), _IN_BATCH):
            part = missing[start:start + _IN_BATCH]
            found = self.table.search().where(_in(self.key, part)).select(self.columns).limit(len(part)).to_arrow()
            vectors = None
            if "vector" in self.columns and found.num_rows:  # as one float32 array, not lists of Python floats
                vectors = found.column("vector").combine_chunks().values.to_numpy().reshape(found.num_rows, -1)
                found = found.drop_columns(["vector"])
            for i, record in enumerate(found.to_pylist()):
                if vectors is not None:
                    record["vector"] = vectors[i]
                fetched[record[self.key]] = record
        with self._lock:
            self._cache.update(fetched)
            out = {}
            for k in keys:
                record = self._cache.get(k)
                if record is not None:
                    self._cache.move_to_end(k)
                    out[k] = record
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return out


def _in(column: str, values: list) -> str:
    if values and isinstance(values[0], str):
        return _in_list(column, values)
    return f"{column} IN ({', '.join(str(int(v)) for v in values)})"


def _nearest(table, query_vector: np.ndarray, k: int, probe: li.AnnProbe) -> tuple[np.ndarray, np.ndarray]:
    found = probe.apply(table.search(query_vector.astype(np.float32)).distance_type("cosine").limit(k), k) \
        .select(["row", "_distance"]).to_arrow()
    return (found.column("row").to_numpy().astype(np.int64),
            (1.0 - found.column("_distance").to_numpy()).astype(np.float32))


def _vectors_of(records: dict, rows: np.ndarray) -> np.ndarray:
    return np.stack([records[int(r)]["vector"] for r in rows.tolist()]).astype(np.float32, copy=False)


class _VectorTable:
    """Nearest rows (the table's ANN index, or flat below it) and cosines of given rows (their cached vectors)."""

    table: object
    probe: li.AnnProbe  # the table's own ANN index: its share of partitions probed, PQ distances refined
    _rows: _RowCache

    def nearest(self, query_vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return _nearest(self.table, query_vector, k, self.probe)

    def similarity(self, query_vector: np.ndarray, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        return _vectors_of(self._rows.get(rows.tolist()), rows) @ query_vector.astype(np.float32)


class LanceEntities(_VectorTable):
    """The entity graph of the entity and path channels, read from graph_entities and graph_entity_names."""

    def __init__(self, store: VectorStore, state: dict, params):
        self.table = store.db.open_table(GRAPH_ENTITIES)
        self.names = store.db.open_table(GRAPH_NAMES)
        self.size = self.table.count_rows()
        self.probe = _probe(self.table, params)
        self.idf_max = float(state.get("entity_idf_max", 0.0))
        self.chunks = int(state.get("chunks", 0))  # the corpus size the idfs are computed from
        self.has_mentions = bool(state.get("entity_mentions"))
        self.has_relations = bool(state.get("entity_relations"))
        self._rows = _RowCache(self.table, "row", ["row", "entity_id", "name", "entity_type", "vector",
                                                   "chunk_ids", "chunk_count", "neighbours", "shares"])
        self.mentions = store.db.open_table(GRAPH_MENTIONS) if GRAPH_MENTIONS in store.table_names() else None
        self.statements: LanceStatements | None = None  # what a hub entity's chunks are read among
        self._keys = {kind: _RowCache(self.names, "key", ["key", "row", "kind"]) for kind in ("name", "part")}

    def _candidates(self, keys: list[str]) -> dict[str, list[tuple]]:
        """key -> its rows in the names table (kind, rank, entity id, row)."""
        found: dict[str, list[tuple]] = {}
        if not keys:
            return found
        rows = self.names.search().where(_in("key", list(dict.fromkeys(keys)))) \
            .select(["key", "kind", "rank", "entity_id", "row"]).limit(None).to_arrow().to_pylist()
        for r in rows:
            found.setdefault(r["key"], []).append((r["kind"], r["rank"], r["entity_id"], r["row"]))
        return found

    def named(self, keys: list[str]) -> list[int]:
        """An entity's own name before a surface form, then the smallest entity id (graph_channels.best_names)."""
        found = self._candidates(keys)
        best = graph_channels.best_names((k, rank, entity) for k, rows in found.items()
                                         for kind, rank, entity, _ in rows if kind == "name")
        row_of = {entity: row for rows in found.values() for _, _, entity, row in rows}
        return [int(row_of[best[k]]) for k in keys if k in best]

    def partly_named(self, keys: list[str]) -> list[int]:
        """Parts of longer names that name one entity and are no entity's name (path_channel.partial_names)."""
        found = self._candidates(keys)
        one = {k: {row for kind, _, _, row in rows} for k, rows in found.items()
               if all(kind == "part" for kind, *_ in rows)}
        return [int(next(iter(one[k]))) for k in keys if k in one and len(one[k]) == 1]

    def relations_of(self, rows: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        records = self._rows.get(rows)
        return {r: (np.asarray(records[r]["neighbours"] or [], dtype=np.int64),
                    np.asarray(records[r]["shares"] or [], dtype=np.float64)) for r in rows if r in records}

    def chunks_of(self, rows: list[int], query_vector: np.ndarray | None = None) -> list[np.ndarray]:
        """The chunk ids each entity is mentioned in; a hub's, among the chunks of the question's nearest
        statements (none without a question vector)."""
        records = self._rows.get(rows)
        out = {r: list(records[r]["chunk_ids"] or []) if r in records else [] for r in rows}
        hubs = [r for r in rows if r in records and records[r]["chunk_count"] > len(out[r])]
        if hubs and query_vector is not None and self.statements is not None and self.mentions is not None:
            near = self.statements.near_chunk_ids(query_vector)
            if near:
                found = self.mentions.search().where(f"{_in('entity_row', hubs)} AND {_in('chunk_id', near)}") \
                    .select(["entity_row", "chunk_id"]).limit(None).to_arrow()
                for entity, chunk in zip(found.column("entity_row").to_pylist(), found.column("chunk_id").to_pylist()):
                    out[int(entity)].append(chunk)
        return [np.asarray(out[r], dtype=object) for r in rows]

    def idf_of(self, rows) -> np.ndarray:
        rows = [int(r) for r in rows]
        records = self._rows.get(rows)
        counts = np.array([records[r]["chunk_count"] if r in records else 0 for r in rows], dtype=np.float64)
        return np.where([r in records for r in rows], graph_channels.entity_idf(counts, self.chunks), 0.0)

    def types_of(self, rows) -> np.ndarray:
        rows = [int(r) for r in rows]
        records = self._rows.get(rows)
        return np.array([(records[r]["entity_type"] or "other") if r in records else "other" for r in rows],
                        dtype=object)

    def describe(self, rows) -> list[tuple[str, str]]:
        """(entity id, name) of each row."""
        records = self._rows.get([int(r) for r in rows])
        return [(records[r]["entity_id"], records[r]["name"]) for r in rows if r in records]


class LanceStatements(_VectorTable):
    """The statement graph of the statement channel and the answer layer, read from graph_statements,
    graph_topics and graph_links."""

    def __init__(self, store: VectorStore, state: dict, params):
        self.table = store.db.open_table(GRAPH_STATEMENTS)
        self.counted = int(state.get("statements", 0)), float(state.get("link_df_min", 1))  # what node idfs use
        self.size = self.table.count_rows()
        self.probe = _probe(self.table, params)
        self._rows = _RowCache(self.table, "row", ["row", "statement_id", "text", "topic", "topic_row", "chunk_id",
                                                   "doc_id", "vector", "links"])
        self._topics = _RowCache(store.db.open_table(GRAPH_TOPICS), "topic_row", ["topic_row", "members",
                                                                                   "member_count"])
        self._links = _RowCache(store.db.open_table(GRAPH_LINKS), "node", ["node", "node_id", "members",
                                                                           "member_count"])
        self._focus: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._focus_lock = threading.Lock()

    def prefetch(self, statements=(), topics=(), links=()) -> None:
        """Rows about to be read one by one, read together (one query per table)."""
        if len(statements):
            self._rows.get([int(r) for r in statements])
        if len(topics):
            self._topics.get([int(t) for t in topics])
        if len(links):
            self._links.get([int(n) for n in links])

    def _record(self, row: int) -> dict:
        return self._rows.one(int(row))

    def topic_of(self, row: int) -> int:
        return int(self._record(row)["topic_row"])

    def links_of(self, row: int) -> np.ndarray:
        return np.asarray(self._record(row)["links"] or [], dtype=np.int64)

    def link_strength(self, node: int) -> float:
        statements, df_min = self.counted
        return float(graph_channels.node_idf(np.array([self._links.one(int(node))["member_count"]]), statements,
                                             df_min)[0])

    def link_name(self, node: int) -> str:
        return self._links.one(int(node))["node_id"]

    def near(self, query_vector: np.ndarray) -> np.ndarray:
        """The question's FOCUS nearest statements (their rows read too), kept for the question's other calls."""
        key = query_vector.astype(np.float32).tobytes()
        with self._focus_lock:
            if key in self._focus:
                self._focus.move_to_end(key)
                return self._focus[key]
        rows, _ = self.nearest(query_vector, min(FOCUS, self.size))
        self._rows.get(rows.tolist())
        with self._focus_lock:
            self._focus[key] = rows
            while len(self._focus) > FOCUS_CACHE:
                self._focus.popitem(last=False)
        return rows

    def near_chunk_ids(self, query_vector: np.ndarray) -> list[str]:
        rows = self.near(query_vector)
        records = self._rows.get(rows.tolist())
        return list(dict.fromkeys(records[r]["chunk_id"] for r in rows.tolist() if r in records))

    def _members(self, record: dict | None, query_vector, holds) -> np.ndarray:
        if not record:
            return np.zeros(0, dtype=np.int64)
        if record["member_count"] <= len(record["members"] or []):
            return np.asarray(record["members"], dtype=np.int64)
        if query_vector is None:  # a hub, and no question to read it by
            return np.zeros(0, dtype=np.int64)
        near = self.near(query_vector)
        records = self._rows.get(near.tolist())
        return np.array([r for r in near.tolist() if r in records and holds(records[r])], dtype=np.int64)

    def topic_statements(self, topic: int, query_vector: np.ndarray | None = None) -> np.ndarray:
        """A topic's statements; a hub topic's among the question's nearest."""
        return self._members(self._topics.get([int(topic)]).get(int(topic)), query_vector,
                             lambda record: record["topic_row"] == topic)

    def link_statements(self, node: int, query_vector: np.ndarray | None = None) -> np.ndarray:
        """A bridging node's statements; a hub node's among the question's nearest."""
        return self._members(self._links.get([int(node)]).get(int(node)), query_vector,
                             lambda record: node in (record["links"] or []))

    def chunk_refs(self, rows: np.ndarray) -> np.ndarray:
        records = self._rows.get([int(r) for r in rows])
        return np.array([records[int(r)]["chunk_id"] for r in rows], dtype=object)

    def of_chunks(self, chunk_ids: list[str]) -> np.ndarray:
        """The statements of these chunks (by chunk id), by row."""
        if not chunk_ids:
            return np.zeros(0, dtype=np.int64)
        found = self.table.search().where(_in("chunk_id", list(chunk_ids))).select(["row"]) \
            .limit(None).to_arrow()
        return np.unique(found.column("row").to_numpy().astype(np.int64))

    def describe(self, rows: np.ndarray, chunks=None) -> list[tuple[str, str, str, str, str]]:
        records = self._rows.get([int(r) for r in rows])
        return [(records[r]["statement_id"], records[r]["text"], records[r]["topic"], records[r]["chunk_id"],
                 records[r]["doc_id"]) for r in (int(x) for x in rows)]


def _probe(table, params) -> li.AnnProbe:
    """The table's share of partitions, PQ distances not refined: any refinement cost a channel 60–80 ms at 100k
    chunks (the graph route's p50 100 → 307 ms) whatever the rows re-scored; unrefined, the MuSiQue file's
    statement and entity channels lose 0.064 / 0.052 coverage against memory, its graph route 0.008."""
    return li.ann_probe(table, VECTOR_ANN, params.nprobes, params.probe_share, refine_factor=0)


def load_lance_graph(store: VectorStore, files, params) -> tuple[LexicalGraph | None, str]:
    """The lexical graph over its LanceDB tables, or (None, why not): never written (below the threshold, or an
    index from before the tables), or written from an older lexical graph than the one built last. params:
    lance_backend.LanceParams (nprobes, probe_share, refine_factor), applied to each table's own ANN index."""
    state = read_state(files)
    if not state:
        if read_json(files.graph_tables).get("format") not in (None, FORMAT):
            return None, ("the lexical graph's LanceDB tables are of an older format; the next corpus job "
                          "(`lexgraph ingest`) writes them again")
        return None, "the lexical graph's LanceDB tables are not written yet; the corpus job writes them"
    if not tables_current(files):
        return None, "the lexical graph's LanceDB tables are behind the lexical graph; the corpus job rewrites them"
    names = set(store.table_names())
    entities = LanceEntities(store, state, params) if {GRAPH_ENTITIES, GRAPH_NAMES} <= names else None
    statements = LanceStatements(store, state, params) \
        if {GRAPH_STATEMENTS, GRAPH_TOPICS, GRAPH_LINKS} <= names else None
    if entities is not None:
        entities.statements = statements
    return LexicalGraph(statements, entities, float(state.get("bridge_pair_share", 1.0))), ""
