"""The Dagster Definitions for lexgraph (loaded by workspace.yaml and `dagster dev`)."""
from __future__ import annotations

import dagster as dg

from assets.bench import retrieval_benchmark
from assets.documents import document_assets, inbox
from assets.lexical import document_lexical_assets, lexical_assets
from assets.maintenance import lance_compaction
from assets.queries import query_log
from assets.search_indexes import graph_tables, search_indexes
from assets.skeleton import corpus_assets, document_keywords
from lexgraph.indexing.lexical_extraction import extractor_signature
from lexgraph.ids import short_hash
from lexgraph.settings import CHUNKER_VERSION, Settings
from orchestration.jobs import build_corpus_index, extract_documents, ingest_documents, purge_documents
from orchestration.sensors import (corpus_index_sensor, inbox_sensor, nightly_ingest, nightly_purge,
                                   reextraction_sensor)
from resources import (EmbedderResource, ExtractorResource, IndexResource, InboxResource, KuzuResource,
                       LanceDBResource)

# Bump an asset's revision when its own code changes what it produces for the same input.
ASSET_REVISIONS = {
    "source_document": 1, "document_chunks": 1, "chunk_vectors": 1, "document_graph": 1, "document_keywords": 1,
    "chunk_knn_graph": 1, "chunk_pagerank": 1, "skeleton_selection": 1, "keyword_index": 1,
    "retrieval_benchmark": 1, "chunk_extractions": 1, "search_indexes": 1, "document_statements": 1,
    "document_topics": 1,
    "document_facts": 1, "document_entities": 1, "lexical_graph": 1, "query_log": 1,
    "lance_compaction": 1, "graph_tables": 1,
}


def code_versions(settings: Settings) -> dict[str, str]:
    """Each asset's code version: its revision, the chunker version, the embedding model and the settings
    that shape its output. Never the run id, so an unchanged build leaves every asset in sync. The extraction
    assets' include the extractors' models and prompt versions (and the entity types), so a prompt or model
    change shows them as changed code: re-extracting is then a deliberate backfill (`lexgraph reextract`)."""
    document = f"chunker={CHUNKER_VERSION}|model={settings.embed_model}|chunk_tokens={settings.chunk_tokens}"
    knn = f"{document}|knn_k={settings.knn_k}|knn_mode={settings.knn_mode}"
    extraction = f"{document}|{extractor_signature(settings)}"
    shaped_by = {
        "source_document": document, "document_chunks": document, "chunk_vectors": document,
        "document_graph": document, "document_keywords": document,
        "chunk_knn_graph": knn, "chunk_pagerank": knn, "skeleton_selection": f"{knn}|beta={settings.beta}",
        "keyword_index": document, "retrieval_benchmark": f"{knn}|beta={settings.beta}",
        "chunk_extractions": extraction, "document_statements": extraction, "document_topics": extraction,
        "document_facts": extraction, "document_entities": extraction, "lexical_graph": extraction,
        "search_indexes": f"{document}|lance_threshold={settings.lance_threshold}|backend={settings.query_backend}",
        "graph_tables": f"{document}|lance_threshold={settings.lance_threshold}|backend={settings.query_backend}",
        "lance_compaction": document,  # rewrites the files of tables the document settings shape, never content
        "query_log": document,  # answers cite chunks: a new chunker or model starts a new log's meaning
    }
    return {name: f"r{ASSET_REVISIONS[name]}-{short_hash(text, 10)}" for name, text in shaped_by.items()}


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    """Definitions whose resources all come from one Settings (by default, the environment's)."""
    settings = settings or Settings.from_env()
    index = IndexResource.from_settings(settings)
    inbox_resource = InboxResource(path=str(settings.inbox))
    versions = code_versions(settings)
    assets = dg.map_asset_specs(
        lambda spec: spec.replace_attributes(code_version=versions.get(spec.key.to_user_string(), spec.code_version)),
        [*document_assets, document_keywords, *document_lexical_assets, *corpus_assets, search_indexes, graph_tables,
         *lexical_assets, lance_compaction, retrieval_benchmark, query_log])
    return dg.Definitions(
        assets=[inbox, *assets],
        jobs=[ingest_documents, purge_documents, build_corpus_index, extract_documents],
        sensors=[inbox_sensor, corpus_index_sensor, reextraction_sensor],
        schedules=[nightly_purge, nightly_ingest],
        # One process per run: the embedding model loads once and every step shares it (the default
        # multiprocess executor would load it again in each step's process).
        executor=dg.in_process_executor,
        resources={
            "index": index,
            "inbox": inbox_resource,
            "embedder": EmbedderResource(index=index),
            "lancedb": LanceDBResource(index=index),
            "kuzu": KuzuResource(index=index),
            "extractors": ExtractorResource(index=index),
        },
    )


@dg.definitions
def defs() -> dg.Definitions:
    """What `dagster dev` loads (workspace.yaml). Lazy, so importing this module reads no settings: the
    CLI's --home and the tests' own Settings are never overridden by the environment's."""
    return build_definitions()
