"""The lexical graph's tables: the columns of the per-document Parquet stages (statements, topics, facts,
entities, relations), and what the load builds from them: the Kùzu node and edge frames (with entity and fact
resolution), the statement and entity vectors in LanceDB, and the digest of what the graph holds.

Both ways of loading use them: the whole rebuild and the load by difference (lexical_diff); lexical.py
extracts and flattens into these tables and chooses between the two.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from lexgraph.ids import content_hash
from lexgraph.indexing.pipeline import ENTITIES, EXTRACTIONS, FACTS, RELATIONS, STATEMENTS, TOPICS

LEXICAL_STAGES = (STATEMENTS, TOPICS, FACTS, ENTITIES, RELATIONS)
# Ledger stages of the lexical graph's embedding calls.
STATEMENT_EMBEDDING_STAGE, ENTITY_EMBEDDING_STAGE = "statement_embedding", "entity_embedding"
# LanceDB tables of the lexical graph's vectors.
STATEMENT_VECTORS, ENTITY_VECTORS = "statements", "entities"

PROVENANCE = {"extractor": pl.Utf8, "model": pl.Utf8, "prompt_version": pl.Utf8,
              "extracted_at": pl.Datetime("us", "UTC")}
EXTRACTION_COLUMNS = {
    "chunk_id": pl.Utf8, "doc_id": pl.Utf8, **PROVENANCE, "outcome": pl.Utf8, "error": pl.Utf8,
    "in_skeleton": pl.Boolean, "cache_hit": pl.Boolean, "attempts": pl.Int32, "extraction": pl.Utf8,
}
STATEMENT_COLUMNS = {"statement_id": pl.Utf8, "chunk_id": pl.Utf8, "doc_id": pl.Utf8, "topic_id": pl.Utf8,
                     "topic": pl.Utf8, "text": pl.Utf8, **PROVENANCE}
TOPIC_COLUMNS = {"topic_id": pl.Utf8, "name": pl.Utf8, "doc_id": pl.Utf8, "statements": pl.Int32}
FACT_COLUMNS = {"fact_id": pl.Utf8, "subject": pl.Utf8, "predicate": pl.Utf8, "object": pl.Utf8,
                "statement_id": pl.Utf8, "chunk_id": pl.Utf8, "doc_id": pl.Utf8, **PROVENANCE}
ENTITY_COLUMNS = {"entity_name": pl.Utf8, "entity_type": pl.Utf8, "description": pl.Utf8, "mention": pl.Utf8,
                  "chunk_id": pl.Utf8, "doc_id": pl.Utf8, **PROVENANCE}
RELATION_COLUMNS = {"source": pl.Utf8, "target": pl.Utf8, "predicate": pl.Utf8, "description": pl.Utf8,
                    "strength": pl.Float64, "chunk_id": pl.Utf8, "doc_id": pl.Utf8, **PROVENANCE}
COLUMNS = {EXTRACTIONS: EXTRACTION_COLUMNS, STATEMENTS: STATEMENT_COLUMNS, TOPICS: TOPIC_COLUMNS,
           FACTS: FACT_COLUMNS, ENTITIES: ENTITY_COLUMNS, RELATIONS: RELATION_COLUMNS}


def stage_frame(stage: str, rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=COLUMNS[stage], orient="row") if rows else pl.DataFrame(schema=COLUMNS[stage])


# --- the graph's frames and vectors ---------------------------------------------------------------


@dataclass
class LexicalGraphResult:
    """What one build of the lexical graph loaded (node and edge counts) and embedded."""

    documents: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # catalog documents without lexical tables yet
    counts: dict[str, int] = field(default_factory=dict)
    merges: int = 0
    merged_surface_forms: int = 0
    embedded: dict[str, int] = field(default_factory=dict)  # newly embedded rows per vector table
    embedding_tokens: int = 0
    digest: str = ""
    mode: str = "rebuild"  # "diff": only the differences written; "rebuild": every table emptied and rewritten
    reason: str = ""  # why a rebuild (first build, no or unreadable saved state, a count that disagreed, ...)
    documents_read: list[str] = field(default_factory=list)  # documents whose Parquet tables were read
    changes: dict[str, list[str]] = field(default_factory=dict)  # added / changed / removed / reloaded documents
    written: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> rows added, removed, updated
    statement_vectors: str = ""  # how the stored statement vectors were known: "saved signatures" or "scanned"
    entity_vectors: str = ""  # "upserted" (changed rows only) or "replaced" (the whole table)
    entity_changes: dict[str, list[str]] = field(default_factory=dict)  # a diff's gone / new / updated entity ids
    damaged: dict[str, str] = field(default_factory=dict)  # doc_id -> damaged lexical table and its problem
    merges_frame: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False)
    ledger_rows: list[dict] = field(default_factory=list, repr=False)  # embedding calls, recorded by the caller

    def figures(self) -> dict:
        """The build's own account, for run metadata."""
        return {"mode": self.mode, "reason": self.reason, "documents_read": len(self.documents_read),
                **{f"documents_{kind}": len(docs) for kind, docs in self.changes.items()},
                "statement_vectors": self.statement_vectors, "entity_vectors": self.entity_vectors}


def _latest(frame: pl.DataFrame, key: str) -> pl.DataFrame:
    return frame.group_by(key).agg(pl.col("extracted_at").max())


def lexical_graph_frames(tables: dict[str, pl.DataFrame], senses: dict | None = None) -> tuple[
        dict[str, pl.DataFrame], dict[str, pl.DataFrame], pl.DataFrame, pl.DataFrame]:
    """Kùzu node and edge rows of the lexical graph from the per-document tables, with resolution:
    -> (nodes, edges, resolved entities, entity merges). senses: the names split by type
    (entity_resolution.entity_senses), from the tables' entity rows when not given; a diff gives them from every
    document's rows, since a fact or mention here resolves by rows it does not hold."""
    from lexgraph.indexing.entity_resolution import entity_ids_of_rows, entity_senses, resolve_entities
    from lexgraph.indexing.fact_resolution import resolve_fact_rows, resolve_relations

    statements, topics, facts = tables[STATEMENTS], tables[TOPICS], tables[FACTS]
    entity_rows, relations = tables[ENTITIES], tables[RELATIONS]
    nodes: dict[str, pl.DataFrame] = {
        "Statement": statements.select(pl.col("statement_id").alias("id"), "doc_id", "chunk_id", "topic_id", "text",
                                       "extractor", "model", "prompt_version", "extracted_at").unique("id", keep="first"),
        "Topic": topics.select(pl.col("topic_id").alias("id"), "doc_id", "name").unique("id", keep="first"),
    }
    senses = entity_senses(entity_rows) if senses is None else senses
    resolved_facts, fact_ids = resolve_fact_rows(facts, senses)
    facts = facts.with_columns(fact_ids)  # a fact about a name split by type is not the id its row was flattened with
    fact_nodes = resolved_facts.join(_latest(facts, "fact_id"), on="fact_id", how="left")
    nodes["Fact"] = fact_nodes.select(
        pl.col("fact_id").alias("id"), "subject", "predicate", "object",
        pl.col("support_count").alias("statements"), pl.col("doc_count").alias("documents"),
        *(pl.col(f"{c}s").list.join(",").alias(c) for c in ("extractor", "model", "prompt_version")), "extracted_at")
    entities, merges = resolve_entities(entity_rows, senses)
    mentions = entity_rows.with_columns(entity_ids_of_rows(entity_rows, senses)).drop_nulls("entity_id")
    entity_nodes = entities.join(_latest(mentions, "entity_id"), on="entity_id", how="left")
    nodes["Entity"] = entity_nodes.select(
        pl.col("entity_id").alias("id"), "name", pl.col("entity_type").alias("type"), "description",
        pl.col("surface_forms").alias("aliases"), pl.col("mention_count").alias("mentions"),
        pl.col("doc_count").alias("documents"),
        *(pl.col(f"{c}s").list.join(",").alias(c) for c in ("extractor", "model", "prompt_version")), "extracted_at")
    related = resolve_relations(relations, senses)
    supports = resolved_facts.select("fact_id", "statement_ids").explode("statement_ids")
    edges = {
        "EXTRACTED_FROM": statements.select(pl.col("statement_id").alias("from"), pl.col("chunk_id").alias("to")).unique(),
        "BELONGS_TO": statements.select(pl.col("statement_id").alias("from"), pl.col("topic_id").alias("to")).unique(),
        "TOPIC_OF": topics.select(pl.col("topic_id").alias("from"), pl.col("doc_id").alias("to")).unique(),
        "SUPPORTS": supports.select(pl.col("fact_id").alias("from"), pl.col("statement_ids").alias("to"))
                            .drop_nulls().unique(),
        "SUBJECT": resolved_facts.select(pl.col("subject_entity_id").alias("from"), pl.col("fact_id").alias("to")),
        "OBJECT": resolved_facts.select(pl.col("object_entity_id").alias("from"), pl.col("fact_id").alias("to")),
        "RELATED": related.select(pl.col("source_entity_id").alias("from"), pl.col("target_entity_id").alias("to"),
                                  "predicate", "description", "weight"),
        "MENTIONED_IN": (mentions.sort("chunk_id", "entity_name")
                         .group_by("entity_id", "chunk_id", maintain_order=True)
                         .agg(pl.col("mention").filter(pl.col("mention") != "").first().fill_null(""))
                         .select(pl.col("entity_id").alias("from"), pl.col("chunk_id").alias("to"),
                                 pl.col("mention").alias("description"))),
    }
    return nodes, edges, entities, merges


def _embed_rows(frame: pl.DataFrame, key: str, text: str, known: pl.DataFrame, embedder) -> tuple[pl.DataFrame, int, float, pl.Series]:
    """frame with a `vector` column: rows whose (key, text) was embedded before keep their vector, the others
    are embedded now (long texts windowed and pooled, never truncated). -> (frame, tokens, seconds, new mask)."""
    dimension = embedder.dimension
    frame = frame.with_columns(pl.col(text).fill_null(""))
    if known.height:
        frame = frame.join(known.select(key, pl.col(text).alias("_known_text"), "vector"), on=key, how="left")
        frame = frame.with_columns(pl.when(pl.col("_known_text") == pl.col(text)).then(pl.col("vector"))
                                   .otherwise(None).alias("vector")).drop("_known_text")
    else:
        frame = frame.with_columns(pl.lit(None, pl.Array(pl.Float32, dimension)).alias("vector"))
    new = frame["vector"].is_null()
    texts = frame.filter(new)[text].to_list()
    before, started = embedder.stats.tokens, time.perf_counter()
    matrix = embedder.embed(texts, long="pool") if texts else np.zeros((0, dimension), dtype=np.float32)
    seconds = time.perf_counter() - started
    if texts:
        fresh = pl.Series("vector", matrix, dtype=pl.Array(pl.Float32, dimension))
        rows = frame.with_row_index("_row")
        filled = rows.filter(new).with_columns(fresh)
        frame = pl.concat([rows.filter(~new).with_columns(pl.col("vector").cast(pl.Array(pl.Float32, dimension))),
                           filled]).sort("_row").drop("_row")
    return frame, embedder.stats.tokens - before, seconds, new


STATEMENT_VECTOR_COLUMNS = ["statement_id", "doc_id", "chunk_id", "topic_id", "topic", "text", "extractor", "model",
                            "prompt_version"]
# Statements embedded and written together: bounds memory for a document with very many statements.
VECTOR_BATCH = 4096


def statement_signatures(frame: pl.DataFrame) -> dict[str, str]:
    """doc_id -> one hash of its statement rows (ids, text, provenance)."""
    if frame.height == 0:
        return {}
    parts = [pl.col(c).cast(pl.Utf8).fill_null("") for c in STATEMENT_VECTOR_COLUMNS if c != "doc_id"]
    joined = (frame.sort("statement_id").group_by("doc_id")
              .agg(pl.concat_str(parts, separator="\x1f").str.join("\x1e").alias("rows")))
    return {doc: content_hash(rows) for doc, rows in joined.iter_rows()}


def statement_vector_rows(statements: pl.DataFrame) -> pl.DataFrame:
    return statements.unique("statement_id", keep="first").select(STATEMENT_VECTOR_COLUMNS)


def stored_statement_signatures(vectors) -> dict[str, str]:
    """doc_id -> signature of its rows in the LanceDB statements table (a scan of the whole table)."""
    stored = vectors.scan(STATEMENT_VECTORS, STATEMENT_VECTOR_COLUMNS)
    return statement_signatures(stored) if stored.height else {}


def update_statement_vectors(statements: pl.DataFrame, vectors, embedder,
                             run_id: str = "") -> tuple[int, int, list[dict], dict[str, str]]:
    """Bring the LanceDB statements table to these statements: rows of removed documents are deleted, and only
    documents whose statements changed are rewritten, in batches, embedding only statements not embedded
    before. -> (statements embedded, tokens, one ledger row per document embedded, doc_id -> signature)."""
    current = statement_vector_rows(statements)
    now = statement_signatures(current)
    embedded, tokens, rows = write_statement_vectors(
        now, stored_statement_signatures(vectors), lambda doc_id: current.filter(pl.col("doc_id") == doc_id),
        vectors, embedder, run_id)
    return embedded, tokens, rows, now


def write_statement_vectors(now: dict[str, str], before: dict[str, str], statements_of: Callable[[str], pl.DataFrame],
                            vectors, embedder, run_id: str = "") -> tuple[int, int, list[dict]]:
    """Rows of documents in `before` but not `now` are deleted; documents whose signature differs are rewritten
    from statements_of(doc_id) (vector rows), embedding only statements not embedded before.
    -> (statements embedded, tokens, one ledger row per document embedded)."""
    from lexgraph.indexing.pipeline import ledger_rows
    from lexgraph.storage.vector_store import _quote

    vectors.delete_rows(STATEMENT_VECTORS, "doc_id", [d for d in before if d not in now])
    embedded = tokens = 0
    rows: list[dict] = []
    for doc_id in sorted(d for d in now if before.get(d) != now[d]):
        own = statements_of(doc_id)
        known = (vectors.scan(STATEMENT_VECTORS, ["statement_id", "text", "vector"], f"doc_id = {_quote(doc_id)}")
                 if doc_id in before else pl.DataFrame())
        vectors.delete_rows(STATEMENT_VECTORS, "doc_id", [doc_id])
        doc_tokens, doc_seconds, doc_new = 0, 0.0, 0
        for start in range(0, own.height, VECTOR_BATCH):
            part, used, seconds, new = _embed_rows(own.slice(start, VECTOR_BATCH), "statement_id", "text", known,
                                                   embedder)
            vectors.add_rows(STATEMENT_VECTORS, part)
            doc_tokens, doc_seconds, doc_new = doc_tokens + used, doc_seconds + seconds, doc_new + int(new.sum())
        if doc_new:
            rows += ledger_rows(STATEMENT_EMBEDDING_STAGE, embedder.model_name, run_id, [doc_id], [1], doc_tokens,
                                doc_seconds)
        embedded, tokens = embedded + doc_new, tokens + doc_tokens
    return embedded, tokens, rows


def entity_vector_rows(entity_nodes: pl.DataFrame) -> pl.DataFrame:
    """The LanceDB entity rows (without vectors) of Entity nodes: the text embedded is "name: description"."""
    return entity_nodes.select(
        pl.col("id").alias("entity_id"), "name", pl.col("type").alias("entity_type"), "description",
        pl.col("mentions").alias("mention_count"), pl.col("documents").alias("doc_count")).with_columns(
        pl.format("{}: {}", "name", pl.col("description").str.split("\n").list.first().fill_null(""))
        .str.strip_chars(": ").alias("text"))


def replace_entity_vectors(entity_nodes: pl.DataFrame, vectors, embedder, run_id: str = "") -> tuple[int, int, list[dict]]:
    """The whole entity table rewritten, embedding only texts not embedded before. -> (embedded, tokens, ledger rows)."""
    rows, tokens, seconds, new = _embed_rows(entity_vector_rows(entity_nodes), "entity_id", "text",
                                             vectors.known_vectors(ENTITY_VECTORS, "entity_id", "text"), embedder)
    vectors.replace_table(ENTITY_VECTORS, rows)
    return int(new.sum()), tokens, _entity_ledger(tokens, seconds, new, embedder, run_id)


def _entity_ledger(tokens: int, seconds: float, new: pl.Series, embedder, run_id: str) -> list[dict]:
    if tokens or new.any():
        return [{"run_id": run_id or "direct", "stage": ENTITY_EMBEDDING_STAGE, "model": embedder.model_name,
                 "prompt_tokens": tokens, "seconds": seconds, "attempts": 1}]
    return []


def upsert_entity_vectors(changed_nodes: pl.DataFrame, removed: list[str], expected_rows: int, vectors, embedder,
                          run_id: str = "") -> tuple[int, int, list[dict]] | None:
    """Only these entities' rows written (merge on entity_id) and the removed ones deleted; None (nothing written)
    when the table is missing, or afterwards does not hold `expected_rows` rows: the caller replaces it whole."""
    from lexgraph.storage.vector_store import _in_list

    table = vectors._table(ENTITY_VECTORS)
    if table is None or "vector" not in table.schema.names:
        return None
    rows = entity_vector_rows(changed_nodes)
    ids = rows["entity_id"].to_list()
    known = (vectors.scan(ENTITY_VECTORS, ["entity_id", "text", "vector"], _in_list("entity_id", ids))
             if ids else pl.DataFrame())
    rows, tokens, seconds, new = _embed_rows(rows, "entity_id", "text", known, embedder)
    vectors.upsert_rows(ENTITY_VECTORS, "entity_id", rows, removed)
    if vectors.count(ENTITY_VECTORS) != expected_rows:
        return None
    return int(new.sum()), tokens, _entity_ledger(tokens, seconds, new, embedder, run_id)


def write_merges(merges: pl.DataFrame, merges_path) -> None:
    if merges_path is not None:
        from pathlib import Path

        Path(merges_path).parent.mkdir(parents=True, exist_ok=True)
        partial = Path(merges_path).with_suffix(".tmp")
        merges.write_parquet(partial)
        partial.replace(merges_path)


def lexical_digest(signatures: dict[str, str], frames: dict[str, pl.DataFrame]) -> str:
    """One hash of what the lexical graph holds: each document's statements, and the facts, entities and
    relations (the same whichever way the graph was written)."""
    shape = [*sorted(frames["Fact"]["id"].to_list()), *sorted(frames["Entity"]["id"].to_list()),
             *sorted(f"{a}>{b}" for a, b in frames["RELATED"].select("from", "to").iter_rows())]
    return content_hash("\n".join([*(f"{d}={h}" for d, h in sorted(signatures.items())), *shape]))
