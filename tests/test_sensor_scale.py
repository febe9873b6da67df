"""The inbox sensor at scale (2,000 files): one bulk partition insert, reading only changed files, a
time-boxed tick resumed by the next one, and odd files that never stop a tick."""
import itertools
import os
from pathlib import Path

import dagster as dg
import pytest

import lexgraph.inbox as inbox_module
from benchmarks.bench_sensor import Bench, build_inbox, edit
from lexgraph.ids import document_id
from lexgraph.inbox import SCAN_CACHE_FILE, scan_inbox
from orchestration import sensors
from tests.helpers import LogLines

FILES = 2000


class _Spy:
    """Counts calls of a function (and keeps their arguments) while calling through."""

    def __init__(self, function):
        self.function, self.calls = function, []

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.function(*args, **kwargs)


def _tick(bench: Bench, lines: LogLines | None = None) -> dg.SensorResult:
    with dg.build_sensor_context(instance=bench.instance, cursor=bench.cursor, resources=bench.defs.resources,
                                 repository_def=bench.defs.get_repository_def()) as context:
        if lines is not None:
            context.log.addHandler(lines)
        result = sensors.inbox_sensor.evaluate_tick(context)
    bench.cursor, bench.last = result.cursor, result
    return result


def _covered(result, keys: list[str]) -> list[str]:
    position = {k: i for i, k in enumerate(keys)}
    covered = []
    for run in result.run_requests:
        if run.job_name == "ingest_documents":
            start = position[run.tags["dagster/asset_partition_range_start"]]
            end = position[run.tags["dagster/asset_partition_range_end"]]
            assert end - start + 1 == int(run.tags["lexgraph/documents"])
            covered += keys[start:end + 1]
    return covered


@pytest.fixture
def instance(sqlite_instance):
    """Sensors and schedules tick in the daemon, on a persistent instance: these tests use one too."""
    return sqlite_instance


@pytest.fixture
def big_inbox(tmp_path) -> tuple[Path, list[Path]]:
    folder = tmp_path / "inbox"
    return folder, build_inbox(folder, FILES)


@pytest.fixture
def fake_clock(monkeypatch):
    """lexgraph.inbox's clock, advancing 1 ms at each reading: a time box of 0.5 s reads 500 files."""
    ticks = itertools.count()
    monkeypatch.setattr(inbox_module, "monotonic", lambda: next(ticks) / 1000)


def test_one_tick_adds_every_partition_in_one_insert_and_reads_only_changed_files(big_inbox, tmp_path, instance,
                                                                                  monkeypatch):
    folder, paths = big_inbox
    bench = Bench(folder, tmp_path / "index", instance)
    adds = _Spy(instance.add_dynamic_partitions)
    checks = _Spy(instance.has_dynamic_partition)
    lists = _Spy(instance.get_dynamic_partitions)
    monkeypatch.setattr(instance, "add_dynamic_partitions", adds)
    monkeypatch.setattr(instance, "has_dynamic_partition", checks)
    monkeypatch.setattr(instance, "get_dynamic_partitions", lists)
    reads = _Spy(inbox_module._read_state)
    monkeypatch.setattr(inbox_module, "_read_state", reads)

    # What keeps a tick of 2,000 files within a fraction of Dagster's 60 s (the time itself: `make bench-sensor`,
    # 10,000 files): the instance is asked a fixed number of times, never once per file, and each file is read once.
    first = _tick(bench)
    assert len(lists.calls) == 1
    [(name, keys)] = adds.calls  # one insert for every key
    assert name == "documents" and sorted(keys) == sorted(document_id(p.relative_to(folder).as_posix()) for p in paths)
    assert checks.calls == [] and first.dynamic_partitions_requests == []  # nothing left for the daemon to check
    assert len(reads.calls) == FILES
    assert len(first.run_requests) == 8  # 256 documents a run
    assert sorted(_covered(first, instance.get_dynamic_partitions("documents"))) == sorted(keys)
    assert len(first.cursor) < 40_000, "the cursor holds 12-digit digests, not file states"

    # Indexed and unchanged: no file is read again (size and mtime_ns match the scan cache).
    bench.mark_indexed(paths)
    reads.calls.clear()
    quiet = _tick(bench)
    assert reads.calls == [] and quiet.run_requests == [] and len(adds.calls) == 1
    assert len(quiet.cursor) < 100

    edited = paths[100:110]
    edit(edited, "test")
    changed = _tick(bench)
    assert sorted(Path(call[1]) for call in reads.calls) == sorted(edited)
    keys = instance.get_dynamic_partitions("documents")
    assert sorted(_covered(changed, keys)) == sorted(document_id(p.relative_to(folder).as_posix()) for p in edited)
    assert len(changed.asset_events) == 10 and len(adds.calls) == 1  # existing partitions: nothing to add


def test_a_time_boxed_tick_is_resumed_by_the_next_without_losing_or_repeating_a_file(
        big_inbox, tmp_path, instance, monkeypatch, fake_clock):
    folder, paths = big_inbox
    monkeypatch.setattr(sensors, "TICK_TIME_BOX_SECONDS", 0.5)
    bench = Bench(folder, tmp_path / "index", instance)
    reads = _Spy(inbox_module._read_state)
    monkeypatch.setattr(inbox_module, "_read_state", reads)
    lines = LogLines()
    added, ticks = [], 0
    while True:
        ticks += 1
        before = len(instance.get_dynamic_partitions("documents"))
        result = _tick(bench, lines)
        after = instance.get_dynamic_partitions("documents")
        added.append(after[before:])
        assert result.dynamic_partitions_requests == []
        cursor = sensors.read_cursor(result.cursor)
        if not cursor.deferred:
            break
        assert "not read yet (time box reached), the next tick goes on" in lines.lines[-1]
        assert ticks < 10
    assert ticks == 4 and [len(a) for a in added] == [500] * 4
    keys = [k for batch in added for k in batch]
    expected = sorted(document_id(p.relative_to(folder).as_posix()) for p in paths)
    assert sorted(keys) == expected and len(set(keys)) == FILES  # none lost, none twice
    assert len(reads.calls) == FILES  # and no file read twice
    assert sorted(_covered(result, after)) == expected  # the last tick requests all of them once

    # The catalog has every file; the scan cache is lost, so every file is read again over several ticks:
    # a file not read yet is left alone, never taken for removed.
    bench.mark_indexed(paths)
    (bench.defs.resources["index"].settings().index_dir / SCAN_CACHE_FILE).unlink()
    for tick in range(4):
        result = _tick(bench, lines)
        assert result.run_requests == [] and result.dynamic_partitions_requests == [], tick
    assert sensors.read_cursor(result.cursor).deferred == 0
    assert lines.lines[-1] == f"inbox: nothing new ({FILES} unchanged)"
    assert len(instance.get_dynamic_partitions("documents")) == FILES


def test_a_resumed_scan_starts_after_the_last_file_read(tmp_path, fake_clock):
    folder = tmp_path / "inbox"
    paths = build_inbox(folder, 10)
    first = scan_inbox(folder, time_box=0.003)
    assert first.read == 3 and len(first.deferred) == 7 and first.last_read == "team-000/note-00002.md"
    edit(paths[:1], "again")  # read already; changed since: it waits for its turn
    second = scan_inbox(folder, first.states, time_box=0.003, resume_after=first.last_read)
    assert second.last_read == "team-000/note-00005.md" and len(second.deferred) == 5
    third = scan_inbox(folder, second.states, time_box=0.003, resume_after=second.last_read)
    fourth = scan_inbox(folder, third.states, time_box=0.003, resume_after=third.last_read)
    assert fourth.complete and fourth.read == 2 and fourth.last_read == "team-000/note-00000.md"
    assert fourth.states[document_id("team-000/note-00000.md")].size == paths[0].stat().st_size


class _OsWithALockedFile:
    """lexgraph.inbox's view of os, where opening locked.md fails as it would without read permission
    (the tests may run as root, who reads any file whatever its mode)."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def open(path, flags, *args):
        if os.path.basename(path) == "locked.md":
            raise PermissionError(13, "Permission denied", path)
        return os.open(path, flags, *args)


def test_bad_names_and_unreadable_files_are_reported_and_do_not_stop_the_tick(tmp_path, instance, monkeypatch):
    folder = tmp_path / "inbox"
    paths = build_inbox(folder, 200)
    odd = folder / "team-000"
    bad_name = os.path.join(os.fsencode(odd), b"minutes-\xff\xfe.md")  # not UTF-8
    with open(bad_name, "wb") as handle:
        handle.write(b"# Minutes\n\nA good text in a file with a bad name.\n")
    (odd / "locked.md").write_text("# Locked\n\nNobody may read this.\n")
    (odd / "latin1.md").write_bytes("# Caf\xe9\n\nLatin-1 text.\n".encode("latin-1"))
    os.mkfifo(odd / "pipe.md")
    os.symlink(odd / "nowhere.md", odd / "dangling.md")
    monkeypatch.setattr(inbox_module, "os", _OsWithALockedFile())
    bench = Bench(folder, tmp_path / "index", instance)
    lines = LogLines()
    result = _tick(bench, lines)

    warnings = "\n".join(line for line in lines.lines if line.startswith("not indexed: "))
    assert f"{odd}/minutes-\\xff\\xfe.md: has a name that is not valid UTF-8" in warnings
    assert f"{odd}/locked.md: cannot be read (Permission denied)" in warnings
    assert f"{odd}/latin1.md: file is not valid UTF-8" in warnings
    assert f"{odd}/pipe.md: is a FIFO" in warnings and f"{odd}/dangling.md: is a dangling symbolic link" in warnings
    good = sorted(document_id(p.relative_to(folder).as_posix()) for p in paths)
    keys = instance.get_dynamic_partitions("documents")
    # every good file is requested; the invalid text gets a run of its own (which fails naming it);
    # entries that cannot be read at all get neither partition nor run
    assert sorted(keys) == sorted(good + [document_id("team-000/latin1.md")])
    assert sorted(_covered(result, keys)) == sorted(keys)
    assert "200 new" not in lines.lines[-1] and "201 new" in lines.lines[-1]
