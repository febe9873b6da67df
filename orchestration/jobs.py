"""Jobs: batched per-document ingestion, and the purge of removed documents."""

import dagster as dg

from assets.documents import document_assets
from assets.skeleton import corpus_assets, document_keywords
from lexgraph.build import pipeline
from orchestration.partitions import GRAPH_WRITER_POOL
from resources import IndexResource, KuzuResource, LanceDBResource

ingest_documents = dg.define_asset_job(
    "ingest_documents", selection=dg.AssetSelection.assets(*document_assets, document_keywords),
    description="Ingest a range of document partitions in one run: source → chunks → vectors → graph, keywords.",
)

build_corpus_index = dg.define_asset_job(
    "build_corpus_index", selection=dg.AssetSelection.assets(*corpus_assets),
    description="Update the corpus-wide KET-RAG index: KNN graph → PageRank → skeleton, and the keyword index.",
)


class PurgeConfig(dg.Config):
    doc_ids: list[str]


@dg.op(pool=GRAPH_WRITER_POOL, description="Delete removed documents' graph nodes, vectors and Parquet files.")
def purge_removed_documents(context: dg.OpExecutionContext, config: PurgeConfig, index: IndexResource,
                            lancedb: LanceDBResource, kuzu: KuzuResource) -> None:
    with kuzu.writer() as graph:
        pipeline.purge_documents(config.doc_ids, index.extract_store(), graph, lancedb.get())
    context.log.info(f"purged {len(config.doc_ids)} document(s): {', '.join(config.doc_ids)}")


@dg.job(description="Remove documents that left the inbox, with everything indexed from them.")
def purge_documents():
    purge_removed_documents()
