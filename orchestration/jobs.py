"""Jobs: batched per-document ingestion, the corpus index update, and the purge of removed documents."""
from pathlib import Path

import dagster as dg
import polars as pl

from assets.documents import document_assets, inbox, stored_hashes
from assets.lexical import document_lexical_assets, lexical_assets
from assets.maintenance import lance_compaction
from assets.partitions import GRAPH_WRITER_POOL
from assets.search_indexes import graph_tables, search_indexes
from assets.skeleton import corpus_assets, document_keywords
from lexgraph.indexing import pipeline
from resources import IndexResource, InboxResource, KuzuResource, LanceDBResource

# Every asset with one partition per document: a purged document leaves an event in each one's history.
PER_DOCUMENT_ASSETS = [inbox, *document_assets, document_keywords, *document_lexical_assets]

ingest_documents = dg.define_asset_job(
    "ingest_documents", selection=dg.AssetSelection.assets(*PER_DOCUMENT_ASSETS),
    description="Ingest a range of document partitions in one run: observe the inbox files (sha256), then "
    "source → chunks → vectors → graph, keywords, and chunk extractions → statements, topics, facts, entities.",
)

build_corpus_index = dg.define_asset_job(
    "build_corpus_index", selection=dg.AssetSelection.assets(*corpus_assets, search_indexes, *lexical_assets,
                                                          graph_tables, lance_compaction),
    description="Update the corpus-wide index: KNN graph → PageRank → skeleton, the keyword index, LanceDB's "
    "search indexes (from LEXGRAPH_LANCE_THRESHOLD chunks on), the lexical graph (Statement, Topic, Fact, "
    "Entity) loaded from every document's extractions, and its LanceDB tables (from the threshold on); last, the fragmented LanceDB tables are compacted.",
)

extract_documents = dg.define_asset_job(
    "extract_documents", selection=dg.AssetSelection.assets(*document_lexical_assets),
    description="Re-extract a range of document partitions (chunk extractions → statements, topics, facts, "
    "entities) without re-reading or re-embedding them: after a skeleton selection change (only documents with "
    "newly selected chunks, only those chunks call the LLM) or a prompt or model change (`lexgraph reextract`). "
    "The lexical graph follows in the corpus job.",
)


class PurgeConfig(dg.Config):
    doc_ids: list[str]


def _source_paths(doc_ids: list[str], index: IndexResource, lancedb: LanceDBResource) -> dict[str, str]:
    """doc_id -> inbox-relative path, from the catalog or else the stored source (read before purging)."""
    catalog = lancedb.get().sources()
    paths = dict(zip(catalog["doc_id"].to_list(), catalog["relative_path"].to_list()))
    store = index.extract_store()
    for doc_id in doc_ids:
        path = store.path(pipeline.SOURCES, doc_id)
        if doc_id not in paths and path.exists():
            try:
                paths[doc_id] = pl.read_parquet(path, columns=["relative_path"])["relative_path"][0]
            except Exception:  # a damaged file names no path; the event still names the document
                pass
    return {d: paths[d] for d in doc_ids if d in paths}


def removal_reason(relative_path: str | None, root: Path) -> str:
    if relative_path is None:
        return "file left the inbox (its path is no longer recorded)"
    path = root / relative_path
    if path.exists():
        return f"purged on request; the file is still in the inbox ({path})"
    return f"file left the inbox ({path})"


@dg.op(pool=GRAPH_WRITER_POOL, description="Delete removed documents' graph nodes, vectors and Parquet files, "
       "and record the removal in the history of each per-document asset's partition.")
def purge_removed_documents(context: dg.OpExecutionContext, config: PurgeConfig, index: IndexResource,
                            lancedb: LanceDBResource, kuzu: KuzuResource, inbox: InboxResource) -> None:
    paths = _source_paths(config.doc_ids, index, lancedb)
    versions = stored_hashes(index.extract_store(), config.doc_ids)  # the source versions being removed
    with kuzu.writer() as graph:
        pipeline.purge_documents(config.doc_ids, index.extract_store(), graph, lancedb.get())
    root = inbox.root()
    for doc_id in config.doc_ids:
        metadata = {"removed": True, "reason": removal_reason(paths.get(doc_id), root), "doc_id": doc_id}
        if doc_id in paths:
            metadata["source_path"] = paths[doc_id]
        if versions.get(doc_id):
            metadata["sha256"] = versions[doc_id]
        for assets_def in PER_DOCUMENT_ASSETS:
            for key in assets_def.keys:  # a multi-asset (lexical_tables) has several
                context.log_event(dg.AssetObservation(asset_key=key, partition=doc_id, metadata=metadata))
    context.log.info(f"purged {len(config.doc_ids)} document(s): {', '.join(config.doc_ids)}")


@dg.job(description="Remove documents that left the inbox, with everything indexed from them.")
def purge_documents():
    purge_removed_documents()
