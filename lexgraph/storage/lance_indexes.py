"""LanceDB's own search indexes, for querying a large corpus without loading it (DESIGN: the query side at
scale): an ANN vector index (IVF_PQ, cosine) and a native full-text index (BM25, no tantivy) on the chunk
table, a BTREE on chunk_id (hits and keyword links are fetched by id), an ANN index on the keyword vectors,
and the keyword→chunk links as a LanceDB table with a BTREE on keyword, so the keyword channel reads only
the links of the query's keywords.

Freshness: rows added after an index was built are still found (LanceDB searches them flat beside the
index) and deleted ones never are, so a stale index is slower, never wrong. `refresh` folds new rows into
the indexes (`optimize`) once they pass STALE_SHARE of the table, and retrains the ANN index from scratch
when the table has grown or shrunk by RETRAIN_FACTOR since it was trained (its partitions no longer fit).
No Dagster here (assets/search_indexes.py runs it)."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
from lancedb.index import FTS, BTree, IvfFlat, IvfPq

from lexgraph.storage.vector_store import CHUNKS, KEYWORDS, VectorStore

KEYWORD_LINKS = "keyword_links"
ANN_INDEX, FTS_INDEX, ID_INDEX, KEYWORD_ANN, LINK_INDEX = (
    "vector_idx", "text_idx", "chunk_id_idx", "keyword_vector_idx", "keyword_idx")
CHUNK_INDEXES = (ANN_INDEX, FTS_INDEX, ID_INDEX)
PQ_FROM_ROWS = 10_000  # below: IVF_FLAT (exact inside probed partitions; PQ needs 256+ rows to train)
PQ_SUB_VECTORS = 48  # 8 dimensions each at 384-d: 48 bytes a vector in the index
STALE_SHARE = 0.05  # unindexed rows past this share of the table: optimize
RETRAIN_FACTOR = 2.0  # table grown or shrunk this much since the ANN index was trained: retrain it
STATE_FILE = "search_indexes.json"
# one row per keyword (the query reads a few dozen keywords' links: rows, not thousands of pairs)
LINK_SCHEMA = pa.schema([("keyword", pa.string()), ("chunk_ids", pa.list_(pa.string())), ("chunk_count", pa.int64())])


@dataclass(frozen=True)
class IndexState:
    """One index as LanceDB reports it (None counts: the index does not exist)."""

    name: str
    kind: str | None
    indexed: int | None
    unindexed: int | None

    @property
    def present(self) -> bool:
        return self.kind is not None

    @property
    def stale(self) -> bool:
        return bool(self.unindexed)


def ann_partitions(rows: int) -> int:
    """≈ √rows IVF partitions (1,000 at 1M rows), at least 1."""
    return max(1, int(math.sqrt(max(rows, 1))))


def index_states(table, names: tuple[str, ...]) -> dict[str, IndexState]:
    found = {i.name: i for i in table.list_indices()} if table is not None else {}
    states = {}
    for name in names:
        if name not in found:
            states[name] = IndexState(name, None, None, None)
            continue
        stats = table.index_stats(name)
        states[name] = IndexState(name, stats.index_type, stats.num_indexed_rows, stats.num_unindexed_rows)
    return states


def chunk_index_states(store: VectorStore) -> dict[str, IndexState]:
    table = store.db.open_table(CHUNKS) if CHUNKS in store.table_names() else None
    return index_states(table, CHUNK_INDEXES)


def _ann_config(rows: int):
    if rows >= PQ_FROM_ROWS:
        return IvfPq(distance_type="cosine", num_partitions=ann_partitions(rows), num_sub_vectors=PQ_SUB_VECTORS,
                     max_iterations=20)
    return IvfFlat(distance_type="cosine", num_partitions=ann_partitions(rows) // 4 or 1)


def build_ann(table, rows: int, name: str = ANN_INDEX) -> None:
    table.create_index("vector", config=_ann_config(rows), replace=True, name=name)


def build_chunk_indexes(store: VectorStore) -> dict[str, float]:
    """Train every chunk-table index from scratch; seconds each."""
    table = store.db.open_table(CHUNKS)
    rows = table.count_rows()
    seconds = {}
    for name, build in ((ID_INDEX, lambda: table.create_index("chunk_id", config=BTree(), replace=True,
                                                                name=ID_INDEX)),
                        (FTS_INDEX, lambda: table.create_index("text", config=FTS(with_position=False),
                                                               replace=True, name=FTS_INDEX)),
                        (ANN_INDEX, lambda: build_ann(table, rows))):
        started = time.perf_counter()
        build()
        seconds[name] = round(time.perf_counter() - started, 2)
    return seconds


def write_keyword_links(store: VectorStore, links: pl.DataFrame) -> int:
    """The keyword→chunk links (keyword, chunk_id pairs) as one row per keyword (its chunk ids and their
    count), replacing the table; the keyword vectors get an ANN index once there are enough of them. Returns
    the number of links."""
    grouped = links.select("keyword", "chunk_id").unique().group_by("keyword").agg(
        pl.col("chunk_id").sort().alias("chunk_ids"), pl.len().cast(pl.Int64).alias("chunk_count")).sort("keyword")
    table = store.db.create_table(KEYWORD_LINKS, data=grouped.to_arrow().cast(LINK_SCHEMA), mode="overwrite")
    if grouped.height:
        table.create_index("keyword", config=BTree(), replace=True, name=LINK_INDEX)
    if KEYWORDS in store.table_names():
        keywords = store.db.open_table(KEYWORDS)
        count = keywords.count_rows()
        keywords.create_index("keyword", config=BTree(), replace=True, name=LINK_INDEX)
        if count >= PQ_FROM_ROWS:
            build_ann(keywords, count, KEYWORD_ANN)
    return int(grouped["chunk_count"].sum()) if grouped.height else 0


def state_path(corpus_dir: Path) -> Path:
    return Path(corpus_dir) / STATE_FILE


def read_state(corpus_dir: Path) -> dict:
    path = state_path(corpus_dir)
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError:
        return {}  # a torn file: the next refresh retrains and rewrites it


def _write_state(corpus_dir: Path, state: dict) -> None:
    path = state_path(corpus_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(state, indent=1), encoding="utf-8")
    partial.replace(path)


def refresh_decision(rows: int, trained_rows: int | None, states: dict[str, IndexState]) -> str:
    """`build` (an index is missing or the table outgrew its ANN training), `optimize` (unindexed rows past
    STALE_SHARE) or `current`."""
    if not trained_rows or any(not s.present for s in states.values()):
        return "build"
    if rows > trained_rows * RETRAIN_FACTOR or rows * RETRAIN_FACTOR < trained_rows:
        return "build"
    unindexed = max((s.unindexed or 0) for s in states.values())
    return "optimize" if unindexed > STALE_SHARE * max(rows, 1) else "current"


def refresh(store: VectorStore, corpus_dir: Path, links: pl.DataFrame | None = None) -> dict:
    """Bring the search indexes up to date with the chunk table (build, optimize or leave them), and rewrite
    the keyword links when given. Returns what was done, for the asset's metadata."""
    table = store.db.open_table(CHUNKS)
    rows = table.count_rows()
    state = read_state(corpus_dir)
    decision = refresh_decision(rows, state.get("trained_rows"), chunk_index_states(store))
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    if decision == "build":
        seconds = build_chunk_indexes(store)
        state = {"trained_rows": rows}
    elif decision == "optimize":
        table.optimize()
    link_rows = write_keyword_links(store, links) if links is not None else None
    after = chunk_index_states(store)
    state.update({"rows": rows, "decision": decision, "at": time.time(),
                  "indexes": {name: asdict(s) for name, s in after.items()}})
    _write_state(corpus_dir, state)
    return {"decision": decision, "rows": rows, "seconds": round(time.perf_counter() - started, 2),
            "build_seconds": seconds, "keyword_links": link_rows,
            "unindexed_rows": max((s.unindexed or 0) for s in after.values())}
