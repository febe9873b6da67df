"""The Dagster Definitions for lexgraph (loaded by workspace.yaml and `dagster dev`)."""
from __future__ import annotations

import dagster as dg

from assets.bench import retrieval_benchmark
from assets.documents import document_assets
from assets.skeleton import corpus_assets, document_keywords
from orchestration.jobs import build_corpus_index, ingest_documents, purge_documents
from orchestration.sensors import corpus_index_after_ingest, inbox_sensor, nightly_ingest, nightly_purge
from lexgraph.settings import Settings
from resources import EmbedderResource, IndexResource, InboxResource, KuzuResource, LanceDBResource


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    """Definitions whose resources all come from one Settings (by default, the environment's)."""
    settings = settings or Settings.from_env()
    index = IndexResource.from_settings(settings)
    inbox = InboxResource(path=str(settings.inbox))
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
            "embedder": EmbedderResource(index=index),
            "lancedb": LanceDBResource(index=index),
            "kuzu": KuzuResource(index=index),
        },
    )


defs = build_definitions()
