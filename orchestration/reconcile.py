"""Turn an inbox-versus-index comparison into Dagster partition changes and batched run requests.

Shared by the inbox sensor, the nightly schedule and the CLI, so all three agree on what runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from lexgraph.ids import short_hash
from lexgraph.inbox import FileState, ReconcilePlan, plan_reconcile
from orchestration.partitions import documents

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
# Documents per run: large enough to batch embedding, small enough to show progress and to retry.
MAX_BATCH = 256


@dataclass
class ReconcileRequests:
    plan: ReconcilePlan
    add_partitions: list[str] = field(default_factory=list)
    delete_partitions: list[str] = field(default_factory=list)
    ingest_runs: list[dg.RunRequest] = field(default_factory=list)
    purge_run: dg.RunRequest | None = None

    @property
    def run_requests(self) -> list[dg.RunRequest]:
        return self.ingest_runs + ([self.purge_run] if self.purge_run else [])


def contiguous_batches(ordered_keys: list[str], targets: set[str], max_batch: int = MAX_BATCH) -> list[list[str]]:
    """Runs cover ranges of partition keys, so group targets into runs of adjacent keys only."""
    batches: list[list[str]] = []
    current: list[str] = []
    for key in ordered_keys:
        if key in targets and len(current) < max_batch:
            current.append(key)
            continue
        if current:
            batches.append(current)
        current = [key] if key in targets else []
    if current:
        batches.append(current)
    return batches


def _run_key(kind: str, keys: list[str], files: dict[str, FileState]) -> str:
    """Same documents at the same content → same key, so a pending request is not made twice."""
    signature = "|".join(f"{k}={files[k].content_hash if k in files else '-'}" for k in keys)
    return f"{kind}-{short_hash(signature, 16)}"


def range_request(batch: list[str], files: dict[str, FileState], job_name: str = "ingest_documents") -> dg.RunRequest:
    tags = {RANGE_START: batch[0], RANGE_END: batch[-1], "lexgraph/documents": str(len(batch))}
    return dg.RunRequest(run_key=_run_key("ingest", batch, files), job_name=job_name, tags=tags)


def reconcile(files: dict[str, FileState], indexed: dict[str, str], existing_keys: list[str],
              purge: bool = True) -> ReconcileRequests:
    """Valid new files are added as partitions first so they form one contiguous range; each invalid
    file gets a run of its own, which fails with the file's problem without holding up the others."""
    plan = plan_reconcile(files, indexed, set(existing_keys))
    existing = set(existing_keys)
    valid = [k for k in plan.to_index if k not in plan.invalid]
    new_keys = [k for k in valid if k not in existing] + [k for k in plan.invalid if k not in existing]
    requests = ReconcileRequests(plan=plan, add_partitions=new_keys)
    for batch in contiguous_batches(existing_keys + new_keys, set(valid)):
        requests.ingest_runs.append(range_request(batch, files))
    for key in plan.invalid:
        requests.ingest_runs.append(range_request([key], files))
    if purge and plan.removed:
        requests.delete_partitions = [k for k in plan.removed if k in existing]
        requests.purge_run = dg.RunRequest(
            run_key=_run_key("purge", plan.removed, files), job_name="purge_documents",
            run_config={"ops": {"purge_removed_documents": {"config": {"doc_ids": plan.removed}}}},
            tags={"lexgraph/documents": str(len(plan.removed))},
        )
    return requests


def partition_requests(requests: ReconcileRequests) -> list:
    changes: list = []
    if requests.add_partitions:
        changes.append(documents.build_add_request(requests.add_partitions))
    if requests.delete_partitions:
        changes.append(documents.build_delete_request(requests.delete_partitions))
    return changes
