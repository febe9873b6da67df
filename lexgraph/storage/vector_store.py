"""LanceDB access: the chunk vector table and the catalog of indexed sources."""
from __future__ import annotations

import os
from pathlib import Path

# Lance logs a warning each time a table is first created; that is expected here, not news.
os.environ.setdefault("LANCEDB_LOG", "error")  # the Rust logger of the lancedb package reads LANCEDB_LOG

import lancedb  # noqa: E402
import numpy as np
import polars as pl
import pyarrow as pa

from lexgraph.terms import search_terms

CHUNKS = "chunks"
SOURCES = "sources"
KEYWORDS = "keywords"
# The lexical graph's vectors: statement text, and an entity's "name: description".
STATEMENTS = "statements"
ENTITIES = "entities"


SEARCH_TEXT = "search_text"


def chunk_schema(dimension: int) -> pa.Schema:
    return pa.schema(
        [
            ("chunk_id", pa.string()),
            ("doc_id", pa.string()),
            ("order", pa.int32()),
            ("text", pa.string()),
            ("char_start", pa.int64()),
            ("char_end", pa.int64()),
            ("heading_path", pa.string()),
            ("token_count", pa.int32()),
            ("source_path", pa.string()),
            ("content_hash", pa.string()),
            ("page_start", pa.int32()),  # pages where the format has them (PDF pages, PPTX slides)
            ("page_end", pa.int32()),
            ("model", pa.string()),
            ("vector", pa.list_(pa.float32(), dimension)),
            # the text's search terms (lexgraph.terms), which LanceDB's full-text index counts; last, where
            # add_columns puts it in a table written before it existed
            (SEARCH_TEXT, pa.string()),
        ]
    )


# PageRank and skeleton membership live in a table of their own, replaced by every corpus update: written into
# the chunk rows, they rewrote every row each update, which took every row out of LanceDB's ANN and full-text
# indexes (a re-index of the whole table per update: 4.7 s of a 100k-chunk add).
CHUNK_SCORES = "chunk_scores"
CHUNK_SCORE_SCHEMA = pa.schema([("chunk_id", pa.string()), ("pagerank", pa.float64()), ("in_skeleton", pa.bool_())])
# the columns chunk rows had before: dropped from an existing table (a metadata change; its indexes stay valid)
_FORMER_SCORE_COLUMNS = ("pagerank", "in_skeleton")


SOURCE_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("uri", pa.string()),
        ("relative_path", pa.string()),
        ("title", pa.string()),
        ("format", pa.string()),
        ("content_hash", pa.string()),
        ("size_bytes", pa.int64()),
        ("chunk_count", pa.int32()),
        ("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _in_list(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(_quote(v) for v in values)})"


def table_write_stamps(uri: str | Path, names: tuple[str, ...]) -> tuple[int, ...] | None:
    """When each table was last written, without opening the database: a new LanceDB version adds a manifest to
    the table's _versions folder. None when a table has no such folder yet."""
    versions = [Path(uri) / f"{name}.lance" / "_versions" for name in names]
    if not all(v.is_dir() for v in versions):
        return None
    return tuple(v.stat().st_mtime_ns for v in versions)


class VectorStore:
    """Replace-by-document writes keep re-runs free of duplicates."""

    def __init__(self, uri: str | Path):
        self.uri = str(uri)
        Path(self.uri).mkdir(parents=True, exist_ok=True)
        self.db = lancedb.connect(self.uri)

    def _table(self, name: str, schema: pa.Schema | None = None):
        if name in self.table_names():
            return self.db.open_table(name)
        if schema is None:
            return None
        return self.db.create_table(name, schema=schema, exist_ok=True)

    def table_names(self) -> list[str]:
        result = self.db.list_tables()
        return list(getattr(result, "tables", result))

    def table_uri(self, name: str) -> str:
        return str(Path(self.uri) / f"{name}.lance")

    def replace_chunks(self, doc_ids: list[str], chunks: pl.DataFrame, vectors: np.ndarray) -> None:
        """Swap the chunks of these documents for new ones (delete, then add)."""
        schema = chunk_schema(vectors.shape[1] if vectors.ndim == 2 and vectors.shape[1] else 384)
        table = self._table(CHUNKS, schema)
        former = [c for c in _FORMER_SCORE_COLUMNS if c in table.schema.names]
        if former:
            table.drop_columns(former)
        if SEARCH_TEXT not in table.schema.names:  # written before search_text: the older rows' terms are
            table.add_columns(pa.field(SEARCH_TEXT, pa.string()))  # filled by the search_indexes step
        if doc_ids:
            table.delete(_in_list("doc_id", doc_ids))
        if chunks.height:
            data = chunks.select([f.name for f in schema if f.name not in ("vector", SEARCH_TEXT)]).to_arrow()
            data = data.append_column("vector", pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.astype(np.float32).ravel()), vectors.shape[1]))
            data = data.append_column(SEARCH_TEXT, pa.array([search_terms(t) for t in chunks["text"].to_list()],
                                                            pa.string()))
            table.add(data.cast(schema))

    def set_chunk_scores(self, scores: pl.DataFrame) -> None:
        """Every chunk's PageRank and skeleton membership (chunk_id, pagerank, selected), replacing the table."""
        if scores.height == 0:
            scores = pl.DataFrame(schema={"chunk_id": pl.Utf8, "pagerank": pl.Float64, "selected": pl.Boolean})
        data = scores.select("chunk_id", "pagerank", pl.col("selected").alias("in_skeleton")).to_arrow()
        self.db.create_table(CHUNK_SCORES, data=data.cast(CHUNK_SCORE_SCHEMA), schema=CHUNK_SCORE_SCHEMA,
                             mode="overwrite")

    def replace_keywords(self, keywords: pl.DataFrame) -> None:
        """KET-RAG keyword vectors (keyword, vector, sentence_count), replacing the table."""
        dimension = keywords["vector"].dtype.shape[0] if keywords.height else 384
        schema = pa.schema([("keyword", pa.string()), ("sentence_count", pa.int64()),
                            ("vector", pa.list_(pa.float32(), dimension))])
        data = keywords.select("keyword", "sentence_count", "vector").to_arrow().cast(schema)
        self.db.create_table(KEYWORDS, data=data, schema=schema, mode="overwrite")

    def upsert_keywords(self, keywords: pl.DataFrame, removed: list[str]) -> None:
        """Insert or update these keyword vectors (keyword, vector, sentence_count) and delete the removed
        keywords; the table must exist (replace_keywords creates it)."""
        self.upsert_rows(KEYWORDS, "keyword", keywords.select("keyword", "sentence_count", "vector"), removed)

    def upsert_rows(self, name: str, key: str, rows: pl.DataFrame, removed: list[str] = ()) -> None:
        """Insert or update these rows of an existing table (matched on `key`), then delete the removed keys."""
        if rows.height:
            table = self._table(name)
            data = rows.to_arrow().cast(table.schema)
            table.merge_insert(key).when_matched_update_all().when_not_matched_insert_all().execute(data)
        self.delete_rows(name, key, list(removed))

    def keyword_dimension(self) -> int | None:
        """Width of the stored keyword vectors (None before the table exists)."""
        table = self._table(KEYWORDS)
        return None if table is None else table.schema.field("vector").type.list_size

    def known_vectors(self, name: str, key: str, text: str) -> pl.DataFrame:
        """key, text and vector of every row of a table (none when the table does not exist yet), so a
        rebuild embeds only new or changed texts."""
        table = self._table(name)
        if table is None or not {key, text, "vector"} <= set(table.schema.names):
            return pl.DataFrame()
        return pl.from_arrow(table.to_arrow().select([key, text, "vector"]))

    def scan(self, name: str, columns: list[str], where: str | None = None) -> pl.DataFrame:
        """Some columns of a table's rows (those matching `where`), without reading the others; an empty
        frame when the table does not exist."""
        table = self._table(name)
        if table is None:
            return pl.DataFrame()
        query = table.search()
        if where:
            query = query.where(where)
        return pl.from_arrow(query.select([c for c in columns if c in table.schema.names]).limit(None).to_arrow())

    def delete_rows(self, name: str, column: str, values: list[str], batch: int = 500) -> None:
        table = self._table(name)
        if table is None:
            return
        for start in range(0, len(values), batch):
            table.delete(_in_list(column, values[start:start + batch]))

    def add_rows(self, name: str, frame: pl.DataFrame) -> None:
        """Append rows, creating the table (schema from the frame) when it does not exist yet."""
        if name in self.table_names():
            self.db.open_table(name).add(frame.to_arrow())
        else:
            self.db.create_table(name, data=frame.to_arrow())

    def replace_table(self, name: str, frame: pl.DataFrame) -> None:
        """Overwrite a whole table with frame (its `vector` column a fixed-size float32 array)."""
        self.db.create_table(name, data=frame.to_arrow(), mode="overwrite")

    def upsert_sources(self, sources: pl.DataFrame) -> None:
        table = self._table(SOURCES, SOURCE_SCHEMA)
        data = sources.select([f.name for f in SOURCE_SCHEMA]).to_arrow().cast(SOURCE_SCHEMA)
        table.merge_insert("doc_id").when_matched_update_all().when_not_matched_insert_all().execute(data)

    def forget_sources(self, doc_ids: list[str]) -> None:
        """Take documents out of the catalog only, so the next reconcile indexes them again."""
        table = self._table(SOURCES)
        if table is not None and doc_ids:
            table.delete(_in_list("doc_id", doc_ids))

    def delete_documents(self, doc_ids: list[str]) -> None:
        if not doc_ids:
            return
        for name in (CHUNKS, SOURCES, STATEMENTS):
            table = self._table(name)
            if table is not None:
                table.delete(_in_list("doc_id", doc_ids))

    def sources(self) -> pl.DataFrame:
        table = self._table(SOURCES)
        if table is None:
            return pl.DataFrame(schema=pl.from_arrow(SOURCE_SCHEMA.empty_table()).schema)
        return pl.from_arrow(table.to_arrow())

    def vector_dimension(self) -> int | None:
        """Width of the stored chunk vectors (None before any chunk is stored)."""
        table = self._table(CHUNKS)
        return None if table is None else table.schema.field("vector").type.list_size

    def indexed_hashes(self) -> dict[str, str]:
        """doc_id -> content hash of every document whose load finished: what reconcile compares against."""
        catalog = self.sources()
        return dict(zip(catalog["doc_id"].to_list(), catalog["content_hash"].to_list()))

    def count(self, name: str, where: str | None = None) -> int:
        table = self._table(name)
        return 0 if table is None else table.count_rows(where)

    def search_chunks(self, vector: np.ndarray, k: int = 5) -> pl.DataFrame:
        table = self._table(CHUNKS)
        if table is None:
            return pl.DataFrame()
        hits = table.search(vector.astype(np.float32)).metric("cosine").limit(k).to_arrow()
        return pl.from_arrow(hits).drop("vector")

    def chunk_vectors(self, columns: tuple[str, ...] = ("chunk_id", "doc_id"),
                      doc_ids: list[str] | None = None) -> tuple[pl.DataFrame, np.ndarray]:
        """All chunk ids with their vectors (or those of these documents), for corpus-wide graph building.

        Only these columns are read: the whole table (text included) took 6x as long at 100k chunks."""
        table = self._table(CHUNKS)
        if table is None:
            return pl.DataFrame(), np.zeros((0, 0), dtype=np.float32)
        columns = tuple(c for c in columns if c in table.schema.names)  # optional ones may be absent
        query = table.search()
        if doc_ids is not None:
            query = query.where(_in_list("doc_id", doc_ids) if doc_ids else "false")
        data = query.select([*columns, "vector"]).limit(None).to_arrow()
        column = data.column("vector")
        width = column.type.list_size
        if column.num_chunks == 1 and column.null_count == 0:  # a view of Arrow's buffer: no 150 MB copy at 100k
            flat = column.chunk(0)
            vectors = flat.values.slice(flat.offset * width, len(flat) * width).to_numpy(zero_copy_only=False)
        else:
            vectors = column.combine_chunks().values.to_numpy(zero_copy_only=False)
        vectors = vectors.reshape(data.num_rows, width)
        return pl.from_arrow(data.select(list(columns))), vectors.astype(np.float32, copy=False)
