"""The inbox and corpus sensors and the nightly schedules against a real instance and real stores."""
import hashlib

import dagster as dg
import polars as pl
import pytest

from lexgraph.indexing.corpus_state import CorpusFiles, catalog_digest
from lexgraph.inbox import ScanCache
from lexgraph.settings import Settings
from orchestration.definitions import build_definitions
from orchestration.reconcile import contiguous_batches
from orchestration.runner import ingest_folder
from orchestration.sensors import corpus_index_sensor, inbox_sensor, nightly_ingest, nightly_purge
from tests.helpers import LogLines, graph_counts, stores


@pytest.fixture
def instance(sqlite_instance):
    """Sensors and schedules tick in the daemon, on a persistent instance: these tests use one too."""
    return sqlite_instance


def _evaluate(defs, instance, cursor=None, sensor=inbox_sensor, lines=None):
    """evaluate_tick resolves the requests against the sensor's targets, as the daemon does."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources,
                                 repository_def=defs.get_repository_def()) as context:
        if lines is not None:
            context.log.addHandler(lines)
        return sensor.evaluate_tick(context)


def _execute(defs, instance, result):
    """Apply the sensor's partition changes and run its requests the way the daemon would."""
    for change in result.dynamic_partitions_requests:
        if isinstance(change, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(change.partitions_def_name, list(change.partition_keys))
        else:
            for key in change.partition_keys:
                instance.delete_dynamic_partition(change.partitions_def_name, key)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    for request in result.run_requests:
        job = defs.resolve_job_def(request.job_name)
        job.execute_in_process(instance=instance, tags=request.tags, run_config=request.run_config,
                               raise_on_error=False)


def test_sensor_requests_new_changed_and_removed(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    first = _evaluate(defs, instance)
    # the new partitions are added by the tick itself, in one insert: no request left for the daemon
    assert first.dynamic_partitions_requests == [] and len(instance.get_dynamic_partitions("documents")) == 4
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
    [delete] = third.dynamic_partitions_requests
    assert isinstance(delete, dg.DeleteDynamicPartitionsRequest) and list(delete.partition_keys) == [removed]
    assert [k[:8] for k in instance.get_dynamic_partitions("documents")[4:]] == ["blank.md"]
    state = ScanCache(defs.resources["index"].settings().index_dir, tiny_corpus).load()
    assert any(s.problem and "blank.md" in s.problem for s in state.values())
    assert len(third.cursor) < 400, "the cursor holds digests and a position, not file states"
    _execute(defs, instance, third)

    vectors, _ = stores(home)
    catalog = vectors.sources()
    assert sorted(p for p in catalog["relative_path"]) == ["Søren notes: 2024.md", "alpha.md", "beta.txt"]
    assert removed not in instance.get_dynamic_partitions("documents")


def test_same_pending_request_keeps_its_run_key(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    first = _evaluate(defs, instance)
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


def test_inbox_sensor_logs_only_work_no_earlier_tick_requested(tiny_corpus, home, instance):
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    lines = LogLines()
    first = _evaluate(defs, instance, lines=lines)
    assert lines.lines[-1].startswith("inbox: requesting 4 new (") and "alpha.md" in lines.lines[-1]
    pending = _evaluate(defs, instance, first.cursor, lines=lines)  # requested, not run yet
    assert lines.lines[-1] == "inbox: nothing new (0 unchanged, 4 requested earlier and not yet done)"
    assert [r.run_key for r in pending.run_requests] == [r.run_key for r in first.run_requests]
    _execute(defs, instance, pending)
    quiet = _evaluate(defs, instance, pending.cursor, lines=lines)
    assert lines.lines[-1] == "inbox: nothing new (4 unchanged)" and quiet.asset_events == []

    # A changed file is logged once, and observed at once: its partition is unsynced until ingested.
    (tiny_corpus / "beta.txt").write_text("Bolt Engines moved to Hamburg.\n")
    changed = _evaluate(defs, instance, quiet.cursor, lines=lines)
    assert lines.lines[-1] == "inbox: requesting 1 changed (beta.txt)"
    [observation] = changed.asset_events
    assert observation.asset_key == dg.AssetKey("inbox") and observation.partition.startswith("beta.txt-")
    assert observation.tags["dagster/data_version"] == hashlib.sha256(b"Bolt Engines moved to Hamburg.\n").hexdigest()
    again = _evaluate(defs, instance, changed.cursor, lines=lines)
    assert lines.lines[-1] == "inbox: nothing new (3 unchanged, 1 requested earlier and not yet done)"
    assert again.asset_events == []


def _corpus_tick(defs, instance):
    return _evaluate(defs, instance, sensor=corpus_index_sensor)


def _run_corpus(defs, instance, request):
    result = defs.resolve_job_def("build_corpus_index").execute_in_process(
        instance=instance, tags={**request.tags, "dagster/run_key": request.run_key})
    assert result.success


def test_corpus_sensor_follows_every_change_of_the_catalog(tiny_corpus, home, instance):
    settings = Settings.from_env(home=home, inbox=tiny_corpus)
    defs = build_definitions(settings)
    assert _corpus_tick(defs, instance).skip_message.startswith("nothing is indexed yet")
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)  # e.g. a UI backfill
    vectors, _ = stores(home)
    [request] = _corpus_tick(defs, instance).run_requests
    assert request.job_name == "build_corpus_index"
    assert request.tags["lexgraph/catalog_digest"] == catalog_digest(vectors.indexed_hashes())

    # A corpus run already in progress: no second one.
    running = instance.create_run_for_job(defs.resolve_job_def("build_corpus_index"),
                                          status=dg.DagsterRunStatus.STARTED)
    assert f"waiting for corpus run {running.run_id}" in _corpus_tick(defs, instance).skip_message
    instance.report_run_canceled(running)

    _run_corpus(defs, instance, request)
    files = CorpusFiles(settings.index_dir)
    assert files.built_digests() == dict.fromkeys(files.stale_steps({}, settings), request.tags["lexgraph/catalog_digest"])
    assert _corpus_tick(defs, instance).skip_message.startswith("corpus index is current")

    # A purge changes the catalog: the corpus follows.
    (tiny_corpus / "gamma.md").unlink()
    ingest_folder(tiny_corpus, instance, home=str(home), prune=True, progress=False, corpus=False)
    [after_purge] = _corpus_tick(defs, instance).run_requests
    assert after_purge.tags["lexgraph/catalog_digest"] == catalog_digest(vectors.indexed_hashes())
    assert after_purge.run_key != request.run_key
    _run_corpus(defs, instance, after_purge)
    assert _corpus_tick(defs, instance).skip_message.startswith("corpus index is current")

    # Every document purged: the corpus state is cleared and records the empty catalog.
    for path in list(tiny_corpus.iterdir()):
        path.unlink()
    ingest_folder(tiny_corpus, instance, home=str(home), prune=True, progress=False, corpus=False)
    [emptied] = _corpus_tick(defs, instance).run_requests
    assert emptied.tags["lexgraph/catalog_digest"] == catalog_digest({})
    _run_corpus(defs, instance, emptied)
    assert files.stale_steps({}, settings) == []
    assert graph_counts(home, ("Chunk", "SIMILAR", "Keyword", "KEYWORD_IN")) == dict.fromkeys(
        ("Chunk", "SIMILAR", "Keyword", "KEYWORD_IN"), 0)
    assert pl.read_ipc(files.keyword_index).height == 0 and pl.read_parquet(files.edges).height == 0
    assert _corpus_tick(defs, instance).skip_message.startswith("corpus index is current")


def test_corpus_sensor_retries_a_failed_run_later_and_repairs_damaged_extracts(tiny_corpus, home, instance,
                                                                               monkeypatch):
    from orchestration import sensors

    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    [request] = _corpus_tick(defs, instance).run_requests
    failed = instance.create_run_for_job(defs.resolve_job_def("build_corpus_index"),
                                         status=dg.DagsterRunStatus.FAILURE, tags=request.tags)
    message = _corpus_tick(defs, instance).skip_message
    assert "failed" in message and failed.run_id in message and "retrying in" in message

    # Past the wait it is retried, under a new run key (the daemon would drop a repeated one).
    monkeypatch.setattr(sensors, "RETRY_FAILED_CORPUS_SECONDS", 0)
    [retry] = _corpus_tick(defs, instance).run_requests
    assert retry.run_key != request.run_key and retry.tags["lexgraph/corpus_state"] == request.tags["lexgraph/corpus_state"]

    # A damaged extract file fails every retry: its document goes back to the inbox sensor instead.
    vectors, settings = stores(home)
    damaged = next(iter(sorted(vectors.indexed_hashes())))
    path = settings.extract_dir / "keywords" / f"{damaged}.parquet"
    path.write_bytes(path.read_bytes()[:40])
    message = _corpus_tick(defs, instance).skip_message
    assert "damaged extract files" in message and damaged not in vectors.indexed_hashes()
    inbox_tick = _evaluate(defs, instance)
    assert any(damaged in (r.tags.get("dagster/asset_partition_range_start"), r.tags.get("dagster/asset_partition_range_end"))
               for r in inbox_tick.run_requests)


def test_reloading_an_unchanged_document_makes_the_corpus_index_run_again(tiny_corpus, home, instance):
    """A forced re-run (UI backfill) of byte-identical files deletes their chunks' SIMILAR edges with the
    chunks; the catalog digest is unchanged, but the corpus must still be rebuilt."""
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    before = graph_counts(home, ("SIMILAR", "KEYWORD_IN"))
    assert before["SIMILAR"] > 0 and _corpus_tick(defs, instance).skip_message.startswith("corpus index is current")
    keys = instance.get_dynamic_partitions("documents")
    defs.resolve_job_def("ingest_documents").execute_in_process(
        instance=instance, tags={"dagster/asset_partition_range_start": keys[0],
                                 "dagster/asset_partition_range_end": keys[-1]})
    assert graph_counts(home, ("SIMILAR",))["SIMILAR"] < before["SIMILAR"]
    [request] = _corpus_tick(defs, instance).run_requests
    _run_corpus(defs, instance, request)
    assert graph_counts(home, ("SIMILAR", "KEYWORD_IN")) == before
