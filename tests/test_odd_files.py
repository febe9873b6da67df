"""One odd entry never stops the rest: link loops, dangling links, FIFOs, devices, sockets, unreadable
and vanishing files each give one problem naming the path, never block, and the other files are
indexed; a known-bad file is reported, not re-run, until it changes. Real Dagster, LanceDB, Kùzu."""
import json
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from lexgraph.ids import document_id
from lexgraph.inbox import KnownProblems, iter_corpus_files, scan_folder, walk_corpus
from lexgraph.settings import Settings
from tests.helpers import stores, write

GOOD = ["a.md", "b.txt", "ext/e.md", "sub/c.md"]
# relative path -> what its one problem says
ODD = {
    "x.txt": "is a FIFO (named pipe), not a regular file",
    "loop.md": "is a symbolic link loop (ELOOP)",
    "gone.md": "is a dangling symbolic link (its target nowhere.md does not exist)",
    "null.txt": "is a character device, not a regular file",
    "s.sock": "is a socket, not a regular file",
    "sub/back": "is a symbolic link loop: it points back to",
    "alias": "a folder scanned under its own path; not followed twice",
}


def finishes(function, seconds: float = 20.0, fifo: Path | None = None):
    """function's result, failing (not hanging) if it blocks: a blocked FIFO read is released."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", function()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:  # give the blocked reader a writer and EOF, so the thread ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"blocked for over {seconds:.0f}s")
    assert "value" in result, "raised (see the thread's traceback above)"
    return result["value"]


@pytest.fixture
def odd_folder(tmp_path):
    outside = tmp_path / "outside"
    write(outside / "e.md", "# E\n\nThe Kiel plant builds engines.\n")
    root = tmp_path / "inbox"
    write(root / "a.md", "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n")
    write(root / "b.txt", "Bolt Engines is run by Dana Frost.\n")
    write(root / "sub" / "c.md", "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n")
    os.mkfifo(root / "x.txt")
    (root / "loop.md").symlink_to("loop.md")
    (root / "gone.md").symlink_to("nowhere.md")
    (root / "null.txt").symlink_to("/dev/null")
    (root / "sub" / "back").symlink_to("..")
    (root / "alias").symlink_to("sub")
    (root / "ext").symlink_to(outside)
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(root)  # a socket path must be short
    try:
        server.bind("s.sock")
    finally:
        os.chdir(cwd)
    yield root
    server.close()


def test_walk_lists_regular_files_and_names_each_odd_entry(odd_folder):
    walk = finishes(lambda: walk_corpus(odd_folder), fifo=odd_folder / "x.txt")
    assert [p.relative_to(odd_folder).as_posix() for p in walk.files] == GOOD
    assert iter_corpus_files(odd_folder) == walk.files
    problems = {p.relative_to(odd_folder).as_posix(): str(problem) for p, problem in walk.problems.items()}
    assert set(problems) == set(ODD)
    for relative, says in ODD.items():
        assert says in problems[relative], (relative, problems[relative])


def test_scan_gives_one_problem_per_odd_entry_and_hashes_the_rest(odd_folder):
    states = finishes(lambda: scan_folder(odd_folder), fifo=odd_folder / "x.txt")
    by_path = {s.relative_path: s for s in states.values()}
    assert set(by_path) == set(GOOD) | set(ODD)
    for relative in GOOD:
        assert by_path[relative].problem is None and by_path[relative].kind == "file"
    for relative, says in ODD.items():
        state = by_path[relative]
        assert state.problem == f"{odd_folder / relative}: {state.problem.split(': ', 1)[1]}"
        assert says in state.problem and state.kind != "file"
        assert state.doc_id == document_id(relative)


def test_a_vanishing_file_is_one_problem(odd_folder, monkeypatch):
    import lexgraph.inbox as inbox

    listed = inbox.walk_corpus

    def walk_then_delete(root):
        walk = listed(root)
        (odd_folder / "b.txt").unlink()  # gone between the listing and the hashing
        return walk

    monkeypatch.setattr(inbox, "walk_corpus", walk_then_delete)
    states = finishes(lambda: scan_folder(odd_folder), fifo=odd_folder / "x.txt")
    [vanished] = [s for s in states.values() if s.relative_path == "b.txt"]
    assert vanished.problem == f"{odd_folder / 'b.txt'}: vanished while the folder was being scanned"


def _scan_as_nobody(folder: Path) -> dict:
    """scan_folder in a child process that dropped root (root reads any file whatever its mode)."""
    import encodings.utf_8_sig  # noqa: F401  (the child cannot import from root's folders)

    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            out = {s.relative_path: [s.kind, s.problem] for s in scan_folder(folder).values()}
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            out = {"error": repr(error)}
        os.write(write_end, json.dumps(out).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_unreadable_file_and_folder_are_one_problem_each():
    folder = Path(tempfile.mkdtemp(prefix="lexgraph-unreadable-"))  # not under root-only /tmp/pytest-of-root
    try:
        os.chmod(folder, 0o755)
        write(folder / "ok.md", "# Ok\n\nFine.\n")
        write(folder / "secret.md", "# Secret\n\nNot for you.\n").chmod(0)
        write(folder / "locked" / "inside.md", "# Inside\n\nUnseen.\n")
        (folder / "locked").chmod(0)
        if os.geteuid() == 0:
            states = _scan_as_nobody(folder)
        else:
            states = {s.relative_path: [s.kind, s.problem] for s in scan_folder(folder).values()}
        assert "error" not in states, states
        assert states["ok.md"] == ["file", None]
        assert states["secret.md"] == ["unreadable", f"{folder / 'secret.md'}: cannot be read (Permission denied)"]
        kind, problem = states["locked"]
        assert kind == "unreadable-folder" and problem.startswith(f"{folder / 'locked'}: is a folder that cannot be read")
        assert set(states) == {"ok.md", "secret.md", "locked"}
    finally:
        (folder / "locked").chmod(0o755)
        import shutil

        shutil.rmtree(folder)


def test_unreadable_folder_removes_nothing(tmp_path):
    """Documents inside a folder that cannot be read are not seen, which is not the same as removed."""
    from lexgraph.inbox import FileState, plan_reconcile

    files = {"locked-1": FileState("locked-1", "locked", 0, 0, "entry-x", "/in/locked: is a folder that cannot "
                                   "be read (Permission denied)", "unreadable-folder")}
    plan = plan_reconcile(files, {"locked--inside.md-1": "h"})
    assert plan.removed == [] and "locked-1" in plan.invalid and plan.to_index == []


def test_bench_corpus_preparation_is_not_blocked(odd_folder, tmp_path):
    from lexgraph.evaluation.corpus import prepare_corpus

    prepared = finishes(lambda: prepare_corpus(odd_folder, tmp_path / "cache"), fifo=odd_folder / "x.txt")
    assert prepared.kind == "folder" and prepared.folder == odd_folder


def test_ingest_indexes_the_rest_and_does_not_rerun_known_bad_files(odd_folder, home, instance, capsys):
    from orchestration.cli import main
    from orchestration.runner import ingest_folder

    write(odd_folder / "bin.md", b"\x00\x01 binary")  # the scan sees this one
    write(odd_folder / "blank.html", "<html><head><script>var x = 1;</script></head><body> </body></html>")
    report = finishes(lambda: ingest_folder(odd_folder, instance, home=str(home), progress=False), seconds=240,
                      fifo=odd_folder / "x.txt")
    vectors, settings = stores(home)
    assert sorted(vectors.sources()["doc_id"].to_list()) == sorted(document_id(r) for r in GOOD)
    failed = {message.split(": ", 1)[0]: message for message in report.failed.values()}
    expected = {str(odd_folder / r) for r in [*ODD, "bin.md", "blank.html"]}
    assert set(failed) == expected, report.failed
    for relative, says in ODD.items():
        assert says in failed[str(odd_folder / relative)]
    assert report.new == len(GOOD) + 2  # the odd entries are not documents; bin.md and blank.html are
    known = KnownProblems(settings.index_dir).load()
    assert {k.relative_path for k in known.values()} == {*ODD, "bin.md", "blank.html"}
    runs_before = len(instance.get_runs())

    again = ingest_folder(odd_folder, instance, home=str(home), progress=False)
    assert again.runs == [] and len(instance.get_runs()) == runs_before  # nothing re-run
    assert set(again.failed) == set(report.failed)
    assert all("not retried until the file changes" in m for m in again.failed.values())

    write(odd_folder / "bin.md", "# Bin\n\nNow a text file about Bolt Engines.\n")  # fixed: retried
    (odd_folder / "x.txt").unlink()  # removed: forgotten
    third = ingest_folder(odd_folder, instance, home=str(home), progress=False)
    assert third.new == 1 and len(third.runs) == 1
    assert document_id("bin.md") in vectors.sources()["doc_id"].to_list()
    assert {k.relative_path for k in KnownProblems(settings.index_dir).load().values()} == \
        ({*ODD, "blank.html"} - {"x.txt"})

    # the command line prints each problem, once, and exits 0 (1 with --strict)
    assert main(["--home", str(home), "ingest", str(odd_folder), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"failed: {odd_folder / 'loop.md'}: is a symbolic link loop (ELOOP)" in out
    assert out.count("loop.md") == 1 and "x.txt" not in out


def test_sensor_logs_each_new_problem_once(odd_folder, home, instance, capsys):
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.sensors import inbox_sensor

    defs = build_definitions(Settings.from_env(home=home, inbox=odd_folder))

    def tick(cursor=None):
        """One evaluation and the warning lines it logged (Dagster's console log goes to stderr)."""
        capsys.readouterr()
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources,
                                     repository_def=defs.get_repository_def()) as context:
            result = finishes(lambda: inbox_sensor.evaluate_tick(context), fifo=odd_folder / "x.txt")
        err = capsys.readouterr().err
        return result, [line for line in err.splitlines() if " - WARNING - " in line], err

    first, warnings, _ = tick()
    for relative, says in ODD.items():
        assert sum(f"{odd_folder / relative}: " in w and says in w for w in warnings) == 1, (relative, warnings)
    # the odd entries get no partitions (the tick adds the others itself, in one insert) and no runs
    assert sorted(instance.get_dynamic_partitions("documents")) == sorted(document_id(r) for r in GOOD)
    assert [r.tags["lexgraph/documents"] for r in first.run_requests] == ["4"]

    _, warnings, err = tick(first.cursor)
    assert warnings == []  # known now: summarised, not repeated
    assert f"{len(ODD)} file(s) with a known problem, unchanged, not retried" in err


def test_a_file_in_a_linked_folder_keeps_its_inbox_path(tmp_path, home, instance):
    from orchestration.runner import ingest_folder

    outside = write(tmp_path / "shared-drive" / "policy.md", "# Policy\n\nLinked folders are indexed in place.\n")
    inbox = tmp_path / "inbox"
    write(inbox / "local.md", "# Local\n\nA file of the inbox itself.\n")
    os.symlink(outside.parent, inbox / "drive")
    report = ingest_folder(inbox, instance, home=home, progress=False)
    assert report.failed == {}
    vectors, _ = stores(home)
    catalog = dict(zip(vectors.sources()["doc_id"].to_list(), vectors.sources()["relative_path"].to_list()))
    assert catalog[document_id("drive/policy.md")] == "drive/policy.md"
