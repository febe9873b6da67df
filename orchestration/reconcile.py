"""Turn an inbox-versus-index comparison into Dagster partition changes and batched run requests.

Shared by the inbox sensor, the nightly schedule and the CLI, so all three agree on what runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import dagster as dg

from lexgraph.ids import short_hash
from lexgraph.inbox import FileState, KnownProblems, ReconcilePlan, plan_reconcile

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
              purge: bool = True, *, index_dir: str | Path | None = None, log=None,
              deferred: Iterable[str] = ()) -> ReconcileRequests:
    """Valid new files are added as partitions first so they form one contiguous range; each invalid
    new or changed file gets a run of its own, which fails with the file's problem without holding up
    the others. Entries that are not readable files (FIFOs, devices, link loops, ...) get no run.

    index_dir: the index whose problems.json remembers files that failed at read time: an unchanged
    known-bad file is reported (plan.known_bad) but not re-run, new problems are recorded, and
    entries of files since indexed or removed are cleared. log: a logger (the sensor's) that names
    each newly found problem. deferred: doc_ids of files a time-boxed scan has not read yet: they are
    left for a later reconcile, neither requested nor removed."""
    problems = KnownProblems(index_dir) if index_dir is not None else None
    known_bad = problems.load() if problems else {}
    deferred = set(deferred)
    plan = plan_reconcile(files, indexed, set(existing_keys), known_bad, deferred)
    fresh = {k: message for k, message in plan.invalid.items() if k not in plan.known_bad}
    if problems:
        problems.update(
            record={k: (files[k].content_hash, files[k].relative_path, message) for k, message in fresh.items()
                    if files[k].kind != "vanished"},  # a vanished file is looked at again next time
            clear=[k for k in known_bad if k not in deferred
                   and (k not in files or indexed.get(k) == files[k].content_hash)])
    if log is not None:
        for message in fresh.values():
            log.warning(f"not indexed: {message}")
        if plan.known_bad:
            log.info(f"{len(plan.known_bad)} file(s) with a known problem, unchanged, not retried: "
                     + "; ".join(sorted(files[k].relative_path for k in plan.known_bad)))
    existing = set(existing_keys)
    to_index = set(plan.to_index)
    valid = [k for k in plan.to_index if k not in plan.invalid]
    failing = [k for k in plan.invalid if k in to_index]  # readable files with a problem: a run each
    new_keys = [k for k in valid if k not in existing] + [k for k in failing if k not in existing]
    requests = ReconcileRequests(plan=plan, add_partitions=new_keys)
    for batch in contiguous_batches(existing_keys + new_keys, set(valid)):
        requests.ingest_runs.append(range_request(batch, files))
    for key in failing:
        requests.ingest_runs.append(range_request([key], files))
    if purge and plan.removed:
        requests.delete_partitions = [k for k in plan.removed if k in existing]
        requests.purge_run = dg.RunRequest(
            run_key=_run_key("purge", plan.removed, files), job_name="purge_documents",
            run_config={"ops": {"purge_removed_documents": {"config": {"doc_ids": plan.removed}}}},
            tags={"lexgraph/documents": str(len(plan.removed))},
        )
    return requests
