"""In-process ingestion through the real asset graph, for the CLI and benchmarks.

Every call converges: runs left behind by a killed process are marked failed (and their pool slots
freed), documents whose extract files are damaged go back for re-ingestion, and the corpus index is
updated whenever it was not built from the current catalog, whatever call or crash left it so.
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import polars as pl
from tqdm import tqdm

from assets.partitions import documents
from lexgraph.index import LexIndex
from lexgraph import progress as stage_progress
from lexgraph.indexing import corpus_prefetch
from lexgraph.indexing.corpus_state import LEXICAL_GRAPH, solo_steps
from lexgraph.extract.embedder import reusing_recent_vectors
from lexgraph.inbox import FileState, plan_reconcile, scan_folder
from lexgraph.indexing.repair import drop_damaged_documents
from lexgraph.settings import Settings
from lexgraph.storage.graph_store import GraphStore
from orchestration.definitions import build_definitions
from orchestration.reconcile import RANGE_END, RANGE_START, reconcile

# Tags on every run this runner executes: which process on which machine runs it, so a later call can
# tell a run whose process was killed from one still going.
PID_TAG, HOST_TAG, PROCESS_START_TAG = "lexgraph/pid", "lexgraph/host", "lexgraph/process_start"
UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING]


@dataclass
class IngestReport:
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # doc_id -> "path: problem"
    runs: list[str] = field(default_factory=list)  # ingestion and purge runs
    corpus_run: str | None = None  # the corpus index update, run when the corpus index is out of step
    corpus_index_ok: bool | None = None
    corpus_error: str | None = None  # why the corpus index update failed, for the CLI to print
    repaired: dict[str, str] = field(default_factory=dict)  # doc_id -> damaged extract file; re-ingested, counted as changed
    abandoned_runs: list[str] = field(default_factory=list)  # runs of killed processes, now marked failed
    reextracted: list[str] = field(default_factory=list)  # documents re-extracted after the skeleton selection changed
    extraction_runs: list[str] = field(default_factory=list)  # their extract_documents runs
    lexical_run: str | None = None  # the lexical graph rebuilt after re-extraction


@dataclass
class ReextractReport:
    """What `lexgraph reextract` did: documents whose extractions no longer matched the extractors, re-run."""

    documents: dict[str, str] = field(default_factory=dict)  # doc_id -> why it was re-extracted
    runs: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    lexical_run: str | None = None
    lexical_ok: bool | None = None
    llm_calls: int = 0  # model calls these runs made (from the cost ledger)
    cache_hits: int = 0


def ingest_folder(folder: str | Path, instance: dg.DagsterInstance, home: str | Path | None = None,
                  settings: Settings | None = None, prune: bool = False,
                  progress: bool | stage_progress.Reporter = True, corpus: bool = True) -> IngestReport:
    """Index new and changed files under folder; with prune, also purge documents no longer there.
    With corpus, the corpus-wide KET-RAG assets are then updated once, if the catalog changed or they
    were not built from it (a crash or a failed update earlier). settings defaults to the environment's
    (home, when given, overrides its index home). progress: a bar on stderr, nothing, or a Reporter."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder")
    settings = (settings or Settings.from_env(home=home)).with_(inbox=folder)
    defs = build_definitions(settings)
    index = LexIndex(settings)
    report = IngestReport(abandoned_runs=fail_abandoned_runs(instance))
    vectors = defs.resources["lancedb"].get()
    files = scan_folder(folder)
    indexed = vectors.indexed_hashes()
    preload = _load_embedder_early(defs, files, indexed)
    report.repaired, damaged = drop_damaged_documents(index.extract_store, vectors, files, indexed)
    indexed = {d: h for d, h in indexed.items() if d not in report.repaired}  # taken out of the catalog
    existing = instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, indexed, existing, purge=prune, index_dir=settings.index_dir)
    plan = requests.plan
    # a repaired document counts as changed (its index is re-made), not as new
    report.new = len([d for d in plan.new if d not in report.repaired])
    report.changed = len(plan.changed) + len([d for d in plan.new if d in report.repaired])
    report.unchanged = len(plan.unchanged)
    report.removed = len(plan.removed) if prune else 0
    if requests.add_partitions:
        instance.add_dynamic_partitions(documents.name, requests.add_partitions)
    for key in requests.delete_partitions:
        instance.delete_dynamic_partition(documents.name, key)
    runs = requests.run_requests
    # the KNN graph's unchanged inputs read while the documents run (corpus_prefetch), for the corpus update
    touched = {*plan.new, *plan.changed, *plan.removed, *report.repaired}
    read_ahead = corpus_prefetch.reading_ahead(index.corpus_files, vectors, indexed, touched) \
        if corpus and runs else contextlib.nullcontext()
    # one ingest's runs share the vectors of texts embedded in it: the statements repeat the keyword sentences
    with _reporter(progress, len(runs) + int(corpus)) as reporter, stage_progress.reporting(reporter), \
            _joined(preload), reusing_recent_vectors(), read_ahead:
        for request in runs:
            reporter.next_run()
            reporter.start("purging" if request.job_name == "purge_documents" else "reading",
                           int(request.tags["lexgraph/documents"]), "documents")
            result = defs.resolve_job_def(request.job_name).execute_in_process(
                instance=instance, tags={**request.tags, **process_tags()}, run_config=_quiet(request.run_config),
                raise_on_error=False)
            report.runs.append(result.run_id)
            report.failed.update(_failures(result))
            if not result.success:  # a step failed for a reason of its own: its documents say why
                error = run_error(result)
                for doc_id in _run_documents(request, instance):
                    report.failed.setdefault(doc_id, f"{files[doc_id].relative_path if doc_id in files else doc_id}: "
                                                     f"not indexed, {error}")
        report.failed.update({k: v for k, v in plan.invalid.items() if k not in report.failed})
        # damaged and not re-ingestable: indexed as they are, and say so (unless purged just now)
        report.failed.update({k: v for k, v in damaged.items()
                              if k not in report.failed and not (prune and k in plan.removed)})
        catalog = vectors.indexed_hashes()
        corpus_files = index.corpus_files
        # out of step: built from another catalog, never built, or an update failed or was killed
        stale = corpus_files.stale_steps(catalog, settings) if catalog or corpus_files.built_digests() else []
        if corpus and (catalog != indexed or stale):
            reporter.next_run()
            reporter.start("corpus index", 1, "update")
            # the catalog as this ingest left it: only the out-of-step steps that nothing else reads may run alone
            result = run_corpus_steps(defs, instance, solo_steps(stale) if catalog == indexed else None)
            reporter.advance("corpus index", 1)
            report.corpus_run = result.run_id
            report.corpus_index_ok = result.success
            if not result.success:
                report.corpus_error = run_error(result)
        if corpus and report.corpus_index_ok is not False:
            follow_selection(defs, instance, settings, report, reporter)
    return report


def follow_selection(defs: dg.Definitions, instance: dg.DagsterInstance, settings: Settings, report: IngestReport,
                     reporter) -> None:
    """After the corpus update: re-extract the documents with newly selected skeleton chunks (only when an LLM
    is configured; only those chunks call it), then rebuild the lexical graph if its inputs changed."""
    from orchestration.reextraction import REASON_TAG, SELECTION_DIFF_TAG, mark_handled, selection_reextraction

    vectors = defs.resources["lancedb"].get()
    catalog = vectors.indexed_hashes()
    files = LexIndex(settings).corpus_files
    digest, doc_ids = selection_reextraction(settings, catalog)
    ok = True
    if doc_ids:
        runs, failed, ok = run_extractions(defs, instance, doc_ids, {SELECTION_DIFF_TAG: digest,
                                                                     REASON_TAG: "skeleton selection changed"}, reporter)
        report.reextracted, report.extraction_runs = list(doc_ids), runs
        report.failed.update({k: v for k, v in failed.items() if k not in report.failed})
    if digest and ok:
        mark_handled(files, digest)
    if catalog and LEXICAL_GRAPH in files.stale_steps(catalog, settings):
        _more_runs(reporter, 1)
        reporter.next_run()
        result = run_corpus_steps(defs, instance, [LEXICAL_GRAPH])
        report.lexical_run = result.run_id
        if not result.success:
            report.corpus_index_ok = False
            report.corpus_error = run_error(result)


def _more_runs(reporter, n: int) -> None:
    if isinstance(reporter, StageBar):
        reporter.runs += n


def run_extractions(defs: dg.Definitions, instance: dg.DagsterInstance, doc_ids, tags: dict[str, str],
                    reporter=None) -> tuple[list[str], dict[str, str], bool]:
    """extract_documents runs over contiguous ranges of the documents' partitions -> (run ids, failed documents,
    all runs succeeded). Partitions missing from this instance (an ephemeral one) are added first."""
    from orchestration.reextraction import extraction_requests

    reporter = reporter or _NoBar()
    keys = instance.get_dynamic_partitions(documents.name)
    missing = [d for d in doc_ids if d not in keys]
    if missing:
        instance.add_dynamic_partitions(documents.name, missing)
        keys = instance.get_dynamic_partitions(documents.name)
    requests = extraction_requests(keys, doc_ids, "reextract", tags)
    _more_runs(reporter, len(requests))
    runs, failed, ok = [], {}, True
    for request in requests:
        reporter.next_run()
        result = defs.resolve_job_def(request.job_name).execute_in_process(
            instance=instance, tags={**request.tags, **process_tags()}, run_config=_quiet(), raise_on_error=False)
        runs.append(result.run_id)
        failed.update(_failures(result))
        if not result.success:
            ok = False
            error = run_error(result)
            for doc_id in _run_documents(request, instance):
                failed.setdefault(doc_id, f"{doc_id}: not re-extracted, {error}")
    return runs, failed, ok


def run_corpus_steps(defs: dg.Definitions, instance: dg.DagsterInstance,
                     steps: list[str] | None) -> dg.ExecuteInProcessResult:
    """The corpus job: only these of its steps (the others are current), or all of it (None). Its steps that
    write the graph share one writer, closed when the run ends: an open and a close of a 100k-chunk graph cost
    about 0.1 s each (a session per run, not per command: a long ingest must not keep other writers waiting)."""
    graph_path = defs.resources["kuzu"].graph_path()
    with GraphStore.session(graph_path):
        return defs.resolve_job_def("build_corpus_index").execute_in_process(
            instance=instance, tags=process_tags(), run_config=_quiet(), raise_on_error=False,
            asset_selection=[dg.AssetKey(step) for step in steps] if steps else None)


def reextract_index(instance: dg.DagsterInstance, settings: Settings,
                    progress: bool | stage_progress.Reporter = True) -> ReextractReport:
    """Re-run extraction for every indexed document whose extractions no longer match the current extractors
    (a prompt, model, entity-type or rule change; failed LLM calls too), then rebuild the lexical graph: the
    deliberate backfill after such a change. Unchanged chunks are cache hits; only changed keys call the LLM."""
    from orchestration.reextraction import REASON_TAG, changed_extractions

    defs = build_definitions(settings)
    report = ReextractReport()
    fail_abandoned_runs(instance)
    vectors = defs.resources["lancedb"].get()
    catalog = vectors.indexed_hashes()
    report.documents = changed_extractions(settings, catalog)
    with _reporter(progress, 0) as reporter, stage_progress.reporting(reporter):
        if report.documents:
            report.runs, report.failed, _ = run_extractions(defs, instance, sorted(report.documents),
                                                            {REASON_TAG: "extractors changed"}, reporter)
        files = LexIndex(settings).corpus_files
        if catalog and (report.documents or files.stale_steps(catalog, settings)):
            stale = files.stale_steps(catalog, settings)
            _more_runs(reporter, 1)
            reporter.next_run()
            # the lexical graph (and any other step nothing reads) alone, or all of a corpus index that is behind
            result = run_corpus_steps(defs, instance, solo_steps(stale) if stale else [LEXICAL_GRAPH])
            report.lexical_run, report.lexical_ok = result.run_id, result.success
    from lexgraph.ledger import CostLedger

    ledger = CostLedger(settings.ledger_dir).read()
    mine = ledger.filter(pl.col("run_id").is_in(report.runs) & (pl.col("stage") == "extraction"))
    report.cache_hits = int(mine["cache_hit"].sum())
    report.llm_calls = int((~mine["cache_hit"] & (mine["attempts"] > 0)).sum())  # not the breaker's refusals
    return report


def reextract_with_default_instance(**options) -> ReextractReport:
    """As ingest_with_default_instance: $DAGSTER_HOME's instance when set (runs show in `make dev`)."""
    home = os.environ.get("DAGSTER_HOME")
    if home:
        Path(home).mkdir(parents=True, exist_ok=True)
    instance = dg.DagsterInstance.get() if home else dg.DagsterInstance.ephemeral()
    with instance:
        return reextract_index(instance, **options)


def _load_embedder_early(defs: dg.Definitions, files: dict[str, FileState],
                         indexed: dict[str, str]) -> threading.Thread | None:
    """When a file is new or changed, load the embedding model in a thread while the catalog is checked and
    the run starts: onnxruntime reads and builds its session outside the GIL, about a second the first
    document's chunking otherwise waits for (Embedder.shared hands the step the same model). A failure is
    left to the step's own load, which names it."""
    plan = plan_reconcile(files, indexed)
    if all(doc_id in plan.invalid for doc_id in plan.new + plan.changed):
        return None

    def load() -> None:
        with contextlib.suppress(Exception):
            defs.resources["embedder"].get()

    thread = threading.Thread(target=load, name="lexgraph-embedder-load", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _joined(thread: threading.Thread | None):
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


def _run_documents(request: dg.RunRequest, instance: dg.DagsterInstance) -> list[str]:
    """The partition keys a batched ingestion run covers (purge runs name theirs in their config)."""
    start, end = request.tags.get(RANGE_START), request.tags.get(RANGE_END)
    if start is None or end is None:
        return list(((request.run_config or {}).get("ops", {}).get("purge_removed_documents", {})
                     .get("config", {}).get("doc_ids", [])))
    keys = instance.get_dynamic_partitions(documents.name)
    if start not in keys or end not in keys:
        return []
    return keys[keys.index(start): keys.index(end) + 1]


# --- runs left behind by killed processes ------------------------------------------------------------


def process_tags() -> dict[str, str]:
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(),
            PROCESS_START_TAG: _process_start(os.getpid()) or ""}


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the command name in (...) may hold spaces


def _process_alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    now = _process_start(pid)
    return not (started and now and now != started)  # a different start time: the pid was reused


def fail_abandoned_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark failed the runs this runner started on this machine whose process is gone (killed, crashed),
    and free the concurrency slots they held, so no run waits for a dead one. -> their run ids.
    (Runs launched by the daemon are watched by Dagster itself: see run_monitoring in dagster.yaml.)"""
    host = socket.gethostname()
    abandoned = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED)):
        pid = run.tags.get(PID_TAG)
        if run.tags.get(HOST_TAG) != host or not pid or not pid.isdigit():
            continue
        if _process_alive(int(pid), run.tags.get(PROCESS_START_TAG, "")):
            continue
        instance.report_run_failed(run, f"The process that ran this run (pid {pid} on {host}) is gone: it was "
                                        "killed or crashed. Marked failed by the next `lexgraph ingest`.")
        abandoned.append(run.run_id)
    _free_slots_of_finished_runs(instance)
    return abandoned


def _free_slots_of_finished_runs(instance: dg.DagsterInstance) -> None:
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    for run_id in storage.get_concurrency_run_ids():
        run = instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            storage.free_concurrency_slots_for_run(run_id)


# --- reporting -----------------------------------------------------------------------------------------


def run_error(result: dg.ExecuteInProcessResult) -> str:
    """Why a run failed, from its step failures: each step and the innermost cause's message."""
    steps: dict[str, list[str]] = {}  # cause -> steps that failed with it
    run_message = None
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data.error:
            steps.setdefault(_cause(event.step_failure_data.error), []).append(event.step_key)
        elif event.is_run_failure and event.message:
            run_message = event.message
    if steps:
        return "; ".join(f"{', '.join(keys)}: {cause}" for cause, keys in steps.items())
    return run_message or f"run {result.run_id} failed (see the Dagster run log)"


def _cause(error) -> str:
    """The message of the error the step raised, under Dagster's own wrappers. Not the innermost cause: a
    lexgraph error names what the library error it wraps does not (ModelFilesError names the model file
    whose parse failed; the tokenizers package's bare Exception only says where in the file)."""
    while error.cause is not None and (error.cls_name.startswith("Dagster") or error.cls_name == "Failure"):
        error = error.cause
    message = error.message.strip()
    if error.cls_name in ("Failure", "DagsterExecutionStepExecutionError"):
        return re.sub(rf"^[\w.]*{error.cls_name}: ", "", message)
    return re.sub(rf"^[\w.]*\.{error.cls_name}: ", f"{error.cls_name}: ", message)


class _NoBar(stage_progress.Silent):
    def next_run(self) -> None:
        pass


class _Forward:
    """A caller's Reporter, with the runner's run counting ignored."""

    def __init__(self, reporter: stage_progress.Reporter):
        self.reporter = reporter

    def next_run(self) -> None:
        pass

    def start(self, stage: str, total: int, unit: str) -> None:
        self.reporter.start(stage, total, unit)

    def advance(self, stage: str, n: int) -> None:
        self.reporter.advance(stage, n)


class StageBar:
    """One bar on stderr for the stage at hand, e.g. `[2/3] embedding 1,536/3,933 chunks |████  |`; it
    appears with the first stage, so a call with nothing to do prints nothing."""

    def __init__(self, runs: int):
        self.runs, self.run = runs, 0
        self.stage, self.unit, self.total, self.done = "", "", 0, 0
        self.bar: tqdm | None = None

    def next_run(self) -> None:
        self.run += 1

    def start(self, stage: str, total: int, unit: str) -> None:
        self.stage, self.total, self.unit, self.done = stage, total, unit, 0
        if self.bar is None:
            self.bar = tqdm(total=max(total, 1), desc=self._description(), file=sys.stderr, miniters=1,
                            mininterval=0.2, bar_format="{desc} |{bar:20}| {elapsed}", dynamic_ncols=True)
            return
        self.bar.set_description_str(self._description(), refresh=False)
        self.bar.reset(total=max(total, 1))

    def advance(self, stage: str, n: int) -> None:
        if self.bar is None or stage != self.stage:
            return
        self.done += n
        self.bar.set_description_str(self._description(), refresh=False)
        self.bar.update(n)
        if self.done >= self.total:
            # tqdm skips a state drawn within `mininterval` of the last: a stage's end must still show,
            # or a fast stage stays on screen as unfinished (`embedding 202/798`) while the next one runs
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _description(self) -> str:
        prefix = f"[{self.run}/{self.runs}] " if self.runs > 1 else ""
        return f"{prefix}{self.stage} {self.done:,}/{self.total:,} {self.unit}"


@contextlib.contextmanager
def _reporter(progress: bool | stage_progress.Reporter, runs: int):
    if progress is True:
        bar = StageBar(runs)
        try:
            yield bar
        finally:
            bar.close()
    elif progress:
        yield _Forward(progress)
    else:
        yield _NoBar()


def _quiet(run_config: dict | None = None) -> dict:
    """Dagster's console log is silenced (the bar, the report and the CLI speak); the instance still
    records every event."""
    run_config = dict(run_config or {})
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
