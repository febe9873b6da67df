"""The Dagster Definitions for lexgraph (loaded by workspace.yaml and `dagster dev`)."""
from __future__ import annotations

import dagster as dg

from assets.bench import retrieval_benchmark
from assets.documents import document_assets
from assets.skeleton import corpus_assets, document_keywords
from orchestration.jobs import build_corpus_index, ingest_documents, purge_documents
from orchestration.sensors import corpus_index_after_ingest, inbox_sensor, nightly_ingest, nightly_purge
from resources import EmbedderResource, IndexResource, InboxResource, KuzuResource, LanceDBResource


def build_definitions(inbox_path: str | None = None, home: str | None = None) -> dg.Definitions:
    """Definitions with resources for one inbox and index home (defaults come from the environment)."""
    index = IndexResource(home=home) if home else IndexResource()
    inbox = InboxResource(path=inbox_path) if inbox_path else InboxResource()
    return dg.Definitions(
        assets=[*document_assets, document_keywords, *corpus_assets, retrieval_benchmark],
        jobs=[ingest_documents, purge_documents, build_corpus_index],
        sensors=[inbox_sensor, corpus_index_after_ingest],
        schedules=[nightly_purge, nightly_ingest],
        # One process per run: the embedding model loads once and every step shares it (the default
        # multiprocess executor would load it again in each step's process).
        executor=dg.in_process_executor,
        resources={
            "index": index,
            "inbox": inbox,
            "embedder": EmbedderResource(),
            "lancedb": LanceDBResource(index=index),
            "kuzu": KuzuResource(index=index),
        },
    )


defs = build_definitions()
