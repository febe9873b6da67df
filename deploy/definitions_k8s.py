"""lexgraph's Definitions for Kubernetes: the same assets, jobs, sensors, schedules and resources as
orchestration/definitions.py, with Dagster's k8s_job_executor in place of the in-process executor.

The K8sRunLauncher (deploy/dagster.k8s.yaml, deploy/values.yaml) starts one run-worker pod per run, so each
batched run of up to 256 documents the inbox sensor requests is a pod; this executor then runs each step of
that run in a pod of its own, sized per step below. Volumes (the index, the inbox), image and environment
come from the run launcher, whose pod configuration the executor's step pods inherit.

Loaded by the code server: `dagster api grpc -f deploy/definitions_k8s.py -a defs -d /app`. Nothing here
talks to a cluster until a run is launched.
"""
from __future__ import annotations

import dagster as dg
from dagster_k8s import k8s_job_executor

from lexgraph.settings import Settings
from orchestration.definitions import build_definitions


def _resources(cpu: str, memory: str, cpu_limit: str | None = None, memory_limit: str | None = None) -> dict:
    return {"container_config": {"resources": {
        "requests": {"cpu": cpu, "memory": memory},
        "limits": {"cpu": cpu_limit or cpu, "memory": memory_limit or memory}}}}


# Every step not named here: a small pod.
DEFAULT_STEP = _resources("250m", "512Mi", "1", "1Gi")

# Pod size per step (step name = asset or op name). With the embedding model served (TEI or vLLM behind
# LEXGRAPH_EMBED_URL, docs/SCALING.md), no step loads the model weights: chunking loads the tokenizer only.
PER_STEP = {
    # per-document steps, one pod each per batch of up to 256 documents
    "source_document": _resources("500m", "1Gi", "1", "2Gi"),  # reads the inbox files (PDF, DOCX, ...)
    "document_chunks": _resources("500m", "1Gi", "1", "2Gi"),
    "chunk_vectors": _resources("500m", "1Gi", "2", "2Gi"),  # waits on the embedding endpoint
    "document_graph": _resources("500m", "1Gi", "1", "2Gi"),  # kuzu_writer pool: one at a time
    "document_keywords": _resources("500m", "1Gi", "2", "2Gi"),
    "chunk_extractions": _resources("250m", "512Mi", "1", "1Gi"),  # waits on the LLM endpoint
    "lexical_tables": _resources("500m", "1Gi", "1", "2Gi"),
    # corpus-wide steps: every chunk vector in memory (about 1.6 GB per million 384-d vectors)
    "chunk_knn_graph": _resources("2", "8Gi", "4", "8Gi"),
    "chunk_pagerank": _resources("1", "4Gi", "2", "4Gi"),
    "skeleton_selection": _resources("1", "4Gi", "2", "4Gi"),
    "keyword_index": _resources("1", "4Gi", "2", "4Gi"),
    "lexical_graph": _resources("1", "4Gi", "2", "4Gi"),
    "purge_removed_documents": _resources("250m", "1Gi", "1", "2Gi"),
}

EXECUTOR_CONFIG = {
    # at most this many step pods at once within one run (the run queue limits runs, the kuzu_writer pool
    # limits graph writers across all runs)
    "max_concurrent": 4,
    "step_k8s_config": DEFAULT_STEP,
    "per_step_k8s_config": PER_STEP,
    # step jobs are removed with their run's pod
    "enable_owner_references": True,
}

lexgraph_k8s_executor = k8s_job_executor.configured(EXECUTOR_CONFIG, name="lexgraph_k8s")


def build_k8s_definitions(settings: Settings | None = None) -> dg.Definitions:
    """build_definitions(settings), each step in its own pod."""
    base = build_definitions(settings)
    return dg.Definitions(
        assets=base.assets, asset_checks=base.asset_checks, jobs=base.jobs, sensors=base.sensors,
        schedules=base.schedules, resources=base.resources, loggers=base.loggers,
        executor=lexgraph_k8s_executor,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """What the code server loads. Settings come from the pod's environment (LEXGRAPH_HOME on the shared
    index volume, LEXGRAPH_INBOX on the inbox volume), as for `dagster dev`."""
    return build_k8s_definitions()
