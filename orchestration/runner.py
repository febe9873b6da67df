"""In-process ingestion through the real asset graph, for the CLI and benchmarks."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from tqdm import tqdm

from lexgraph.inbox import scan_folder
from lexgraph.settings import Settings
from orchestration.definitions import build_definitions
from orchestration.partitions import documents
from orchestration.reconcile import reconcile


@dataclass
class IngestReport:
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # doc_id -> "path: problem"
    runs: list[str] = field(default_factory=list)  # ingestion and purge runs
    corpus_run: str | None = None  # the corpus index update, run only when the catalog changed
    corpus_index_ok: bool | None = None
    corpus_error: str | None = None  # why the corpus index update failed, for the CLI to print


def ingest_folder(folder: str | Path, instance: dg.DagsterInstance, home: str | Path | None = None,
                  settings: Settings | None = None, prune: bool = False, progress: bool = True,
                  corpus: bool = True) -> IngestReport:
    """Index new and changed files under folder; with prune, also purge documents no longer there.
    With corpus, the corpus-wide KET-RAG assets are then updated once, if the indexed set changed.
    settings defaults to the environment's (home, when given, overrides its index home)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder")
    settings = (settings or Settings.from_env(home=home)).with_(inbox=folder)
    defs = build_definitions(settings)
    vectors = defs.resources["lancedb"].get()
    indexed = vectors.indexed_hashes()
    files = scan_folder(folder)
    existing = instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, indexed, existing, purge=prune, index_dir=settings.index_dir)
    plan = requests.plan
    report = IngestReport(new=len(plan.new), changed=len(plan.changed), unchanged=len(plan.unchanged),
                          removed=len(plan.removed) if prune else 0)
    if requests.add_partitions:
        instance.add_dynamic_partitions(documents.name, requests.add_partitions)
    for key in requests.delete_partitions:
        instance.delete_dynamic_partition(documents.name, key)
    total = sum(int(r.tags["lexgraph/documents"]) for r in requests.run_requests)
    with tqdm(total=total, unit="doc", desc="ingest", disable=not progress) as bar:
        for request in requests.run_requests:
            result = defs.resolve_job_def(request.job_name).execute_in_process(
                instance=instance, tags=request.tags, run_config=_quiet(progress, request.run_config),
                raise_on_error=False)
            report.runs.append(result.run_id)
            report.failed.update(_failures(result))
            bar.update(int(request.tags["lexgraph/documents"]))
    report.failed.update({k: v for k, v in plan.invalid.items() if k not in report.failed})
    if corpus and vectors.indexed_hashes() != indexed:
        result = defs.resolve_job_def("build_corpus_index").execute_in_process(
            instance=instance, run_config=_quiet(progress), raise_on_error=False)
        report.corpus_run = result.run_id
        report.corpus_index_ok = result.success
    return report


def _quiet(progress: bool, run_config: dict | None = None) -> dict:
    """With a progress bar, Dagster's console log is silenced; the instance still records every event."""
    run_config = dict(run_config or {})
    if progress:
        run_config["loggers"] = {"console": {"config": {"log_level": "CRITICAL"}}}
    return run_config


@contextlib.contextmanager
def private_dagster_instance():
    """The runner records into $DAGSTER_HOME's instance when it is set; the bench's cached index must
    not add its partitions to the user's dev instance (whose inbox sensor would then plan purges for
    them), so the variable is hidden and an ephemeral instance is used."""
    saved = os.environ.pop("DAGSTER_HOME", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["DAGSTER_HOME"] = saved


def ingest_with_default_instance(folder: str | Path, **options) -> IngestReport:
    """The instance in $DAGSTER_HOME when set (runs then show in `make dev`), else an ephemeral one."""
    home = os.environ.get("DAGSTER_HOME")
    if home:
        Path(home).mkdir(parents=True, exist_ok=True)  # a fresh checkout has no instance folder yet
    instance = dg.DagsterInstance.get() if home else dg.DagsterInstance.ephemeral()
    with instance:
        return ingest_folder(folder, instance, **options)


def _failures(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """Documents a run reported as failed, from the materialization metadata and step failures."""
    failed: dict[str, str] = {}
    for event in result.get_asset_materialization_events():
        entry = event.step_materialization_data.materialization.metadata.get("failed_documents")
        if entry is not None:
            failed.update(entry.value or {})
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data.error and event.step_failure_data.user_failure_data:
            data = event.step_failure_data.user_failure_data
            entry = data.metadata.get("failed_documents")
            if entry is not None:
                failed.update(entry.value or {})
    return failed
