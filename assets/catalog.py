"""What an auditor finds on every asset in the Dagster UI: its group, its owner, and the column schema of
each table it writes (``dagster/column_schema``), made from the schemas the engine writes with.

Groups (Dagster group names are identifiers):

    per_document  one partition per document: inbox → source_document → document_chunks → chunk_vectors →
                  document_graph, and document_keywords
    extraction    one partition per document, the LLM side: chunk_extractions → document_statements →
                  document_topics / document_facts / document_entities
    corpus        unpartitioned, corpus-wide: chunk_knn_graph → chunk_pagerank → skeleton_selection → search_indexes,
                  keyword_index, lexical_graph (the graph load of every document's extractions) → graph_tables
    quality       what measures the index: retrieval_benchmark, query_log. Asset checks have no group of
                  their own in Dagster: each shows on its asset's Checks tab.

Column schemas: each table is described once, from the engine's own schema object (polars dtypes of
lexgraph.indexing.pipeline / lexical_tables / knn / entity_resolution, the Arrow schemas of the LanceDB tables, the Kùzu DDL).
Three frames are built by the engine without a declared schema (a document's source row, the PageRank
scores, the skeleton selection); they are declared here, and tests/test_asset_catalog.py checks every
declared schema, these included, against the tables a real ingestion writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import dagster as dg
import polars as pl
import pyarrow as pa

from lexgraph.indexing import lexical_tables, pipeline
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_state import KNN_STATE_SCHEMA, SAVED_EDGE_SCHEMA
from lexgraph.indexing.entity_resolution import MERGE_SCHEMA
from lexgraph.extract.keywords import OCCURRENCE_SCHEMA, empty_keyword_index
from lexgraph.extract.source_texts import SOURCE_TEXT_SCHEMA, SOURCE_TEXTS
from lexgraph.storage import graph_store, vector_store

# --- groups and owners --------------------------------------------------------------------------

PER_DOCUMENT, EXTRACTION, CORPUS, QUALITY = "per_document", "extraction", "corpus", "quality"
GROUPS = (PER_DOCUMENT, EXTRACTION, CORPUS, QUALITY)
# Who answers for an asset: the ingestion team runs the nightly ingestion and the corpus index; the
# extraction team owns prompts, models and the LLM endpoint (and their backfills); the quality team the
# benchmark and the question log.
OWNERS = {PER_DOCUMENT: ["team:ingestion"], CORPUS: ["team:ingestion"], EXTRACTION: ["team:extraction"],
          QUALITY: ["team:quality"]}


def owners(group: str) -> list[str]:
    return list(OWNERS[group])


# --- tables -------------------------------------------------------------------------------------

# Columns whose meaning an auditor asks about, wherever they appear.
COLUMN_NOTES = {
    "content_hash": "sha256 of the source file's bytes: the source version",
    "extractor": "extractor that produced the row (openai, nlp)",
    "model": "model behind the row (the LLM, or the embedding model for vectors)",
    "prompt_version": "version of the extraction prompt (hash of prompt, schema and entity types)",
    "extracted_at": "when the extraction was made (UTC)",
    "doc_id": "document id: the partition key",
    "chunk_id": "chunk id (deterministic: document, order, text)",
    "src": "KNN edge end: row of knn_corpus.parquet of the same save (src < dst)",
    "dst": "KNN edge end: row of knn_corpus.parquet of the same save",
    "kind": "KNN edge kind: 0 semantic (embedding cosine), 1 lexical (shared keywords)",
}

# Frames the engine builds without a declared schema (see the module docstring).
SOURCE_ROW_SCHEMA: dict[str, pl.DataType] = {
    "doc_id": pl.String(), "uri": pl.String(), "relative_path": pl.String(), "title": pl.String(),
    "format": pl.String(), "content_hash": pl.String(), "size_bytes": pl.Int64(),
    "modified_at": pl.Datetime("us", "UTC"),
    "version": pl.String(), "text": pl.String(), "page_starts": pl.List(pl.Int64()),
}
PAGERANK_SCHEMA: dict[str, pl.DataType] = {"chunk_id": pl.String(), "doc_id": pl.String(), "pagerank": pl.Float64()}
SKELETON_SCHEMA: dict[str, pl.DataType] = {**PAGERANK_SCHEMA, "selected": pl.Boolean()}


@dataclass(frozen=True)
class Table:
    """One table an asset writes: where it is and its columns as (name, type) pairs.

    kind and name locate it: ``extract`` (name: an ExtractStore stage, one Parquet file per document),
    ``corpus`` (name: a CorpusFiles attribute), ``lancedb`` (a LanceDB table) or ``kuzu`` (a node table)."""

    kind: str
    name: str
    columns: tuple[tuple[str, str], ...]

    @property
    def location(self) -> str:
        if self.kind == "corpus":
            return str(getattr(CorpusFiles("<index>"), self.name))
        if self.kind == "extract":  # source texts are kept per version, named by content hash
            key = "<sha256>" if self.name == SOURCE_TEXTS else "<doc_id>"
            return f"<index>/extract/{self.name}/{key}.parquet"
        return {"lancedb": f"LanceDB table {self.name} (<index>/lance)",
                "kuzu": f"Kùzu node table {self.name} (<index>/graph.kuzu)"}[self.kind]

    def schema(self) -> dg.TableSchema:
        return dg.TableSchema(columns=[dg.TableColumn(name, type_, description=COLUMN_NOTES.get(name))
                                       for name, type_ in self.columns])


def type_name(dtype) -> str:
    """A column type as shown in the UI: polars or Arrow names, Kùzu's as declared; vector widths left out
    (they are the embedding model's dimension, a setting, not part of the schema)."""
    text = str(dtype)
    text = re.sub(r", shape=\(\d+,?\)", "", text)  # polars Array(Float32, shape=(384,))
    return re.sub(r"\[\d+\]$", "", text)  # Arrow fixed_size_list<item: float>[384]


def columns_of(schema) -> tuple[tuple[str, str], ...]:
    """(name, type) pairs of a polars schema (dict or pl.Schema) or an Arrow schema."""
    if isinstance(schema, pa.Schema):
        return tuple((field.name, type_name(field.type)) for field in schema)
    return tuple((name, type_name(dtype)) for name, dtype in pl.Schema(schema).items())


# Type names Kùzu accepts in DDL but reports under another name (CALL table_info).
KUZU_ALIASES = {"BOOLEAN": "BOOL"}


def kuzu_columns(table: str, ddl: Iterable[str] = graph_store.SCHEMA) -> tuple[tuple[str, str], ...]:
    """(name, type) pairs of a Kùzu node table, read from the graph store's DDL."""
    for statement in ddl:
        found = re.match(rf"\s*CREATE NODE TABLE IF NOT EXISTS {table}\((.*)\)\s*$", statement, re.S)
        if found:
            body = re.sub(r",?\s*PRIMARY KEY\(\w+\)", "", found.group(1))
            pairs = []
            for column in body.split(","):
                name, type_ = column.split(None, 1)
                type_ = type_.split(" DEFAULT ")[0].strip()
                pairs.append((name, KUZU_ALIASES.get(type_, type_)))
            return tuple(pairs)
    raise KeyError(f"no Kùzu node table {table} in the graph schema")


def _extract(stage: str, schema) -> Table:
    return Table("extract", stage, columns_of(schema))


def _corpus(attribute: str, schema) -> Table:
    return Table("corpus", attribute, columns_of(schema))


def _lance(name: str, schema) -> Table:
    return Table("lancedb", name, columns_of(schema))


def _kuzu(name: str) -> Table:
    return Table("kuzu", name, kuzu_columns(name))


# asset -> the tables it writes, the one an auditor reads first first. Assets that write no table (the
# inbox, the benchmark's report, the question log's summary) have none.
TABLES: dict[str, list[Table]] = {
    "source_document": [_extract(pipeline.SOURCES, SOURCE_ROW_SCHEMA), _extract(SOURCE_TEXTS, SOURCE_TEXT_SCHEMA)],
    "document_chunks": [_extract(pipeline.CHUNKS, pipeline.CHUNK_COLUMNS)],
    "chunk_vectors": [_lance(vector_store.CHUNKS, vector_store.chunk_schema(1))],
    "document_graph": [_lance(vector_store.SOURCES, vector_store.SOURCE_SCHEMA), _kuzu("Source"), _kuzu("Chunk")],
    "document_keywords": [_extract(pipeline.KEYWORDS, OCCURRENCE_SCHEMA),
                          _extract(pipeline.KEYWORD_STATS, empty_keyword_index(1).schema)],
    "chunk_extractions": [_extract(pipeline.EXTRACTIONS, lexical_tables.EXTRACTION_COLUMNS)],
    "document_statements": [_extract(pipeline.STATEMENTS, lexical_tables.STATEMENT_COLUMNS)],
    "document_topics": [_extract(pipeline.TOPICS, lexical_tables.TOPIC_COLUMNS)],
    "document_facts": [_extract(pipeline.FACTS, lexical_tables.FACT_COLUMNS)],
    "document_entities": [_extract(pipeline.ENTITIES, lexical_tables.ENTITY_COLUMNS),
                          _extract(pipeline.RELATIONS, lexical_tables.RELATION_COLUMNS)],
    "chunk_knn_graph": [_corpus("edges", SAVED_EDGE_SCHEMA), _corpus("knn_state", KNN_STATE_SCHEMA)],
    "chunk_pagerank": [_corpus("pagerank", PAGERANK_SCHEMA)],
    "skeleton_selection": [_corpus("skeleton", SKELETON_SCHEMA),
                           _lance(vector_store.CHUNK_SCORES, vector_store.CHUNK_SCORE_SCHEMA)],
    "keyword_index": [_corpus("keyword_index", empty_keyword_index(1).schema)],
    "lexical_graph": [_kuzu("Statement"), _kuzu("Topic"), _kuzu("Fact"), _kuzu("Entity"),
                      _corpus("entity_merges", MERGE_SCHEMA)],
}


def table_metadata(asset: str) -> dict:
    """Definition metadata of an asset's tables: ``dagster/column_schema`` for the first (the Columns
    section of the asset page), ``columns/<table>`` for the others, and where each one is stored."""
    tables = TABLES.get(asset, [])
    if not tables:
        return {}
    first, *others = tables
    metadata: dict = {"dagster/column_schema": first.schema(), "table": first.location}
    for table in others:
        metadata[f"columns/{table.name}"] = dg.MetadataValue.table_schema(table.schema())
        metadata[f"table/{table.name}"] = table.location
    return metadata


def with_catalog(spec: dg.AssetSpec, group: str, **attributes) -> dg.AssetSpec:
    """An AssetSpec in a group, with that group's owners and its tables' schemas."""
    return spec.replace_attributes(group_name=group, owners=owners(group),
                                   metadata={**(spec.metadata or {}), **table_metadata(spec.key.to_user_string())},
                                   **attributes)


def spec_kwargs(asset: str, group: str) -> Mapping:
    """group_name, owners and metadata for an @asset decorator."""
    return {"group_name": group, "owners": owners(group), "metadata": table_metadata(asset)}
