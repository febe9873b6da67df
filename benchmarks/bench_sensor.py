"""The inbox sensor at 10,000 files: one real evaluation of inbox_sensor against a real, temporary SQLite
Dagster instance and a real (empty) index, for the first tick (every file new), a tick with nothing
changed, and a tick after 100 files were edited.

Dagster ends a sensor evaluation after 60 s. The ingestion runs are not executed: after the first tick
the catalog is filled with the documents' content hashes as if the requested runs had finished, so the
second tick meets 10,000 indexed, unchanged files (the steady state), not 10,000 pending ones.

--daemon N instead drives Dagster's own sensor daemon (code server over gRPC, queued run coordinator,
nothing launched) for one first tick over N files, to time what the daemon does after the evaluation:
adding the partitions and creating the runs.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg
import polars as pl

WORDS = ("harbour contract engine board delivery arbitration shipping plant supplier invoice audit "
         "schedule vessel cargo insurance claim").split()


def build_inbox(folder: Path, count: int, per_folder: int = 100) -> list[Path]:
    """count small Markdown files (about 300 bytes) in folders of per_folder."""
    paths = []
    for i in range(count):
        path = folder / f"team-{i // per_folder:03d}" / f"note-{i:05d}.md"
        if i % per_folder == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        words = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(30))
        path.write_text(f"# Note {i}\n\nMeeting note {i} of the synthetic inbox: {words}.\n\n"
                        f"Follow-up owner: person {i % 97}; due in week {i % 52}.\n")
        paths.append(path)
    return paths


def edit(paths: list[Path], tag: str) -> None:
    for path in paths:
        with path.open("a") as handle:
            handle.write(f"\nEdited ({tag}).\n")


class Bench:
    """One index home and one instance; ticks evaluated the way tests/test_sensor.py does."""

    def __init__(self, inbox: Path, home: Path, instance: dg.DagsterInstance):
        from lexgraph.settings import Settings
        from orchestration.definitions import build_definitions

        self.inbox, self.instance = inbox, instance
        self.defs = build_definitions(Settings.from_env(home=home, inbox=inbox))
        self.cursor: str | None = None
        self.last = None

    def tick(self) -> float:
        from orchestration.sensors import inbox_sensor

        with dg.build_sensor_context(instance=self.instance, cursor=self.cursor, resources=self.defs.resources,
                                     repository_def=self.defs.get_repository_def()) as context:
            start = time.perf_counter()
            result = inbox_sensor.evaluate_tick(context)
            elapsed = time.perf_counter() - start
        for change in result.dynamic_partitions_requests:  # deletions only; none here
            raise SystemExit(f"unexpected partition request {change}")
        self.cursor, self.last = result.cursor, result
        return elapsed

    def mark_indexed(self, paths: list[Path]) -> None:
        """Write catalog rows for these files, as their ingestion runs would have (nothing is embedded)."""
        from lexgraph.ids import content_hash, document_id

        rows = []
        now = datetime.now(timezone.utc)
        for path in paths:
            relative = path.relative_to(self.inbox).as_posix()
            raw = path.read_bytes()
            rows.append({"doc_id": document_id(relative), "uri": str(path), "relative_path": relative,
                         "title": path.stem, "format": "markdown", "content_hash": content_hash(raw),
                         "size_bytes": len(raw), "chunk_count": 1, "ingested_at": now})
        self.defs.resources["lancedb"].get().upsert_sources(pl.DataFrame(rows))


def temp_instance(folder: Path, overrides: dict | None = None):
    """A real SQLite instance (runs, events, schedules) in its own folder."""
    folder.mkdir(parents=True, exist_ok=True)
    return dg.instance_for_test(temp_dir=str(folder), overrides=overrides)


def quiet_logs() -> None:
    """The sensor logs one line per tick through Dagster's console logger; the figures are the output."""
    logging.getLogger("dagster").setLevel(logging.WARNING)


def per_key_check(instance: dg.DagsterInstance, keys: list[str]) -> float:
    """What the sensor daemon does with an AddDynamicPartitionsRequest before its one insert: a
    has_dynamic_partition query per key (dagster/_daemon/sensor.py: _handle_dynamic_partitions_requests)."""
    start = time.perf_counter()
    for key in keys:
        instance.has_dynamic_partition("documents", key)
    return time.perf_counter() - start


def run_ticks(args) -> None:
    from lexgraph.inbox import SCAN_CACHE_FILE
    from orchestration import sensors

    work = Path(tempfile.mkdtemp(prefix="lexgraph-bench-sensor-"))
    inbox = work / "inbox"
    start = time.perf_counter()
    paths = build_inbox(inbox, args.files)
    print(f"inbox: {args.files} files of about {paths[0].stat().st_size} bytes in {len(list(inbox.iterdir()))} "
          f"folders ({time.perf_counter() - start:.1f} s to write)", flush=True)
    firsts, unchanged, changed = [], [], []
    try:
        for repeat in range(args.repeats):  # a first tick needs an empty index and instance each time
            with temp_instance(work / f"dagster-{repeat}") as instance:
                bench = Bench(inbox, work / f"index-{repeat}", instance)
                firsts.append(bench.tick())
                keys = instance.get_dynamic_partitions("documents")
                requests = bench.last.run_requests
                print(f"  first tick {repeat + 1}: {firsts[-1]:.2f} s, {len(keys)} partitions, "
                      f"{len(requests)} runs requested, cursor {len(bench.cursor) / 1024:.0f} KiB", flush=True)
                if len(keys) != args.files or sum(int(r.tags["lexgraph/documents"]) for r in requests) != args.files:
                    raise SystemExit("the first tick did not request every file")
                if repeat < args.repeats - 1:
                    continue
                check = per_key_check(instance, keys) if args.per_key_check else None
                bench.mark_indexed(paths)
                for _ in range(args.repeats):
                    unchanged.append(bench.tick())
                    if bench.last.run_requests:
                        raise SystemExit("an unchanged inbox requested runs")
                cache = (bench.defs.resources["index"].settings().index_dir / SCAN_CACHE_FILE).stat().st_size
                print(f"  unchanged ticks: {', '.join(f'{t:.2f}' for t in unchanged)} s; "
                      f"cursor {len(bench.cursor)} bytes, scan cache {cache / 1024 / 1024:.1f} MiB", flush=True)
                for round_ in range(args.repeats):
                    edited = paths[round_ * args.changed:(round_ + 1) * args.changed]
                    edit(edited, f"round {round_}")
                    changed.append(bench.tick())
                    documents = sum(int(r.tags["lexgraph/documents"]) for r in bench.last.run_requests)
                    if documents != len(edited) or len(bench.last.asset_events) != len(edited):
                        raise SystemExit(f"{len(edited)} edited files gave runs for {documents} documents")
                    bench.mark_indexed(edited)
                print(f"  {args.changed} changed ticks: {', '.join(f'{t:.2f}' for t in changed)} s", flush=True)

            if args.time_box:
                with temp_instance(work / "dagster-boxed") as instance:
                    bench = Bench(inbox, work / "index-boxed", instance)
                    saved, sensors.TICK_TIME_BOX_SECONDS = sensors.TICK_TIME_BOX_SECONDS, args.time_box
                    try:
                        ticks, requested, boxed = 0, [], time.perf_counter()
                        while True:
                            ticks += 1
                            bench.tick()
                            added = instance.get_dynamic_partitions("documents")
                            requested = bench.last.run_requests
                            if sensors.read_cursor(bench.cursor).deferred == 0:
                                break
                        boxed = time.perf_counter() - boxed
                    finally:
                        sensors.TICK_TIME_BOX_SECONDS = saved
                    documents = sum(int(r.tags["lexgraph/documents"]) for r in requested)
                    ok = len(added) == len(set(added)) == args.files == documents
                    print(f"  time box {args.time_box} s: {ticks} ticks ({boxed:.1f} s) to request all {len(added)} "
                          f"files, {'none lost or requested twice' if ok else 'MISMATCH'}", flush=True)
                    if not ok:
                        raise SystemExit("the time-boxed ticks lost or duplicated files")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"files: {args.files}  changed: {args.changed}  repeats: {args.repeats}  "
          f"time box: {sensors.TICK_TIME_BOX_SECONDS:.0f} s  (Dagster's limit: 60 s)")
    if check is not None:
        print(f"the daemon's per-key check of an AddDynamicPartitionsRequest of {args.files} keys "
              f"(avoided: the tick adds them in one insert): {check:.1f} s")
    print(f"{args.files // 1000}k-file tick: first {statistics.median(firsts):.2f} s, "
          f"unchanged {statistics.median(unchanged):.2f} s, {args.changed} changed {statistics.median(changed):.2f} s")


def run_daemon(args) -> None:
    """One first tick through Dagster's sensor daemon: evaluation in a code server over gRPC, then the
    partition and run requests handled by the daemon (runs are created and queued, never launched)."""
    from dagster._core.scheduler.instigation import InstigatorType
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.workspace.load_target import ModuleTarget
    from dagster._daemon.sensor import execute_sensor_iteration

    work = Path(tempfile.mkdtemp(prefix="lexgraph-bench-daemon-"))
    inbox = work / "inbox"
    build_inbox(inbox, args.daemon)
    os.environ.update(LEXGRAPH_HOME=str(work / "home"), LEXGRAPH_INBOX=str(inbox))  # the code server's settings
    root = Path(__file__).resolve().parent.parent
    target = ModuleTarget(module_name="orchestration.definitions", attribute="defs", working_directory=str(root),
                          location_name="lexgraph")
    overrides = {"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"}}
    database = None
    if args.postgres:
        database = f"lexgraph_bench_{uuid.uuid4().hex[:8]}"
        _postgres_admin(f'CREATE DATABASE "{database}"')
        overrides["storage"] = {"postgres": {"postgres_db": {
            "hostname": os.environ["DAGSTER_PG_HOST"], "port": int(os.environ.get("DAGSTER_PG_PORT", "5432")),
            "username": os.environ["DAGSTER_PG_USER"], "password": os.environ.get("DAGSTER_PG_PASSWORD", ""),
            "db_name": database, "scheme": "postgresql+psycopg2"}}}
    try:
        with temp_instance(work / "dagster", overrides) as instance, \
                create_test_daemon_workspace_context(target, instance) as workspace:
            start = time.perf_counter()
            list(execute_sensor_iteration(workspace, logging.getLogger("bench"), None, None))
            elapsed = time.perf_counter() - start
            [state] = [s for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                       if s.name == "inbox_sensor"]
            [tick] = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
            runs = instance.get_runs()
            planned = sum(len(instance.all_logs(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED))
                          for r in runs)
            print(f"daemon tick over {args.daemon} new files on {'PostgreSQL' if database else 'SQLite'}: "
                  f"{elapsed:.1f} s wall ({tick.status.value}); "
                  f"{len(instance.get_dynamic_partitions('documents'))} partitions, {len(runs)} runs queued, "
                  f"{planned} materialization-planned events written "
                  f"(DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS={os.getenv('DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS', '')!r})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if database:
            _postgres_admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _postgres_admin(statement: str) -> None:
    """One statement on the server of DAGSTER_PG_* (the role needs CREATEDB, as in .ci/run)."""
    import psycopg2

    connection = psycopg2.connect(host=os.environ["DAGSTER_PG_HOST"], port=int(os.environ.get("DAGSTER_PG_PORT", "5432")),
                                  user=os.environ["DAGSTER_PG_USER"], password=os.environ.get("DAGSTER_PG_PASSWORD", ""),
                                  dbname=os.environ["DAGSTER_PG_DB"])
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement)
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=100, help="files edited before the last tick")
    parser.add_argument("--repeats", type=int, default=3, help="ticks of each kind; the median is printed")
    parser.add_argument("--time-box", type=float, default=0.1,
                        help="also run a first pass with this tick time box and check it resumes (0: skip)")
    parser.add_argument("--no-per-key-check", dest="per_key_check", action="store_false",
                        help="skip timing the daemon's per-key partition check")
    parser.add_argument("--daemon", type=int, default=0, metavar="N",
                        help="instead, one first tick over N files through Dagster's sensor daemon")
    parser.add_argument("--postgres", action="store_true",
                        help="with --daemon: the instance on the PostgreSQL server of DAGSTER_PG_* (a database of "
                        "its own, dropped afterwards) instead of SQLite")
    args = parser.parse_args()
    quiet_logs()
    if args.daemon:
        run_daemon(args)
    else:
        run_ticks(args)


if __name__ == "__main__":
    main()
