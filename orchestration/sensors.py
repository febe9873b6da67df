"""Inbox sensor, corpus sensor and nightly schedules.

The inbox sensor finds new, changed and removed files and requests batched runs; the corpus sensor
brings the corpus-wide index up to date with the catalog after any run that changed it (an inbox
run, a UI backfill, `lexgraph ingest`, a purge), since it compares state rather than watching runs.
"""

import json
import time
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from assets.documents import inbox as inbox_asset
from assets.partitions import documents
from lexgraph.indexing.corpus_state import (GRAPH_TABLES, LEXICAL_GRAPH, SEARCH_INDEXES, catalog_digest, solo_steps,
                                            step_settings)
from lexgraph.ids import short_hash
from lexgraph.inbox import FileState, ReconcilePlan, ScanCache, scan_folder, scan_inbox, states_from_json
from lexgraph.indexing.repair import drop_damaged_documents
from orchestration.jobs import build_corpus_index, extract_documents, ingest_documents, purge_documents
from orchestration.reconcile import ReconcileRequests, reconcile
from orchestration.reextraction import REASON_TAG, SELECTION_DIFF_TAG, extraction_requests, selection_reextraction
from resources import IndexResource, InboxResource, LanceDBResource

REMOVED = "removed"
CORPUS_STATE_TAG = "lexgraph/corpus_state"
# A failed corpus update is retried, but not on every 30 s tick.
RETRY_FAILED_CORPUS_SECONDS = 300
NAMES_IN_LOG = 10
ACTIVE_RUN_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                       dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


# Dagster stops a sensor evaluation after 60 s (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS). A tick reads files
# for at most this long, then requests what it has and leaves the rest to the next tick.
TICK_TIME_BOX_SECONDS = 40.0
CURSOR_VERSION = 2


@dataclass
class InboxCursor:
    """What the inbox sensor carries from tick to tick. Dagster stores the cursor with every tick, so it is
    kept small: a short digest of each (document, content) already requested, and where a tick that ran
    out of time stopped reading. The file states themselves are in the scan cache (lexgraph.inbox.ScanCache)."""
    requested: set[str] = field(default_factory=set)
    resume_after: str | None = None  # relative path of the last file read by a tick cut short
    deferred: int = 0  # files that tick left unread
    legacy_files: dict[str, FileState] = field(default_factory=dict)  # file states of a version-1 cursor

    def to_json(self) -> str:
        return json.dumps({"v": CURSOR_VERSION, "requested": sorted(self.requested),
                           "resume_after": self.resume_after, "deferred": self.deferred}, separators=(",", ":"))


def requested_digest(doc_id: str, value: str) -> str:
    """A request for a document at some content (or its removal), in 12 hex digits."""
    return short_hash(f"{doc_id}\x00{value}", 12)


def read_cursor(cursor: str | None) -> InboxCursor:
    if not cursor:
        return InboxCursor()
    data = json.loads(cursor)
    if data.get("v") == CURSOR_VERSION:
        return InboxCursor(set(data.get("requested", [])), data.get("resume_after"), int(data.get("deferred", 0)))
    # version 1: {"files": states, "requested": {doc_id: hash}}, or the bare states before that
    if isinstance(data.get("files"), dict) and isinstance(data.get("requested"), dict):
        requested = {requested_digest(k, v) for k, v in data["requested"].items()}
        return InboxCursor(requested, legacy_files=states_from_json(data["files"]))
    return InboxCursor(legacy_files=states_from_json(data))


def _names(keys: list[str], files: dict[str, FileState]) -> str:
    names = sorted(files[k].relative_path if k in files else k for k in keys)
    more = f" and {len(names) - NAMES_IN_LOG} more" if len(names) > NAMES_IN_LOG else ""
    return ", ".join(names[:NAMES_IN_LOG]) + more


def describe_tick(plan: ReconcilePlan, fresh: dict[str, str], pending: dict[str, str],
                  files: dict[str, FileState]) -> str:
    """What this tick found that no earlier tick requested; pending work requested before is only counted."""
    later = (f"; {len(plan.deferred)} file(s) not read yet (time box reached), the next tick goes on"
             if plan.deferred else "")
    if not fresh:
        waiting = f", {len(pending)} requested earlier and not yet done" if pending else ""
        return f"inbox: nothing new ({len(plan.unchanged)} unchanged{waiting}){later}"
    parts = []
    for label, keys in (("new", plan.new), ("changed", plan.changed), ("removed", plan.removed)):
        mine = [k for k in keys if k in fresh]
        if mine:
            parts.append(f"{len(mine)} {label} ({_names(mine, files)})")
    unreadable = [k for k in fresh if k in plan.invalid]
    tail = f"; {len(unreadable)} of them unreadable" if unreadable else ""
    earlier = len(pending) - len(fresh)
    return (f"inbox: requesting {', '.join(parts)}{tail}" + (f"; {earlier} requested earlier" if earlier else "")
            + later)


def add_partitions(instance: dg.DagsterInstance, keys: list[str]) -> None:
    """All new document partitions in one insert. (Returned as an AddDynamicPartitionsRequest instead, the
    sensor daemon would first check each key with a query of its own: 32 s for 10,000 keys on SQLite.)"""
    if keys:
        instance.add_dynamic_partitions(documents.name, keys)


@dg.sensor(
    jobs=[ingest_documents, purge_documents], minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Compares inbox files (content hash) with the index catalog; adds partitions and requests "
    "batched ingestion for new and changed files, and a purge for removed ones. Logs only what no earlier "
    "tick requested; a changed file is observed at once, so its partition shows unsynced until ingested. "
    "Only files whose size or mtime changed are read; a tick reads for at most 40 s and the next goes on.",
)
def inbox_sensor(context: dg.SensorEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    cursor = read_cursor(context.cursor)
    root = inbox.root()
    index_dir = lancedb.index.settings().index_dir
    cache = ScanCache(index_dir, root)
    previous = cache.load() or cursor.legacy_files
    scan = scan_inbox(root, previous, time_box=TICK_TIME_BOX_SECONDS,
                      resume_after=cursor.resume_after if cursor.deferred else None)
    files = scan.states
    try:
        cache.save(files)
    except OSError as error:  # only costs re-reading next tick
        context.log.warning(f"inbox: the scan cache {cache.path} could not be written ({error})")
    existing = context.instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, lancedb.get().indexed_hashes(), existing, index_dir=index_dir, log=context.log,
                         deferred=scan.deferred.values())
    plan = requests.plan
    add_partitions(context.instance, requests.add_partitions)
    pending = {k: files[k].content_hash for k in plan.to_index} | {k: REMOVED for k in plan.removed}
    digests = {k: requested_digest(k, v) for k, v in pending.items()}
    fresh = {k: v for k, v in pending.items() if digests[k] not in cursor.requested}
    context.log.info(describe_tick(plan, fresh, pending, files))
    known = set(existing)
    observations = [dg.AssetObservation(asset_key=inbox_asset.key, partition=k,
                                        tags={DATA_VERSION_TAG: files[k].content_hash},
                                        metadata={"sha256": files[k].content_hash, "path": files[k].relative_path})
                    for k in plan.changed if k in fresh and k in known]
    # a tick cut short keeps what earlier ticks requested of the files it did not reach
    requested = set(digests.values()) | (cursor.requested if scan.deferred else set())
    deletes = [documents.build_delete_request(requests.delete_partitions)] if requests.delete_partitions else []
    return dg.SensorResult(
        run_requests=requests.run_requests,
        dynamic_partitions_requests=deletes,
        asset_events=observations,
        cursor=InboxCursor(requested, scan.last_read if scan.deferred else None, len(scan.deferred)).to_json(),
    )


def _scheduled_reconcile(context: dg.ScheduleEvaluationContext, inbox: InboxResource,
                         lancedb: LanceDBResource) -> ReconcileRequests:
    """A full re-hash of the inbox (no cursor), as the nightly safety net behind the sensor."""
    existing = context.instance.get_dynamic_partitions(documents.name)
    return reconcile(scan_folder(inbox.root()), lancedb.get().indexed_hashes(), existing, index_dir=lancedb.index.settings().index_dir)


# A schedule launches only its own job, so removal and ingestion are two schedules on one reconcile.
@dg.schedule(
    cron_schedule="50 1 * * *", job_name="purge_documents", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly: purge documents whose files left the inbox and drop their partitions.",
)
def nightly_purge(context: dg.ScheduleEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    requests = _scheduled_reconcile(context, inbox, lancedb)
    for key in requests.delete_partitions:
        context.instance.delete_dynamic_partition(documents.name, key)
    return [requests.purge_run] if requests.purge_run else dg.SkipReason("no document was removed")


@dg.schedule(
    cron_schedule="0 2 * * *", job_name="ingest_documents", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly: ingest new and changed inbox files in batched runs (full re-hash).",
)
def nightly_ingest(context: dg.ScheduleEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    requests = _scheduled_reconcile(context, inbox, lancedb)
    if requests.add_partitions:
        context.instance.add_dynamic_partitions(documents.name, requests.add_partitions)
    return requests.ingest_runs or dg.SkipReason("no new or changed document")


# The corpus assets are unpartitioned and downstream of every document, so an eager condition would
# fire on each partition. The sensor instead compares the corpus state with the catalog every tick, so
# it follows any run that changed the catalog, whoever launched it, and converges after a failure.
@dg.sensor(
    job=build_corpus_index, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every tick, compares the catalog digest each corpus asset was built from with the current "
    "catalog; when any is out of step and no corpus run is queued or running, requests build_corpus_index. "
    "Follows sensor runs, UI backfills, `lexgraph ingest` and purges alike; a failed update is retried every "
    "5 minutes, after documents with damaged extract files are sent back for re-ingestion.",
)
def corpus_index_sensor(context: dg.SensorEvaluationContext, index: IndexResource, lancedb: LanceDBResource,
                        inbox: InboxResource):
    vectors = lancedb.get()
    indexed = vectors.indexed_hashes()
    files = index.corpus_files()
    stale = files.stale_steps(indexed, index.settings())
    if not stale:
        return dg.SkipReason(f"corpus index is current (built from the catalog of {len(indexed)} document(s))")
    if not indexed and not files.built_digests():
        return dg.SkipReason("nothing is indexed yet and no corpus index was ever built")
    active = context.instance.get_runs(dg.RunsFilter(job_name=build_corpus_index.name, statuses=ACTIVE_RUN_STATUSES),
                                       limit=1)
    if active:
        return dg.SkipReason(f"corpus index out of step ({', '.join(stale)}); waiting for corpus run "
                             f"{active[0].run_id} to finish")
    digest = catalog_digest(indexed)
    # the same catalog and corpus state give the same key, so one state is requested once, unless it failed
    state = f"{digest[:16]}-{short_hash(json.dumps(files.built_digests(), sort_keys=True), 8)}"
    failed = context.instance.get_runs(dg.RunsFilter(job_name=build_corpus_index.name, statuses=[
        dg.DagsterRunStatus.FAILURE], tags={CORPUS_STATE_TAG: state}))
    if failed:
        last = context.instance.get_run_record_by_id(failed[0].run_id)
        wait = RETRY_FAILED_CORPUS_SECONDS - (time.time() - (last.end_time or last.create_timestamp.timestamp()))
        if wait > 0:
            return dg.SkipReason(f"the corpus run for this catalog failed (run {failed[0].run_id}); "
                                 f"retrying in {wait:.0f}s")
        # a damaged extract file fails every retry: send its document back to the inbox sensor first
        repaired, _ = drop_damaged_documents(index.extract_store(), vectors, scan_folder(
            inbox.root(), ScanCache(index.settings().index_dir, inbox.root()).load()), indexed)
        if repaired:
            context.log.warning(f"damaged extract files, documents sent back for re-ingestion: {repaired}")
            return dg.SkipReason(f"{len(repaired)} document(s) with damaged extract files go back for "
                                 "re-ingestion; the corpus index follows")
    context.log.info(f"corpus index out of step with the catalog of {len(indexed)} document(s): {', '.join(stale)}"
                     + (f"; attempt {len(failed) + 1}" if failed else ""))
    # Only steps nothing else reads are behind (documents were re-extracted, a search setting changed): run them alone.
    solo = solo_steps(stale)
    selection = [dg.AssetKey(step) for step in solo] if solo else None
    if solo and LEXICAL_GRAPH in solo:
        state = f"{state}-lexical-{files.lexical_inputs_digest(indexed)[:12]}"
    if solo and SEARCH_INDEXES in solo:  # the settings asked for, so that a changed setting is a new request
        state = f"{state}-search-{short_hash(step_settings(SEARCH_INDEXES, index.settings()), 8)}"
    if solo and GRAPH_TABLES in solo:  # the lexical graph and settings the tables are to be written from
        graph = f"{files.recorded_lexical_inputs()}|{step_settings(GRAPH_TABLES, index.settings())}"
        state = f"{state}-graph-{short_hash(graph, 8)}"
    return dg.RunRequest(run_key=f"{state}-{len(failed)}", job_name=build_corpus_index.name, asset_selection=selection,
                         tags={CORPUS_STATE_TAG: state, "lexgraph/catalog_digest": digest,
                               "lexgraph/stale_steps": ",".join(stale)})


# A skeleton selection change is not an eager trigger on chunk_extractions: skeleton_selection is unpartitioned,
# so Dagster would mark every document partition as updated and re-extract the whole corpus (DESIGN §4).
@dg.sensor(
    job=extract_documents, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="When the corpus job publishes a new skeleton selection diff and an LLM is configured, requests "
    "batched extract_documents runs for exactly the documents with newly selected chunks (only those chunks call "
    "the LLM; the rest are cache hits or offline). With the offline NLP extractor a selection change needs no "
    "re-extraction. The lexical graph then follows through the corpus sensor.",
)
def reextraction_sensor(context: dg.SensorEvaluationContext, index: IndexResource, lancedb: LanceDBResource):
    settings = index.settings()
    if settings.extractor != "openai":
        return dg.SkipReason("no LLM configured (offline NLP extractor): a skeleton selection change re-extracts nothing")
    digest, doc_ids = selection_reextraction(settings, lancedb.get().indexed_hashes())
    if digest is None:
        return dg.SkipReason("no skeleton selection published yet")
    if context.cursor == digest or not doc_ids:
        return dg.SkipReason(f"selection diff {digest} needs no more re-extraction")
    keys = context.instance.get_dynamic_partitions(documents.name)
    requests = extraction_requests(keys, [d for d in doc_ids if d in keys], f"reextract-{digest}",
                                   {SELECTION_DIFF_TAG: digest, REASON_TAG: "skeleton selection changed"})
    context.log.info(f"skeleton selection diff {digest}: re-extracting {len(doc_ids)} document(s) in "
                     f"{len(requests)} run(s)")
    return dg.SensorResult(run_requests=requests, cursor=digest)
