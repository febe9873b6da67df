"""Inbox sensor and nightly schedule: find new, changed and removed files and request batched runs."""

import json

import dagster as dg

from lexgraph.inbox import scan_folder, states_from_json, states_to_json
from orchestration.partitions import documents
from orchestration.reconcile import partition_requests, reconcile
from resources import InboxResource, LanceDBResource


def _indexed_hashes(lancedb: LanceDBResource) -> dict[str, str]:
    catalog = lancedb.get().sources()
    return dict(zip(catalog["doc_id"].to_list(), catalog["content_hash"].to_list()))


@dg.sensor(
    minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Compares inbox files (content hash) with the index catalog; adds partitions and requests "
    "batched ingestion for new and changed files, and a purge for removed ones.",
)
def inbox_sensor(context: dg.SensorEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    previous = states_from_json(json.loads(context.cursor)) if context.cursor else {}
    files = scan_folder(inbox.root(), previous)
    existing = context.instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, _indexed_hashes(lancedb), existing)
    plan = requests.plan
    context.log.info(f"inbox: {len(plan.new)} new, {len(plan.changed)} changed, {len(plan.removed)} removed, "
                     f"{len(plan.invalid)} unreadable, {len(plan.unchanged)} unchanged")
    return dg.SensorResult(
        run_requests=requests.run_requests,
        dynamic_partitions_requests=partition_requests(requests),
        cursor=json.dumps(states_to_json(files)),
    )


@dg.schedule(
    cron_schedule="0 2 * * *", job_name="ingest_documents", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly full reconcile of the inbox against the index (re-hashes every file).",
)
def nightly_reconcile(context: dg.ScheduleEvaluationContext, inbox: InboxResource, lancedb: LanceDBResource):
    files = scan_folder(inbox.root())
    existing = context.instance.get_dynamic_partitions(documents.name)
    requests = reconcile(files, _indexed_hashes(lancedb), existing)
    if requests.add_partitions:
        context.instance.add_dynamic_partitions(documents.name, requests.add_partitions)
    for key in requests.delete_partitions:
        context.instance.delete_dynamic_partition(documents.name, key)
    return requests.run_requests or dg.SkipReason("inbox and index agree")
