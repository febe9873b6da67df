"""Inbox sensor and nightly schedule: find new, changed and removed files and request batched runs."""

import json

import dagster as dg

from lexgraph.inbox import scan_folder, states_from_json, states_to_json
from orchestration.jobs import build_corpus_index, ingest_documents, purge_documents
from orchestration.partitions import documents
from orchestration.reconcile import ReconcileRequests, partition_requests, reconcile
from resources import InboxResource, LanceDBResource


@dg.sensor(
    jobs=[ingest_documents, purge_documents], minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Compares inbox files (content hash) with the index catalog; adds partitions and requests "
    "batched ingestion for new and changed files, and a purge for removed ones.",
)
def inbox_sensor(context: dg.SensorEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    previous = states_from_json(json.loads(context.cursor)) if context.cursor else {}
    files = scan_folder(inbox.root(), previous)
    existing = context.instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, lancedb.get().indexed_hashes(), existing, index_dir=lancedb.index.settings().index_dir, log=context.log)
    plan = requests.plan
    context.log.info(f"inbox: {len(plan.new)} new, {len(plan.changed)} changed, {len(plan.removed)} removed, "
                     f"{len(plan.invalid)} unreadable, {len(plan.unchanged)} unchanged")
    return dg.SensorResult(
        run_requests=requests.run_requests,
        dynamic_partitions_requests=partition_requests(requests),
        cursor=json.dumps(states_to_json(files)),
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
# fire on each partition; one update per successful ingest or purge run is what is wanted.
@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS, monitored_jobs=[ingest_documents, purge_documents],
    request_job=build_corpus_index, default_status=dg.DefaultSensorStatus.RUNNING,
    description="After documents are ingested or purged, update the KNN graph, PageRank, skeleton and keyword index.",
)
def corpus_index_after_ingest(context: dg.RunStatusSensorContext):
    return dg.RunRequest(run_key=f"corpus-after-{context.dagster_run.run_id}")
