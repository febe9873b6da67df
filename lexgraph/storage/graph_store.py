"""Embedded Kùzu graph: schema, one-writer-at-a-time locking, replace-by-document loads."""
from __future__ import annotations

import fcntl
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import polars as pl

SCHEMA = [
    """CREATE NODE TABLE IF NOT EXISTS Source(id STRING, uri STRING, relative_path STRING, title STRING,
        format STRING, pages INT32, content_hash STRING, version STRING, size_bytes INT64, ingested_at TIMESTAMP,
        PRIMARY KEY(id))""",
    """CREATE NODE TABLE IF NOT EXISTS Chunk(id STRING, doc_id STRING, ord INT32, text STRING,
        char_start INT64, char_end INT64, page_start INT32, page_end INT32, heading_path STRING, token_count INT32,
        pagerank DOUBLE DEFAULT 0.0, in_skeleton BOOLEAN DEFAULT false, PRIMARY KEY(id))""",
    "CREATE NODE TABLE IF NOT EXISTS Keyword(id STRING, PRIMARY KEY(id))",
    "CREATE REL TABLE IF NOT EXISTS PART_OF(FROM Chunk TO Source)",
    "CREATE REL TABLE IF NOT EXISTS NEXT(FROM Chunk TO Chunk)",
    # kind: the KNN list an edge comes from, as its position in SIMILAR_KINDS (0 semantic, 1 lexical)
    "CREATE REL TABLE IF NOT EXISTS SIMILAR(FROM Chunk TO Chunk, kind UINT8, weight DOUBLE)",
    "CREATE REL TABLE IF NOT EXISTS KEYWORD_IN(FROM Keyword TO Chunk, occurrences INT64)",
    # The lexical graph (Source → Chunk → Statement → Topic / Fact / Entity); every extracted node records
    # its provenance: extractor, model, prompt version and extraction time.
    """CREATE NODE TABLE IF NOT EXISTS Statement(id STRING, doc_id STRING, chunk_id STRING, topic_id STRING,
        text STRING, extractor STRING, model STRING, prompt_version STRING, extracted_at TIMESTAMP, PRIMARY KEY(id))""",
    "CREATE NODE TABLE IF NOT EXISTS Topic(id STRING, doc_id STRING, name STRING, PRIMARY KEY(id))",
    # Facts and entities are global (one node for the same fact or resolved entity from any source); their
    # provenance lists every extractor, model and prompt version behind them (comma-joined), and the latest time.
    """CREATE NODE TABLE IF NOT EXISTS Fact(id STRING, subject STRING, predicate STRING, object STRING,
        statements INT64, documents INT64, extractor STRING, model STRING, prompt_version STRING,
        extracted_at TIMESTAMP, PRIMARY KEY(id))""",
    """CREATE NODE TABLE IF NOT EXISTS Entity(id STRING, name STRING, type STRING, description STRING,
        aliases STRING[], mentions INT64, documents INT64, extractor STRING, model STRING, prompt_version STRING,
        extracted_at TIMESTAMP, PRIMARY KEY(id))""",
    "CREATE REL TABLE IF NOT EXISTS EXTRACTED_FROM(FROM Statement TO Chunk)",
    "CREATE REL TABLE IF NOT EXISTS BELONGS_TO(FROM Statement TO Topic)",
    "CREATE REL TABLE IF NOT EXISTS TOPIC_OF(FROM Topic TO Source)",
    "CREATE REL TABLE IF NOT EXISTS SUPPORTS(FROM Fact TO Statement)",
    "CREATE REL TABLE IF NOT EXISTS SUBJECT(FROM Entity TO Fact)",
    "CREATE REL TABLE IF NOT EXISTS OBJECT(FROM Entity TO Fact)",
    "CREATE REL TABLE IF NOT EXISTS RELATED(FROM Entity TO Entity, predicate STRING, description STRING, weight DOUBLE)",
    "CREATE REL TABLE IF NOT EXISTS MENTIONED_IN(FROM Entity TO Chunk, description STRING)",
]
# SIMILAR's kind codes: 0 = semantic (neighbours by chunk embedding), 1 = lexical (by shared distinct content
# words). A code, not the name: a small add's checkpoint rewrites the rel table's columns in every node group it
# touches, and a STRING kind made that a third dearer (docs/perf/kuzu_writes.md). Graphs written with
# `kind STRING` (before SIMILAR_SCHEMA 2) are migrated by the first writer that opens them.
SIMILAR_KINDS = ("semantic", "lexical")
SIMILAR_SCHEMA = 2
# Node tables of the lexical graph, rebuilt together from the extract Parquet files, and its edges.
LEXICAL_NODES = ("Statement", "Topic", "Fact", "Entity")
LEXICAL_RELS = {"EXTRACTED_FROM": ("Statement", "Chunk"), "BELONGS_TO": ("Statement", "Topic"),
                "TOPIC_OF": ("Topic", "Source"), "SUPPORTS": ("Fact", "Statement"), "SUBJECT": ("Entity", "Fact"),
                "OBJECT": ("Entity", "Fact"), "RELATED": ("Entity", "Entity"), "MENTIONED_IN": ("Entity", "Chunk")}
# Edge deletes naming at most this many source nodes match from those nodes' offsets: 350 SIMILAR edges of 2.65M
# in 0.15 s instead of 0.49 s; but 3,000 edges (2,946 sources) took 0.70 s so, 0.43 s by the join over every edge.
MASKED_DELETE_SOURCES = 1_000
# Rel tables whose whole-table count is planned from the target side, (b)<-[r]-(a): for KEYWORD_IN's 4.77M links
# at 100k chunks Kùzu then scans the chunks and joins the keywords, 0.7-0.8 s against 1.5-1.7 s from the keyword
# side (SIMILAR: 0.51 against 0.48 s, left as it is).
COUNT_FROM_TARGET = {"KEYWORD_IN"}
# How long a writer waits for another process to finish before giving up with a clear error.
WRITER_WAIT_SECONDS = 600.0


def _kind_code() -> pl.Expr:
    """SIMILAR's kind name as its code; a name not in SIMILAR_KINDS is an error, not a null."""
    return pl.col("kind").replace_strict({name: code for code, name in enumerate(SIMILAR_KINDS)},
                                         return_dtype=pl.UInt8)


LADYBUG_SUFFIX = ".lbug"


def graph_engine(path: str | Path):
    """The embedded graph database a graph file belongs to: Kùzu, or its maintained fork LadybugDB (the `ladybug`
    package, same Cypher and Python API) for a `.lbug` graph (LEXGRAPH_GRAPH_BACKEND=ladybug). Imported on first
    use: the two register the same native types, so one process can load only one of them."""
    if not str(path).endswith(LADYBUG_SUFFIX):
        if "ladybug" in sys.modules:
            raise RuntimeError(f"{path}: a process that has opened a LadybugDB graph cannot open a Kùzu one (both "
                               "register the same native types); use one LEXGRAPH_GRAPH_BACKEND per process")
        import kuzu

        return kuzu
    if "kuzu" in sys.modules:
        raise RuntimeError(f"{path}: a process that has opened a Kùzu graph cannot open a LadybugDB one (both "
                           "register the same native types); use one LEXGRAPH_GRAPH_BACKEND per process")
    try:
        import ladybug
    except ImportError as error:
        raise RuntimeError(f"{path}: LEXGRAPH_GRAPH_BACKEND=ladybug needs the `ladybug` package "
                           "(pip install 'lexgraph[ladybug]')") from error
    return ladybug


class GraphBusyError(RuntimeError):
    """Another process holds the graph's single writer slot."""


@contextmanager
def writer_lock(graph_path: str | Path, timeout: float = WRITER_WAIT_SECONDS) -> Iterator[None]:
    """Kùzu admits one writing process: serialise writers across processes with a file lock."""
    lock_path = Path(str(graph_path) + ".writer.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GraphBusyError(f"graph {graph_path} is locked by another writer for over {timeout:.0f}s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _session_key(path: str | Path) -> str:
    return str(Path(path).resolve())


class _WriterSession:
    """One graph's writer under the writer lock, opened by the first block that asks and shared by the blocks
    of a GraphStore.session (or of one GraphStore.writer block)."""

    def __init__(self, path: str | Path):
        self.path = path
        self.store: GraphStore | None = None
        self.lock = ExitStack()

    def writer(self) -> Iterator["GraphStore"]:
        if self.store is None:
            self.lock.enter_context(writer_lock(self.path))
            try:
                self.store = GraphStore(self.path, writable=True)
            except BaseException:
                self.lock.close()
                raise
        try:
            yield self.store
        except BaseException:
            # as a writer of its own would: closed after a failure, so the next block starts on a fresh open
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            self.store = None
            self.lock.close()


# Writers held open by GraphStore.session, by resolved graph path.
_sessions: dict[str, _WriterSession] = {}


class GraphStore:
    """Open with writable=True only inside writer_lock (GraphStore.writer does both)."""

    def __init__(self, path: str | Path, writable: bool = False):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if not writable and not Path(self.path).exists():
            self.db = None
            self.conn = None
            return
        engine = graph_engine(self.path)
        self.db = engine.Database(self.path, read_only=not writable)
        self.conn = engine.Connection(self.db)
        if writable:
            for statement in SCHEMA:
                self.conn.execute(statement)
            self._migrate_similar()

    def _migrate_similar(self) -> None:
        """SIMILAR written with `kind STRING` is recreated empty in the current schema. Its edges come back
        whole with the next corpus update: the sync record names SIMILAR_SCHEMA, so older records are void
        (lexgraph.indexing.knn_state.synced_similar_generation), whether or not this process lives on."""
        kind = self.conn.execute("CALL table_info('SIMILAR') WHERE name = 'kind' RETURN type").get_next()[0]
        if kind == "STRING":
            self._recreate("SIMILAR")

    @staticmethod
    @contextmanager
    def writer(path: str | Path) -> Iterator["GraphStore"]:
        """The graph opened for writing, under the writer lock; closed (and checkpointed) at the end of the
        block, unless a session (GraphStore.session) holds it open for this process."""
        session = _sessions.get(_session_key(path))
        if session is not None:
            yield from session.writer()
            return
        own = _WriterSession(path)  # a session of one block
        try:
            yield from own.writer()
        finally:
            own.close()

    @staticmethod
    @contextmanager
    def session(path: str | Path) -> Iterator[None]:
        """Within this block, every GraphStore.writer(path) of this process shares one writer, opened at the
        first and closed (one checkpoint) at the end, instead of an open and a close per block. The writer
        lock is held from the first block to the end of this one: other processes' writers wait that long."""
        key = _session_key(path)
        if key in _sessions:  # nested: the outer session holds the writer
            yield
            return
        session = _sessions[key] = _WriterSession(path)
        try:
            yield
        finally:
            del _sessions[key]
            session.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.db.close()
            self.conn = self.db = None

    def query(self, cypher: str, parameters: dict | None = None) -> pl.DataFrame:
        if self.conn is None:
            return pl.DataFrame()
        return self.conn.execute(cypher, parameters or {}).get_as_pl()

    def delete_documents(self, doc_ids: list[str]) -> None:
        """Remove documents' chunks (with all their edges) and their Source nodes."""
        if not doc_ids:
            return
        self.conn.execute("MATCH (c:Chunk) WHERE c.doc_id IN $ids DETACH DELETE c", {"ids": doc_ids})
        self.conn.execute("MATCH (s:Source) WHERE s.id IN $ids DETACH DELETE s", {"ids": doc_ids})
        # their statements and topics go at once; shared facts and entities with the next lexical_graph build
        self.conn.execute("MATCH (s:Statement) WHERE s.doc_id IN $ids DETACH DELETE s", {"ids": doc_ids})
        self.conn.execute("MATCH (t:Topic) WHERE t.doc_id IN $ids DETACH DELETE t", {"ids": doc_ids})

    def replace_documents(self, sources: pl.DataFrame, chunks: pl.DataFrame) -> None:
        """Idempotent load: delete what these documents had, then bulk-copy the new nodes and edges."""
        self.delete_documents(sources["id"].to_list())
        # pages: PDF pages or PPTX slides; null for formats without pages
        pages = (pl.col("page_starts").list.len().cast(pl.Int32) if "page_starts" in sources.columns
                 else pl.lit(None, pl.Int32))
        source_rows = sources.select(
            "id", "uri", "relative_path", "title", "format", pl.when(pages > 0).then(pages).alias("pages"),
            "content_hash", "version", "size_bytes", "ingested_at",
        )
        chunk_rows = chunks.select(
            pl.col("chunk_id").alias("id"), "doc_id", pl.col("order").cast(pl.Int32).alias("ord"), "text",
            "char_start", "char_end", *(pl.col(c).cast(pl.Int32) if c in chunks.columns else pl.lit(None, pl.Int32).alias(c)
                                        for c in ("page_start", "page_end")),
            "heading_path", pl.col("token_count").cast(pl.Int32),
            pl.lit(0.0).alias("pagerank"), pl.lit(False).alias("in_skeleton"),
        )
        part_of = chunks.select(pl.col("chunk_id").alias("from"), pl.col("doc_id").alias("to"))
        ordered = chunks.sort("doc_id", "order")
        next_edges = (
            ordered.with_columns(pl.col("chunk_id").shift(-1).over("doc_id").alias("to"))
            .drop_nulls("to")
            .select(pl.col("chunk_id").alias("from"), "to")
        )
        self._copy("Source", source_rows)
        self._copy("Chunk", chunk_rows)
        self._copy("PART_OF", part_of)
        self._copy("NEXT", next_edges)

    def replace_similarity_edges(self, edges: pl.DataFrame) -> None:
        """The whole KNN graph as SIMILAR edges (src < dst, kind, weight); every chunk must be in the graph."""
        self._recreate("SIMILAR")
        self.add_similarity_edges(edges)

    def add_similarity_edges(self, edges: pl.DataFrame) -> None:
        """Bulk-copy SIMILAR edges (src, dst, kind name, weight); both chunks must be in the graph."""
        self._copy("SIMILAR", edges.select(pl.col("src").alias("from"), pl.col("dst").alias("to"),
                                           _kind_code(), "weight"))

    def delete_similarity_edges(self, edges: pl.DataFrame) -> int:
        """Delete these SIMILAR edges (src, dst, kind name); ones not in the graph are ignored. Returns how many went."""
        if not edges.height:
            return 0
        return self._delete_edges("SIMILAR", "Chunk", "Chunk",
                                  edges.select(pl.col("src").alias("from"), pl.col("dst").alias("to"), _kind_code()),
                                  "r.kind = v_kind")

    def similarity_edges(self) -> pl.DataFrame:
        """Every SIMILAR edge as src, dst, kind (its name), weight: for audits and tests."""
        schema = {"src": pl.String, "dst": pl.String, "kind": pl.String, "weight": pl.Float64}
        found = self.query("MATCH (a:Chunk)-[r:SIMILAR]->(b:Chunk) "
                           "RETURN a.id AS src, b.id AS dst, r.kind AS kind, r.weight AS weight")
        if not found.height:
            return pl.DataFrame(schema=schema)
        if found["kind"].dtype != pl.String:  # a graph no writer has migrated yet holds the names
            found = found.with_columns(pl.col("kind").replace_strict(dict(enumerate(SIMILAR_KINDS)),
                                                                     return_dtype=pl.String))
        return found.cast(schema)

    def chunks_without_similar_edges(self) -> list[str]:
        """Chunks with no SIMILAR edge: a reloaded document's chunks lose all theirs."""
        found = self.query("MATCH (c:Chunk) WHERE NOT EXISTS { MATCH (c)-[:SIMILAR]-(:Chunk) } RETURN c.id AS id")
        return found["id"].to_list() if found.height else []

    def edge_count(self, rel: str, source: str = "", target: str = "", where: str = "",
                   params: dict | None = None) -> int:
        """Edges of a rel table whose two nodes exist (those matching `where`, on nodes `a` and `b`). Not
        count(r): after DETACH DELETE, Kùzu 0.11 still counts some edges to deleted nodes that no query returns."""
        a, b = f"a:{source}" if source else "a", f"b:{target}" if target else "b"
        pattern = f"({b})<-[r:{rel}]-({a})" if rel in COUNT_FROM_TARGET and not where else f"({a})-[r:{rel}]->({b})"
        found = self.query(f"MATCH {pattern} {f'WHERE {where} ' if where else ''}"
                           "WITH a.id AS s, b.id AS d RETURN count(*) AS n", params)
        return int(found["n"][0]) if found.height else 0

    def _recreate(self, *tables: str) -> None:
        """Empty tables by dropping and creating them again: deleting millions of rows one by one takes
        minutes, dropping a table milliseconds. Rel tables first (a node table with rels cannot go)."""
        for table in tables:
            self.conn.execute(f"DROP TABLE IF EXISTS {table}")
        for table in reversed(tables):
            self.conn.execute(next(s for s in SCHEMA if f" {table}(" in s))

    def set_chunk_scores(self, scores: pl.DataFrame) -> None:
        """PageRank and skeleton membership onto Chunk nodes (chunk_id, pagerank, selected)."""
        rows = scores.select("chunk_id", "pagerank", "selected").to_arrow()  # noqa: F841 (scanned by name)
        self.conn.execute("LOAD FROM rows MATCH (c:Chunk {id: chunk_id}) "
                          "SET c.pagerank = pagerank, c.in_skeleton = selected")

    def replace_keywords(self, keywords: pl.Series, links: pl.DataFrame) -> None:
        """Keyword nodes and keyword→chunk edges (keyword, chunk_id, sentence_count) for the whole corpus."""
        self._recreate("KEYWORD_IN", "Keyword")
        self.add_keywords(keywords.to_list())
        self.add_keyword_links(links)

    def add_keywords(self, keywords: list[str]) -> None:
        self._copy("Keyword", pl.DataFrame({"id": keywords}, schema={"id": pl.String}))

    def delete_keywords(self, keywords: list[str], batch: int = 20_000) -> int:
        """Delete Keyword nodes with their links. Returns how many links went (those into existing chunks)."""
        links = 0
        for start in range(0, len(keywords), batch):
            ids = {"ids": keywords[start:start + batch]}
            links += self.edge_count("KEYWORD_IN", "Keyword", "Chunk", where="a.id IN $ids", params=ids)
            self.conn.execute("MATCH (k:Keyword) WHERE k.id IN $ids DETACH DELETE k", ids)
        return links

    def add_keyword_links(self, links: pl.DataFrame) -> None:
        """Bulk-copy KEYWORD_IN edges (keyword, chunk_id, sentence_count); both ends must be in the graph."""
        self._copy("KEYWORD_IN", links.select(pl.col("keyword").alias("from"), pl.col("chunk_id").alias("to"),
                                              pl.col("sentence_count").cast(pl.Int64).alias("occurrences")))

    def delete_keyword_links(self, doc_ids: list[str]) -> int:
        """Delete the KEYWORD_IN edges of these documents' chunks. Returns how many went."""
        if not doc_ids:
            return 0
        # from the chunks: written from the keyword side, the match scans every KEYWORD_IN edge
        return self._count("MATCH (c:Chunk)<-[r:KEYWORD_IN]-(:Keyword) WHERE c.doc_id IN $ids DELETE r RETURN count(*)",
                           {"ids": doc_ids})

    def keyword_links_per_document(self) -> dict[str, int]:
        """doc_id -> number of KEYWORD_IN edges into its chunks."""
        found = self.query("MATCH (:Keyword)-[r:KEYWORD_IN]->(c:Chunk) RETURN c.doc_id AS doc_id, count(r) AS n")
        return dict(zip(found["doc_id"].to_list(), found["n"].to_list())) if found.height else {}

    def replace_lexical_graph(self, nodes: dict[str, pl.DataFrame], edges: dict[str, pl.DataFrame]) -> None:
        """The whole lexical graph at once: the Statement, Topic, Fact and Entity tables and their rel tables are
        emptied (dropped and created again), then the given rows copied in. nodes: table -> rows in the table's column order; edges:
        rel table -> rows with `from`, `to` and the rel's properties. Edges to nodes that are not in the graph
        (e.g. a chunk of a document not loaded) are dropped, not failed on."""
        self._recreate(*LEXICAL_RELS, *LEXICAL_NODES)  # not DETACH DELETE: that goes row by row
        for table in LEXICAL_NODES:
            if table in nodes:
                self._copy(table, nodes[table])
        known = {table: set(frame["id"].to_list()) for table, frame in nodes.items()}
        known["Chunk"] = set(self.query("MATCH (c:Chunk) RETURN c.id AS id")["id"].to_list()) if self.count("Chunk") else set()
        known["Source"] = set(self.query("MATCH (s:Source) RETURN s.id AS id")["id"].to_list()) if self.count("Source") else set()
        for rel, frame in edges.items():
            source, target = LEXICAL_RELS[rel]
            keep = frame.filter(pl.col("from").is_in(list(known.get(source, ()))) & pl.col("to").is_in(list(known.get(target, ()))))
            self._copy(rel, keep)

    # --- the lexical graph written as a difference (lexgraph.indexing.lexical_diff) ---

    def source_versions(self) -> dict[str, str]:
        """doc_id -> when its Source node was (re)loaded: a reload deletes the document's chunks with their
        lexical edges and its statements and topics, so a changed time means its share must be written again."""
        if self.conn is None or not self.count("Source"):
            return {}
        found = self.query("MATCH (s:Source) RETURN s.id AS id, s.ingested_at AS at")
        return {d: "" if at is None else str(at) for d, at in found.iter_rows()}

    def chunks_of(self, doc_ids: list[str] | None = None) -> pl.DataFrame:
        """id, doc_id of the Chunk nodes of these documents (every chunk when None)."""
        schema = {"id": pl.String, "doc_id": pl.String}
        if self.conn is None or (doc_ids is not None and not doc_ids) or not self.count("Chunk"):
            return pl.DataFrame(schema=schema)
        if doc_ids is None:
            found = self.query("MATCH (c:Chunk) RETURN c.id AS id, c.doc_id AS doc_id")
        else:
            found = self.query("MATCH (c:Chunk) WHERE c.doc_id IN $ids RETURN c.id AS id, c.doc_id AS doc_id",
                               {"ids": doc_ids})
        return found.cast(schema) if found.height else pl.DataFrame(schema=schema)

    def delete_lexical_documents(self, doc_ids: list[str]) -> None:
        """Everything of the lexical graph that belongs to these documents alone: their Statement and Topic nodes
        with all their edges, and the MENTIONED_IN edges into their chunks (facts and entities stay)."""
        if not doc_ids:
            return
        self.conn.execute("MATCH (s:Statement) WHERE s.doc_id IN $ids DETACH DELETE s", {"ids": doc_ids})
        self.conn.execute("MATCH (t:Topic) WHERE t.doc_id IN $ids DETACH DELETE t", {"ids": doc_ids})
        # from the chunks, as delete_keyword_links: written from the entity side, the match scans every edge
        self.conn.execute("MATCH (c:Chunk)<-[r:MENTIONED_IN]-(:Entity) WHERE c.doc_id IN $ids DELETE r",
                          {"ids": doc_ids})

    def delete_lexical_nodes(self, table: str, ids: list[str], batch: int = 20_000) -> None:
        """Delete Fact or Entity nodes with all their edges."""
        for start in range(0, len(ids), batch):
            self.conn.execute(f"MATCH (n:{table}) WHERE n.id IN $ids DETACH DELETE n", {"ids": ids[start:start + batch]})

    def update_lexical_nodes(self, table: str, frame: pl.DataFrame) -> None:
        """Set every property of these existing nodes (rows in the table's column order, `id` first)."""
        if frame.height:
            rows = frame.rename({c: f"v_{c}" for c in frame.columns}).to_arrow()  # noqa: F841 (scanned by name)
            sets = ", ".join(f"n.{c} = v_{c}" for c in frame.columns if c != "id")
            self.conn.execute(f"LOAD FROM rows MATCH (n:{table} {{id: v_id}}) SET {sets}")

    def add_lexical_rows(self, table: str, frame: pl.DataFrame) -> None:
        """Bulk-copy nodes (table's column order) or edges (`from`, `to`, properties); an edge's nodes must exist."""
        self._copy(table, frame)

    def delete_lexical_edges(self, rel: str, frame: pl.DataFrame) -> None:
        """Delete these edges of a lexical rel table (`from`, `to`); ones not in the graph are ignored."""
        if frame.height:
            self._delete_edges(rel, *LEXICAL_RELS[rel], frame.select("from", "to"))

    def _delete_edges(self, rel: str, source: str, target: str, edges: pl.DataFrame, condition: str = "") -> int:
        """Delete the edges `edges` names (`from`, `to`, and any column `condition` reads as v_<name>); returns
        how many went. Kùzu plans a per-row match as a hash join over every edge of the table; for a few source
        nodes, their offsets found first mask the scan to their own edges (MASKED_DELETE_SOURCES)."""
        rows = edges.rename({c: f"v_{c}" for c in edges.columns}).unique().to_arrow()
        extra = f" AND {condition}" if condition else ""
        sources = edges.select(pl.col("from").unique().alias("v_from"))
        if sources.height <= MASKED_DELETE_SOURCES:
            found = self.query(f"LOAD FROM $rows MATCH (a:{source}) WHERE a.id = v_from RETURN offset(id(a)) AS o",
                               {"rows": sources.to_arrow()})
            if not found.height:
                return 0
            return self._count(f"LOAD FROM $rows MATCH (a:{source})-[r:{rel}]->(b:{target}) WHERE offset(id(a)) IN "
                               f"$offsets AND a.id = v_from AND b.id = v_to{extra} DELETE r RETURN count(*)",
                               {"rows": rows, "offsets": found["o"].to_list()})
        return self._count(f"LOAD FROM $rows MATCH (a:{source}) WHERE a.id = v_from MATCH (b:{target}) "
                           f"WHERE b.id = v_to MATCH (a)-[r:{rel}]->(b) {f'WHERE {condition} ' if condition else ''}"
                           "DELETE r RETURN count(*)", {"rows": rows})

    def lexical_edges_of(self, rel: str, doc_ids: list[str]) -> int:
        """EXTRACTED_FROM or BELONGS_TO edges of these documents' statements (counted through both nodes)."""
        if not doc_ids:
            return 0
        return self.edge_count(rel, *LEXICAL_RELS[rel], where="a.doc_id IN $ids", params={"ids": doc_ids})

    def _copy(self, table: str, frame: pl.DataFrame) -> None:
        if frame.height:
            self.conn.execute(f"COPY {table} FROM $rows", {"rows": frame.to_arrow()})

    def _count(self, cypher: str, parameters: dict | None = None) -> int:
        """Run a statement that returns count(*)."""
        return int(self.conn.execute(cypher, parameters or {}).get_next()[0])

    # -- the corpus checks' queries ------------------------------------------------------------------

    def chunks_without_source(self, doc_ids: list[str]) -> int:
        """Chunks of these documents with no PART_OF edge to their Source."""
        if not doc_ids:
            return 0
        return self._count("MATCH (c:Chunk) WHERE c.doc_id IN $ids AND NOT EXISTS { MATCH (c)-[:PART_OF]->(:Source) } "
                           "RETURN count(c)", {"ids": list(doc_ids)})

    def keywords_without_chunks(self) -> int:
        """Keyword nodes with no KEYWORD_IN edge (left from a removed document)."""
        return self._count("MATCH (k:Keyword) WHERE NOT EXISTS { MATCH (k)-[:KEYWORD_IN]->(:Chunk) } RETURN count(k)")

    def unanchored_lexical_nodes(self) -> dict[str, int]:
        """Statements without a chunk, facts without a statement, entities mentioned in no chunk."""
        return {
            "statements_without_chunk": self._count(
                "MATCH (s:Statement) WHERE NOT EXISTS { MATCH (s)-[:EXTRACTED_FROM]->(:Chunk) } RETURN count(s)"),
            "facts_without_statement": self._count(
                "MATCH (f:Fact) WHERE NOT EXISTS { MATCH (f)-[:SUPPORTS]->(:Statement) } RETURN count(f)"),
            "entities_without_chunk": self._count(
                "MATCH (e:Entity) WHERE NOT EXISTS { MATCH (e)-[:MENTIONED_IN]->(:Chunk) } RETURN count(e)"),
        }

    def tables(self) -> set[str]:
        """Names of the node and rel tables (a graph written before a table was added lacks it)."""
        if self.conn is None:
            return set()
        return set(self.conn.execute("CALL show_tables() RETURN name").get_as_pl()["name"].to_list())

    def count(self, table: str) -> int:
        if self.conn is None:
            return 0
        if table[0].isupper() and not table.isupper():
            return int(self.conn.execute(f"MATCH (n:{table}) RETURN count(n)").get_next()[0])
        return self.edge_count(table)  # through its endpoints, never count(r)
