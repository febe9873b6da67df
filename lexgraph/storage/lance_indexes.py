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
from typing import Callable

import polars as pl
import pyarrow as pa
from lancedb.index import FTS, BTree, IvfFlat, IvfPq

from lexgraph.atomic_json import write_json
from lexgraph.storage.vector_store import CHUNKS, KEYWORDS, SEARCH_TEXT, VectorStore, _in_list
from lexgraph.terms import search_terms

KEYWORD_LINKS = "keyword_links"
ANN_INDEX, FTS_INDEX, ID_INDEX, KEYWORD_ANN, LINK_INDEX = (
    "vector_idx", "terms_idx", "chunk_id_idx", "keyword_vector_idx", "keyword_idx")
FORMER_FTS_INDEX = "text_idx"  # on the raw text, with LanceDB's tokenizer: dropped when terms_idx is built
# search_text holds lexgraph.terms' terms, space-separated: split on whitespace and nothing else, so the index
# counts exactly the terms the memory BM25 counts (no stemming, no other stopword list, no length cut)
TERMS_FTS = FTS(with_position=False, base_tokenizer="whitespace", lower_case=False, stem=False,
                remove_stop_words=False, ascii_folding=False, max_token_length=None)
# rows whose search_text one merge fills: 50,000 exhausted the merge's 300 MB join pool at 100k chunks; 5,000
# filled 100k rows in 9.3 s
TERMS_BATCH = 5_000
# PQ candidates one vector search re-scores on their stored vectors, at most: refine 10 on a hub's 1,000 nearest
# statements read 10,000 vectors a question (graph route p50 100 → 390 ms at 100k chunks)
REFINE_ROWS = 1_000
CHUNK_INDEXES = (ANN_INDEX, FTS_INDEX, ID_INDEX)
PQ_FROM_ROWS = 10_000  # below: IVF_FLAT (exact inside probed partitions; PQ needs 256+ rows to train)
PQ_SUB_VECTORS = 48  # 8 dimensions each at 384-d: 48 bytes a vector in the index
STALE_SHARE = 0.05  # unindexed rows past this share of the table: optimize
RETRAIN_FACTOR = 2.0  # table grown or shrunk this much since the ANN index was trained: retrain it
STATE_FILE = "search_indexes.json"
# one row per document (doc_id, content hash, keywords): what the keyword_links table holds
LINK_DOCS_FILE = "search_link_docs.parquet"
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


@dataclass(frozen=True)
class AnnProbe:
    """How one table's vector search is run: partitions probed, and the PQ candidates re-scored on the stored
    vectors (None: no PQ index, the distances are exact)."""

    nprobes: int
    refine_factor: int | None

    def apply(self, query, k: int):
        """`query` (a vector search for k rows) probed and refined; at most REFINE_ROWS candidates re-scored, so
        a wide search (a hub's 1,000 nearest statements) re-scores only what it returns."""
        query = query.nprobes(self.nprobes)
        if not self.refine_factor:
            return query
        return query.refine_factor(max(1, min(self.refine_factor, REFINE_ROWS // max(k, 1))))


def ann_probe(table, index_name: str, floor: int, share: float, refine_factor: int) -> AnnProbe:
    """At least `floor` partitions and `share` of the table's own; refined when its index is IVF_PQ."""
    state = index_states(table, (index_name,))[index_name]
    if not state.present or not state.indexed:
        return AnnProbe(floor, None)
    return AnnProbe(max(floor, math.ceil(share * ann_partitions(state.indexed))),
                    refine_factor if state.kind == "IVF_PQ" else None)


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


def rows_without_terms(table) -> int:
    """Chunk rows whose search_text is missing: written before the column existed."""
    return table.count_rows() if SEARCH_TEXT not in table.schema.names else table.count_rows(f"{SEARCH_TEXT} IS NULL")


def fill_search_terms(table) -> int:
    """Give every chunk row written before search_text existed its terms (merged by chunk_id, in batches);
    returns the rows filled. The merge rewrites those rows, so the indexes are built after it."""
    if SEARCH_TEXT not in table.schema.names:
        table.add_columns(pa.field(SEARCH_TEXT, pa.string()))
    filled, missing = 0, rows_without_terms(table)
    while missing:
        batch = table.search().where(f"{SEARCH_TEXT} IS NULL").select(["chunk_id", "text"]).limit(TERMS_BATCH) \
            .to_arrow()
        terms = pa.array([search_terms(t or "") for t in batch.column("text").to_pylist()], pa.string())
        table.merge_insert("chunk_id").when_matched_update_all().execute(
            pa.table({"chunk_id": batch.column("chunk_id"), SEARCH_TEXT: terms}))
        filled, before, missing = filled + batch.num_rows, missing, rows_without_terms(table)
        if missing >= before:  # rows the merge cannot reach (no chunk_id): say so rather than loop
            raise RuntimeError(f"{table.name}: {missing} chunk rows without search_text could not be filled "
                               "(rows without a chunk_id?); rebuild the index from the documents")
    return filled


def build_chunk_indexes(store: VectorStore) -> dict[str, float]:
    """Train every chunk-table index from scratch (after filling any missing search terms); seconds each."""
    table = store.db.open_table(CHUNKS)
    started = time.perf_counter()
    filled = fill_search_terms(table)
    seconds = {"search_terms": round(time.perf_counter() - started, 2)} if filled else {}
    rows = table.count_rows()
    for name, build in ((ID_INDEX, lambda: table.create_index("chunk_id", config=BTree(), replace=True,
                                                                name=ID_INDEX)),
                        (FTS_INDEX, lambda: table.create_index(SEARCH_TEXT, config=TERMS_FTS, replace=True,
                                                               name=FTS_INDEX)),
                        (ANN_INDEX, lambda: build_ann(table, rows))):
        started = time.perf_counter()
        build()
        seconds[name] = round(time.perf_counter() - started, 2)
    if FORMER_FTS_INDEX in {i.name for i in table.list_indices()}:
        table.drop_index(FORMER_FTS_INDEX)
    return seconds


@dataclass(frozen=True)
class DocumentLinks:
    """The catalog (doc_id -> content hash) and how to read some documents' keyword links (keyword,
    chunk_id), so the links table is brought up to date by document, not rewritten."""

    catalog: dict[str, str]
    read: Callable[[list[str]], pl.DataFrame]


def _grouped(links: pl.DataFrame) -> pl.DataFrame:
    return _by_keyword(links.select("keyword", "chunk_id").unique())


def _by_keyword(links: pl.DataFrame) -> pl.DataFrame:
    """Unique (keyword, chunk_id) pairs as table rows."""
    return links.group_by("keyword").agg(
        pl.col("chunk_id").sort().alias("chunk_ids"), pl.len().cast(pl.Int64).alias("chunk_count")).sort("keyword")


def write_keyword_links(store: VectorStore, links: pl.DataFrame) -> int:
    """The keyword→chunk links (keyword, chunk_id pairs) as one row per keyword (its chunk ids and their
    count), replacing the table. Returns the number of links."""
    grouped = _grouped(links)
    table = store.db.create_table(KEYWORD_LINKS, data=grouped.to_arrow().cast(LINK_SCHEMA), mode="overwrite")
    if grouped.height:
        table.create_index("keyword", config=BTree(), replace=True, name=LINK_INDEX)
    return int(grouped["chunk_count"].sum()) if grouped.height else 0


def _document_of(chunk_ids: pl.Expr) -> pl.Expr:
    """A chunk id is "<doc_id>-c<order>-<hex hash>" (lexgraph.ids.chunk_id): the document is before the last "-c"."""
    return chunk_ids.str.replace(r"-c\d+-[0-9a-f]+$", "")


def _without_documents(links: pl.DataFrame, doc_ids: list[str]) -> pl.DataFrame:
    """The links whose chunk is of none of `doc_ids`. A chunk id ends in "-c<order, 5 digits or more>-<8 hex>"
    (lexgraph.ids.chunk_id): with a 5-digit order its document is all but its last 16 characters, a slice far
    cheaper than _document_of's regex over the million ids of common keywords; the regex reads only the others."""
    chunk = pl.col("chunk_id")
    five = links["chunk_id"].str.slice(-16, 2) == "-c"
    return pl.concat([links.filter(five).filter(~chunk.str.head(-16).is_in(doc_ids)),
                      links.filter(~five).filter(~_document_of(chunk).is_in(doc_ids))])


def update_keyword_links(store: VectorStore, corpus_dir: Path, links: DocumentLinks) -> dict:
    """Bring the links table to the catalog touching only the keywords of documents added, changed or removed
    since it was written (recorded in LINK_DOCS_FILE); no table or no record: rewritten whole. Idempotent, so a
    kill between the table write and the record's leaves a state the next run repairs."""
    record_path = Path(corpus_dir) / LINK_DOCS_FILE
    record, why = _read_record(record_path)
    if record is None or KEYWORD_LINKS not in store.table_names():
        fresh = links.read(sorted(links.catalog))
        written = write_keyword_links(store, fresh)
        _write_record(record_path, _record_rows(fresh, links.catalog))
        return {"keyword_links_mode": "rewritten", "documents_read": len(links.catalog), "keyword_links": written,
                "keyword_links_reason": why if record is None else "no keyword_links table"}
    held = dict(zip(record["doc_id"].to_list(), record["hash"].to_list()))
    changed = sorted(d for d, h in links.catalog.items() if held.get(d) != h)
    replaced = sorted(d for d in held if links.catalog.get(d) != held[d])
    if not changed and not replaced:
        return {"keyword_links_mode": "unchanged", "documents_read": 0, "keywords_written": 0}
    fresh = links.read(changed).select("keyword", "chunk_id").unique()
    touched = sorted(set(record.filter(pl.col("doc_id").is_in(replaced))["keywords"].explode().drop_nulls().to_list())
                     | set(fresh["keyword"].to_list()))
    table = store.db.open_table(KEYWORD_LINKS)
    kept = pl.DataFrame(schema={"keyword": pl.String, "chunk_id": pl.String})
    if touched:
        old = pl.from_arrow(table.search().where(_in_list("keyword", touched)).select(["keyword", "chunk_ids"])
                            .limit(len(touched)).to_arrow())
        if old.height:
            # the changed documents' links go too (a run killed before its record write left them in the table),
            # so what is kept and `fresh` are disjoint, and unique as the table's lists are: no unique() pass
            # over the million links of the most common keywords
            kept = _without_documents(old.explode("chunk_ids").rename({"chunk_ids": "chunk_id"})
                                      .drop_nulls("chunk_id"), sorted(set(replaced) | set(changed)))
    rows = _by_keyword(pl.concat([kept, fresh]))
    if touched:
        table.delete(_in_list("keyword", touched))
    if rows.height:
        table.add(rows.to_arrow().cast(LINK_SCHEMA))
    _write_record(record_path, pl.concat([record.filter(~pl.col("doc_id").is_in(replaced)),  # replaced: removed too
                                          _record_rows(fresh, {d: links.catalog[d] for d in changed})]))
    return {"keyword_links_mode": "diff", "documents_read": len(changed), "documents_removed": len(replaced),
            "keywords_written": rows.height, "keywords_deleted": len(touched) - rows.height}


def _read_record(path: Path) -> tuple[pl.DataFrame | None, str]:
    """The record, or None and why not: missing, or unreadable (torn, of another layout), when the table is
    written whole again rather than failing every update."""
    if not path.exists():
        return None, "no record of the documents the table holds"
    try:
        record = pl.read_parquet(path)
        if "keyword" in record.columns:  # written before one row per document: one row per (document, keyword)
            record = record.group_by("doc_id").agg(pl.col("hash").first(),
                                                    pl.col("keyword").drop_nulls().sort().alias("keywords"))
        return record.select(pl.col("doc_id", "hash").cast(pl.String),
                             pl.col("keywords").cast(pl.List(pl.String))), ""
    except (Exception, pl.exceptions.PanicException) as error:  # noqa: BLE001 - any damage: rewrite
        return None, f"{path.name} unreadable ({type(error).__name__}: {str(error).splitlines()[0][:160]})"


def _record_rows(links: pl.DataFrame, hashes: dict[str, str]) -> pl.DataFrame:
    """(doc_id, hash, keywords) of these documents; one without keywords has an empty list, so it is still
    recorded and not read again next time."""
    pairs = links.select(_document_of(pl.col("chunk_id")).alias("doc_id"), "keyword").unique()
    keywords = pairs.group_by("doc_id").agg(pl.col("keyword").sort().alias("keywords"))
    docs = pl.DataFrame({"doc_id": list(hashes), "hash": list(hashes.values())},
                        schema={"doc_id": pl.String, "hash": pl.String})
    return (docs.join(keywords, on="doc_id", how="left")
            .with_columns(pl.col("keywords").fill_null(pl.lit([], pl.List(pl.String)))))


def _write_record(path: Path, rows: pl.DataFrame) -> None:
    """Replaced atomically; one row per document (not per keyword) keeps its rewrite on every add small."""
    partial = path.with_suffix(".tmp")
    rows.sort("doc_id").write_parquet(partial, compression="lz4")
    partial.replace(path)


def refresh_keyword_indexes(store: VectorStore, state: dict) -> dict:
    """The keyword vectors' ANN index is trained when missing or when the keyword count has doubled or halved
    since (new keywords are searched flat meanwhile); the links' BTREE is folded in like the chunk indexes."""
    if KEYWORDS not in store.table_names():
        return {}
    keywords = store.db.open_table(KEYWORDS)
    count, trained = keywords.count_rows(), state.get("keyword_trained_rows")
    done = {}
    if count >= PQ_FROM_ROWS:
        has_ann = KEYWORD_ANN in {i.name for i in keywords.list_indices()}
        if not has_ann or not trained or count > trained * RETRAIN_FACTOR or count * RETRAIN_FACTOR < trained:
            build_ann(keywords, count, KEYWORD_ANN)
            state["keyword_trained_rows"] = count
            done["keyword_ann"] = "trained"
    if KEYWORD_LINKS in store.table_names():
        links = store.db.open_table(KEYWORD_LINKS)
        link_state = index_states(links, (LINK_INDEX,))[LINK_INDEX]
        rows = links.count_rows()
        if rows and not link_state.present:
            links.create_index("keyword", config=BTree(), replace=True, name=LINK_INDEX)
            done["keyword_btree"] = "built"
        elif (link_state.unindexed or 0) > STALE_SHARE * max(rows, 1):
            links.optimize()
            done["keyword_btree"] = "optimized"
    return done


def state_path(corpus_dir: Path) -> Path:
    return Path(corpus_dir) / STATE_FILE


def read_state(corpus_dir: Path) -> dict:
    path = state_path(corpus_dir)
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError:
        return {}  # a torn file: the next refresh retrains and rewrites it


def _write_state(corpus_dir: Path, state: dict) -> None:
    write_json(state_path(corpus_dir), state, indent=1)


def refresh_decision(rows: int, trained_rows: int | None, states: dict[str, IndexState]) -> str:
    """`build` (an index is missing or the table outgrew its ANN training), `optimize` (unindexed rows past
    STALE_SHARE) or `current`."""
    if not trained_rows or any(not s.present for s in states.values()):
        return "build"
    if rows > trained_rows * RETRAIN_FACTOR or rows * RETRAIN_FACTOR < trained_rows:
        return "build"
    unindexed = max((s.unindexed or 0) for s in states.values())
    return "optimize" if unindexed > STALE_SHARE * max(rows, 1) else "current"


def refresh(store: VectorStore, corpus_dir: Path, links: "pl.DataFrame | DocumentLinks | None" = None) -> dict:
    """Bring the search indexes up to date with the chunk table (build, optimize or leave them) and the keyword
    links with the catalog: rewritten from a frame, or updated by document from DocumentLinks. Returns what was
    done, for the asset's metadata."""
    table = store.db.open_table(CHUNKS)
    rows = table.count_rows()
    state = read_state(corpus_dir)
    decision = refresh_decision(rows, state.get("trained_rows"), chunk_index_states(store))
    if decision != "build" and rows_without_terms(table):
        decision = "build"  # rows from before search_text: their terms, then the indexes over them
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    if decision == "build":
        seconds = build_chunk_indexes(store)
        state = {"trained_rows": rows}
    elif decision == "optimize":
        table.optimize()
    if isinstance(links, DocumentLinks):
        link_report = update_keyword_links(store, corpus_dir, links)
    elif links is not None:
        link_report = {"keyword_links_mode": "rewritten", "keyword_links": write_keyword_links(store, links)}
    else:
        link_report = {}
    link_report.update(refresh_keyword_indexes(store, state))
    after = chunk_index_states(store)
    state.update({"rows": rows, "decision": decision, "at": time.time(),
                  "indexes": {name: asdict(s) for name, s in after.items()}})
    _write_state(corpus_dir, state)
    return {"decision": decision, "rows": rows, "seconds": round(time.perf_counter() - started, 2),
            "build_seconds": seconds, "keyword_links": link_report,
            "unindexed_rows": max((s.unindexed or 0) for s in after.values())}
