"""The production instance (orchestration/dagster.prod.yaml) on a real PostgreSQL server.

Two documents of an indexed folder change; the Dagster daemon, run as `make dev-prod` runs it
(`dagster-daemon run`, queued run coordinator, pools, run monitoring, run retries), ticks the inbox sensor,
which requests two ingestion runs; both are launched at once and reach the graph write while the
`kuzu_writer` pool's one slot is taken. Then: the slot passes from run to run (their graph-writing steps never
overlap) and every run's events are all in PostgreSQL (the counts a SQLite instance records for the same runs).

The server comes from the environment (DAGSTER_PG_HOST, DAGSTER_PG_PORT, DAGSTER_PG_USER, DAGSTER_PG_PASSWORD,
DAGSTER_PG_DB; `.ci/run` starts one and sets them). Each module works in a database of its own, created and
dropped here. Without a server the tests skip, except under CI (CI=true), where they fail.
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import GRAPH_WRITER_POOL
from lexgraph.ids import document_id

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent
PROD_YAML = ROOT / "orchestration" / "dagster.prod.yaml"
PG_VARIABLES = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB")
# Events of launching a run (queue, worker process, log capture, pool waits): a run launched by the daemon has
# them and one executed in-process has not. Every other event must be the same in both.
LAUNCH_EVENTS = {"PIPELINE_ENQUEUED", "PIPELINE_DEQUEUED", "PIPELINE_STARTING", "ENGINE_EVENT", "LOGS_CAPTURED"}
HOLDER_RUN, HOLDER_STEP = "test-holds-the-graph-writer-slot", "hold"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str):
    if in_ci():
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason} (`.ci/run` starts one)")


@pytest.fixture(scope="module")
def pg_database():
    """A fresh database on the environment's server; its name, dropped after the module."""
    import psycopg2

    missing = [v for v in PG_VARIABLES if v != "DAGSTER_PG_PASSWORD" and not os.environ.get(v)]
    if missing:
        unavailable(f"{', '.join(missing)} not set")
    connect = dict(host=os.environ["DAGSTER_PG_HOST"], port=int(os.environ["DAGSTER_PG_PORT"]),
                   user=os.environ["DAGSTER_PG_USER"], password=os.environ.get("DAGSTER_PG_PASSWORD", ""),
                   connect_timeout=5)
    try:
        admin = psycopg2.connect(dbname=os.environ["DAGSTER_PG_DB"], **connect)
    except psycopg2.OperationalError as error:
        unavailable(f"cannot connect to {connect['host']}:{connect['port']}: {str(error).strip()}")
    admin.autocommit = True
    name = f"lexgraph_test_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')  # the role needs CREATEDB (.ci/run grants it)
    try:
        yield name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="module")
def prod_home(tmp_path_factory, pg_database) -> Path:
    """A DAGSTER_HOME holding dagster.prod.yaml as `make dev-prod` copies it, pointed at the module's database."""
    home = tmp_path_factory.mktemp("dagster_prod")
    shutil.copy(PROD_YAML, home / "dagster.yaml")
    return home


@pytest.fixture
def prod_env(prod_home, pg_database, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("DAGSTER_PG_DB", pg_database)
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", os.environ.get("DAGSTER_PG_PASSWORD", ""))
    return {**os.environ, "DAGSTER_HOME": str(prod_home)}


def open_instance(dagster_home: Path) -> dg.DagsterInstance:
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))


def test_prod_instance_loads_postgres_queue_pools_monitoring_retries(prod_home, prod_env):
    from dagster._core.instance.config import PoolGranularity
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

    with open_instance(prod_home) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        pools = instance.get_concurrency_config().pool_config
        assert pools.default_pool_limit == 1 and pools.pool_granularity == PoolGranularity.OP
        assert instance.event_log_storage.supports_global_concurrency_limits
        assert instance.run_monitoring_enabled and instance.run_monitoring_settings["max_runtime_seconds"] > 0
        assert instance.run_retries_enabled and instance.run_retries_max_retries >= 1
        assert not instance.run_retries_retry_on_asset_or_op_failure  # only crashed or killed workers


def _counts(instance: dg.DagsterInstance, run_id: str) -> collections.Counter:
    """Events of a run by type (a user log line counts as LOG), launch events left out."""
    kinds = (e.dagster_event.event_type_value if e.dagster_event else "LOG" for e in instance.all_logs(run_id))
    return collections.Counter(k for k in kinds if k not in LAUNCH_EVENTS)


def _step_spans(instance: dg.DagsterInstance, run_id: str, steps: set[str]) -> list[tuple[float, float, str]]:
    """(start, end, run id) of each step in steps, from its STEP_START and STEP_SUCCESS/FAILURE events."""
    starts, spans = {}, []
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if not event or entry.step_key not in steps:
            continue
        if event.event_type == dg.DagsterEventType.STEP_START:
            starts[entry.step_key] = entry.timestamp
        elif event.event_type in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            spans.append((starts.pop(entry.step_key), entry.timestamp, run_id))
    assert not starts, f"steps of run {run_id} started and never ended: {sorted(starts)}"
    return spans


def _blocked(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Has the run reported a step waiting for the graph writer's pool slot?"""
    return any(f"blocked by limit for pool {GRAPH_WRITER_POOL}" in (e.message or "")
               for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT))


def _wait(condition, timeout: float, what: str, daemon: subprocess.Popen, log: Path, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if daemon.poll() is not None:
            pytest.fail(f"dagster-daemon exited ({daemon.returncode}) while waiting for {what}:\n"
                        f"{log.read_text()[-4000:]}")
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; daemon log:\n{log.read_text()[-4000:]}")


def _graph_writer_steps() -> set[str]:
    from orchestration.definitions import build_definitions

    job = build_definitions().resolve_job_def("ingest_documents")
    return {node.name for node in job.graph.nodes if getattr(node.definition, "pool", None) == GRAPH_WRITER_POOL}


@pytest.mark.subprocess
@pytest.mark.ingest
def test_two_runs_at_once_and_a_sensor_tick_through_the_daemon(prod_home, prod_env, tiny_corpus, tmp_path,
                                                                  embedder):
    from orchestration.runner import ingest_folder

    inbox, home, reference_home = tiny_corpus, tmp_path / "index", tmp_path / "reference_index"
    writers = _graph_writer_steps()
    assert writers, "ingest_documents has no step in the kuzu_writer pool"
    with open_instance(prod_home) as instance:
        # The folder indexed once (in-process runs on the PostgreSQL instance, corpus index included) ...
        report = ingest_folder(inbox, instance, home=str(home), progress=False)
        assert report.corpus_index_ok and not report.failed, report.failed
        known_runs = {r.run_id for r in instance.get_runs()}
        # ... then its first and last documents (in partition order) change: the sensor asks for two runs.
        keys = instance.get_dynamic_partitions("documents")
        paths = {document_id(p.relative_to(inbox).as_posix()): p for p in inbox.rglob("*") if p.is_file()}
        for key in (keys[0], keys[-1]):
            with paths[key].open("a", encoding="utf-8") as handle:
                handle.write("\nAn amendment of 2025 extends the term by one year.\n")
        shutil.copytree(home, reference_home)  # the index both sets of runs start from

        # The graph writer's one slot is busy, so both runs reach the graph write while the pool is full.
        claim = instance.event_log_storage.claim_concurrency_slot(GRAPH_WRITER_POOL, HOLDER_RUN, HOLDER_STEP)
        assert claim.is_claimed, claim
        log = tmp_path / "daemon.log"
        env = {**prod_env, "LEXGRAPH_HOME": str(home), "LEXGRAPH_INBOX": str(inbox), "HF_HUB_OFFLINE": "1"}
        with log.open("w") as out:
            daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w",
                                       str(ROOT / "workspace.yaml")], cwd=ROOT, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def sensor_runs():
                runs = [r for r in instance.get_runs() if r.run_id not in known_runs
                        and r.job_name == "ingest_documents"]
                return runs if len(runs) >= 2 else None

            runs = _wait(sensor_runs, 90, "the inbox sensor's two runs", daemon, log)
            assert len(runs) == 2, [r.tags for r in runs]
            _wait(lambda: all(_blocked(instance, r.run_id) for r in runs), 90,
                  "both runs to wait for the graph writer's slot", daemon, log)
            waiting = instance.event_log_storage.get_concurrency_info(GRAPH_WRITER_POOL)
            assert waiting.active_run_ids == {HOLDER_RUN} and {r.run_id for r in runs} <= waiting.pending_run_ids
            instance.event_log_storage.free_concurrency_slot_for_step(HOLDER_RUN, HOLDER_STEP)
            done = _wait(lambda: all(instance.get_run_by_id(r.run_id).is_finished for r in runs) and
                         [instance.get_run_by_id(r.run_id) for r in runs], 90, "both runs to finish", daemon, log)
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)  # the daemon, its code server and any run worker left
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in done), [(r.run_id, r.status) for r in done]

        # Both came from one tick of the inbox sensor, evaluated by the daemon.
        assert {r.tags.get("dagster/sensor_name") for r in runs} == {"inbox_sensor"}
        assert sorted(r.tags["dagster/asset_partition_range_start"] for r in runs) == sorted([keys[0], keys[-1]])
        # The runs overlapped in time, and the pool passed the slot from one to the other: their graph
        # writes never overlap, with the runs of the first ingest either.
        run_spans = []
        for run in runs:
            record = instance.get_run_record_by_id(run.run_id)
            run_spans.append((record.start_time, record.end_time))
        assert max(s for s, _ in run_spans) < min(e for _, e in run_spans), f"the runs did not overlap: {run_spans}"
        # (a corpus update the daemon may have started since is left out: it was stopped mid-way)
        spans = sorted(span for run_id in known_runs | {r.run_id for r in runs}
                       for span in _step_spans(instance, run_id, writers))
        assert len([s for s in spans if s[2] in {r.run_id for r in runs}]) == 2 * len(writers)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            assert end <= start or first == second, f"graph writes of runs {first} and {second} overlap"
        info = instance.event_log_storage.get_concurrency_info(GRAPH_WRITER_POOL)
        assert info.slot_count == 1  # the default limit
        assert not {r.run_id for r in runs} & (info.active_run_ids | info.pending_run_ids)  # nothing left held

        # No event lost: each run's events equal those of the same run on a SQLite instance.
        pg = {r.tags["dagster/asset_partition_range_start"]: _counts(instance, r.run_id) for r in runs}
        pg_sha = _sha256_by_partition(instance)
    reference = _reference_counts(reference_home, inbox, keys, runs)
    for start, counts in pg.items():
        assert counts == reference[start][0], f"run from {start}: PostgreSQL {counts} vs SQLite {reference[start][0]}"
        assert counts["ASSET_MATERIALIZATION"] > 0 and counts["STEP_SUCCESS"] == counts["STEP_START"]
    assert {k: pg_sha[k] for k in (keys[0], keys[-1])} == reference["sha256"]


def _sha256_by_partition(instance: dg.DagsterInstance) -> dict[str, str]:
    """The latest source_document sha256 of each partition."""
    records = instance.fetch_materializations(dg.AssetKey("source_document"), limit=1000).records
    latest = {}
    for record in sorted(records, key=lambda r: r.storage_id):
        materialization = record.asset_materialization
        latest[materialization.partition] = materialization.metadata["sha256"].value
    return latest


def _reference_counts(home: Path, inbox: Path, keys: list[str], runs: list[dg.DagsterRun]) -> dict:
    """The same runs (same partitions, same tags) executed in-process on a SQLite instance from the same index."""
    from lexgraph.settings import Settings
    from orchestration.definitions import build_definitions

    defs = build_definitions(Settings.from_env(home=home, inbox=inbox))
    job = defs.resolve_job_def("ingest_documents")
    copied = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end", "lexgraph/documents")
    reference: dict = {}
    with dg.instance_for_test() as sqlite:
        sqlite.add_dynamic_partitions("documents", keys)
        for run in runs:
            result = job.execute_in_process(instance=sqlite, tags={k: run.tags[k] for k in copied},
                                            raise_on_error=False)
            assert result.success
            reference[run.tags[copied[0]]] = (_counts(sqlite, result.run_id),)
        reference["sha256"] = {k: v for k, v in _sha256_by_partition(sqlite).items() if k in (keys[0], keys[-1])}
    return reference
