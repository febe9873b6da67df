"""Inbox sensor, corpus sensor and nightly schedules.

The inbox sensor finds new, changed and removed files and requests batched runs; the corpus sensor
brings the corpus-wide index up to date with the catalog after any run that changed it (an inbox
run, a UI backfill, `lexgraph ingest`, a purge), since it compares state rather than watching runs.
"""

import json
import time

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from assets.documents import inbox as inbox_asset
from lexgraph.build.corpus_index import LEXICAL_GRAPH, catalog_digest
from lexgraph.ids import short_hash
from lexgraph.inbox import FileState, ReconcilePlan, scan_folder, states_from_json, states_to_json
from orchestration.jobs import build_corpus_index, extract_documents, ingest_documents, purge_documents
from orchestration.partitions import documents
from orchestration.runner import drop_damaged_documents
from orchestration.reconcile import ReconcileRequests, partition_requests, reconcile
from orchestration.reextraction import REASON_TAG, SELECTION_DIFF_TAG, extraction_requests, selection_reextraction
from resources import IndexResource, InboxResource, LanceDBResource

REMOVED = "removed"
CORPUS_STATE_TAG = "lexgraph/corpus_state"
# A failed corpus update is retried, but not on every 30 s tick.
RETRY_FAILED_CORPUS_SECONDS = 300
NAMES_IN_LOG = 10
ACTIVE_RUN_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                       dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def read_cursor(cursor: str | None) -> tuple[dict[str, FileState], dict[str, str]]:
    """(file states of the last scan, doc_id -> content hash or "removed" already requested)."""
    if not cursor:
        return {}, {}
    data = json.loads(cursor)
    if isinstance(data.get("files"), dict) and isinstance(data.get("requested"), dict):
        return states_from_json(data["files"]), dict(data["requested"])
    return states_from_json(data), {}  # a cursor written before requests were remembered


def _names(keys: list[str], files: dict[str, FileState]) -> str:
    names = sorted(files[k].relative_path if k in files else k for k in keys)
    more = f" and {len(names) - NAMES_IN_LOG} more" if len(names) > NAMES_IN_LOG else ""
    return ", ".join(names[:NAMES_IN_LOG]) + more


def describe_tick(plan: ReconcilePlan, fresh: dict[str, str], pending: dict[str, str],
                  files: dict[str, FileState]) -> str:
    """What this tick found that no earlier tick requested; pending work requested before is only counted."""
    if not fresh:
        waiting = f", {len(pending)} requested earlier and not yet done" if pending else ""
        return f"inbox: nothing new ({len(plan.unchanged)} unchanged{waiting})"
    parts = []
    for label, keys in (("new", plan.new), ("changed", plan.changed), ("removed", plan.removed)):
        mine = [k for k in keys if k in fresh]
        if mine:
            parts.append(f"{len(mine)} {label} ({_names(mine, files)})")
    unreadable = [k for k in fresh if k in plan.invalid]
    tail = f"; {len(unreadable)} of them unreadable" if unreadable else ""
    earlier = len(pending) - len(fresh)
    return f"inbox: requesting {', '.join(parts)}{tail}" + (f"; {earlier} requested earlier" if earlier else "")


@dg.sensor(
    jobs=[ingest_documents, purge_documents], minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Compares inbox files (content hash) with the index catalog; adds partitions and requests "
    "batched ingestion for new and changed files, and a purge for removed ones. Logs only what no earlier "
    "tick requested; a changed file is observed at once, so its partition shows unsynced until ingested.",
)
def inbox_sensor(context: dg.SensorEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    previous, requested = read_cursor(context.cursor)
    files = scan_folder(inbox.root(), previous)
    existing = context.instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, lancedb.get().indexed_hashes(), existing, index_dir=lancedb.index.settings().index_dir, log=context.log)
    plan = requests.plan
    pending = {k: files[k].content_hash for k in plan.to_index} | {k: REMOVED for k in plan.removed}
    fresh = {k: v for k, v in pending.items() if requested.get(k) != v}
    context.log.info(describe_tick(plan, fresh, pending, files))
    known = set(existing)
    observations = [dg.AssetObservation(asset_key=inbox_asset.key, partition=k,
                                        tags={DATA_VERSION_TAG: files[k].content_hash},
                                        metadata={"sha256": files[k].content_hash, "path": files[k].relative_path})
                    for k in plan.changed if k in fresh and k in known]
    return dg.SensorResult(
        run_requests=requests.run_requests,
        dynamic_partitions_requests=partition_requests(requests),
        asset_events=observations,
        cursor=json.dumps({"files": states_to_json(files), "requested": pending}),
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
        repaired, _ = drop_damaged_documents(index.extract_store(), vectors, scan_folder(inbox.root()))
        if repaired:
            context.log.warning(f"damaged extract files, documents sent back for re-ingestion: {repaired}")
            return dg.SkipReason(f"{len(repaired)} document(s) with damaged extract files go back for "
                                 "re-ingestion; the corpus index follows")
    context.log.info(f"corpus index out of step with the catalog of {len(indexed)} document(s): {', '.join(stale)}"
                     + (f"; attempt {len(failed) + 1}" if failed else ""))
    # Only the lexical graph behind (documents were re-extracted): run that step alone.
    selection = [dg.AssetKey(LEXICAL_GRAPH)] if stale == [LEXICAL_GRAPH] else None
    if selection:
        state = f"{state}-lexical-{files.lexical_inputs_digest(indexed)[:12]}"
    return dg.RunRequest(run_key=f"{state}-{len(failed)}", job_name=build_corpus_index.name, asset_selection=selection,
                         tags={CORPUS_STATE_TAG: state, "lexgraph/catalog_digest": digest,
                               "lexgraph/stale_steps": ",".join(stale)})


# A skeleton selection change is not an eager trigger on chunk_extractions: skeleton_selection is unpartitioned,
# so Dagster would mark every document partition as updated and re-extract the whole corpus (DESIGN §4).
@dg.sensor(
    job=extract_documents, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="When the corpus job publishes a new skeleton selection diff and an LLM is configured, requests "
    "batched extract_documents runs for exactly the documents with newly selected chunks (only those chunks call "
    "the LLM; the rest are cache hits or heuristic). With the heuristic extractor a selection change needs no "
    "re-extraction. The lexical graph then follows through the corpus sensor.",
)
def reextraction_sensor(context: dg.SensorEvaluationContext, index: IndexResource, lancedb: LanceDBResource):
    settings = index.settings()
    if settings.extractor != "openai":
        return dg.SkipReason("no LLM configured (heuristic extractor): a skeleton selection change re-extracts nothing")
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
