"""The inbox sensor and nightly schedule against a real instance and real stores."""
from lexgraph.settings import Settings
import json

import dagster as dg

from orchestration.definitions import build_definitions
from orchestration.reconcile import contiguous_batches
from orchestration.sensors import inbox_sensor, nightly_ingest, nightly_purge


def _evaluate(defs, instance, cursor=None):
    """evaluate_tick resolves the requests against the sensor's targets, as the daemon does."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources,
                                 repository_def=defs.get_repository_def()) as context:
        return inbox_sensor.evaluate_tick(context)


def _execute(defs, instance, result):
    """Apply the sensor's partition changes and run its requests the way the daemon would."""
    for change in result.dynamic_partitions_requests:
        if isinstance(change, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(change.partitions_def_name, list(change.partition_keys))
        else:
            for key in change.partition_keys:
                instance.delete_dynamic_partition(change.partitions_def_name, key)
    for request in result.run_requests:
        job = defs.resolve_job_def(request.job_name)
        job.execute_in_process(instance=instance, tags=request.tags, run_config=request.run_config,
                               raise_on_error=False)


def test_sensor_requests_new_changed_and_removed(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    first = _evaluate(defs, instance)
    [add] = first.dynamic_partitions_requests
    assert len(add.partition_keys) == 4
    assert len(first.run_requests) == 1 and first.run_requests[0].tags["lexgraph/documents"] == "4"
    _execute(defs, instance, first)

    # Nothing changed: no runs.
    quiet = _evaluate(defs, instance, first.cursor)
    assert quiet.run_requests == [] and quiet.dynamic_partitions_requests == []

    (tiny_corpus / "beta.txt").write_text("Bolt Engines moved to Hamburg.\n")
    (tiny_corpus / "gamma.md").unlink()
    (tiny_corpus / "blank.md").write_text("   \n")
    third = _evaluate(defs, instance, quiet.cursor)
    jobs = sorted(r.job_name for r in third.run_requests)
    assert jobs == ["ingest_documents", "ingest_documents", "purge_documents"]
    purge = next(r for r in third.run_requests if r.job_name == "purge_documents")
    [removed] = purge.run_config["ops"]["purge_removed_documents"]["config"]["doc_ids"]
    assert removed.startswith("gamma.md-")
    kinds = {type(c).__name__: list(c.partition_keys) for c in third.dynamic_partitions_requests}
    assert kinds["DeleteDynamicPartitionsRequest"] == [removed]
    assert [k[:8] for k in kinds["AddDynamicPartitionsRequest"]] == ["blank.md"]
    state = json.loads(third.cursor)
    assert any(s["problem"] and "blank.md" in s["problem"] for s in state.values())
    _execute(defs, instance, third)

    from tests.helpers import stores
    vectors, _ = stores(home)
    catalog = vectors.sources()
    assert sorted(p for p in catalog["relative_path"]) == ["Søren notes: 2024.md", "alpha.md", "beta.txt"]
    assert removed not in instance.get_dynamic_partitions("documents")


def test_same_pending_request_keeps_its_run_key(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    first = _evaluate(defs, instance)
    for change in first.dynamic_partitions_requests:
        instance.add_dynamic_partitions(change.partitions_def_name, list(change.partition_keys))
    again = _evaluate(defs, instance, first.cursor)  # the run has not happened yet
    assert [r.run_key for r in again.run_requests] == [r.run_key for r in first.run_requests]


def _schedule(schedule, defs, instance):
    with dg.build_schedule_context(instance=instance, resources=defs.resources) as context:
        return schedule(context)


def test_nightly_schedules_reconcile(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    assert isinstance(_schedule(nightly_purge, defs, instance), dg.SkipReason)
    [request] = _schedule(nightly_ingest, defs, instance)
    assert len(instance.get_dynamic_partitions("documents")) == 4
    defs.resolve_job_def("ingest_documents").execute_in_process(instance=instance, tags=request.tags)
    (tiny_corpus / "gamma.md").unlink()
    [purge] = _schedule(nightly_purge, defs, instance)
    assert purge.job_name == "purge_documents" and len(instance.get_dynamic_partitions("documents")) == 3
    assert isinstance(_schedule(nightly_ingest, defs, instance), dg.SkipReason)


def test_contiguous_batches_split_around_untargeted_keys():
    keys = ["a", "b", "c", "d", "e", "f"]
    assert contiguous_batches(keys, {"a", "b", "d", "f"}) == [["a", "b"], ["d"], ["f"]]
    assert contiguous_batches(keys, set(keys), max_batch=4) == [["a", "b", "c", "d"], ["e", "f"]]
    assert contiguous_batches(keys, set()) == []
