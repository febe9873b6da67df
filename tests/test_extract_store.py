"""Extract-store integrity: a truncated or damaged Parquet file is named, never read as garbage, and
sends its document back for re-ingestion; what cannot be re-ingested fails with the file's name."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from lexgraph.settings import Settings
from lexgraph.storage.extract_store import (VERIFIED_FILE, CorruptExtractError, ExtractStore, parquet_problem,
                                            verify_extracts)
from lexgraph.storage.vector_store import VectorStore
from tests.test_crash_recovery import assert_same_stores, store_snapshot
from tests.conftest import cleared_variables


def _truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_file_is_named_when_read_and_found_by_verify(tmp_path):
    store = ExtractStore(tmp_path)
    frame = pl.DataFrame({"chunk_id": [f"c{i}" for i in range(500)], "text": ["some text"] * 500})
    path = store.write("chunks", "doc-a", frame)
    store.write("chunks", "doc-b", frame)
    assert parquet_problem(path) is None and store.rows("chunks", "doc-a") == 500
    assert verify_extracts(store, ["doc-a", "doc-b"], ["chunks"]) == {}

    _truncate(path)
    with pytest.raises(CorruptExtractError) as caught:
        store.read("chunks", "doc-a")
    assert str(path) in str(caught.value) and "truncated" in str(caught.value)
    assert (caught.value.stage, caught.value.doc_id) == ("chunks", "doc-a")
    with pytest.raises(CorruptExtractError, match="doc-a.parquet"):
        store.scan("chunks")

    problems = verify_extracts(store, ["doc-a", "doc-b"], ["chunks", "keywords"])
    assert set(problems) == {"doc-a", "doc-b"}
    assert str(path) in problems["doc-a"] and "truncated" in problems["doc-a"]
    assert "keywords" in problems["doc-b"] and "missing" in problems["doc-b"]  # an output it should have
    assert store.remove_corrupt("doc-a") == [path] and not path.exists()
    assert store.read("chunks", "doc-b").equals(frame)

    path.write_bytes(b"PAR1")  # too short to be anything
    assert "too short" in verify_extracts(store, ["doc-a"])["doc-a"]


def _settled(path: Path) -> None:
    """Date a file back a minute, as a file written by an earlier run (fresh ones are not recorded)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - 60 * 10**9))


def test_verified_files_are_recorded_and_a_later_damage_is_still_found(tmp_path):
    store = ExtractStore(tmp_path)
    frame = pl.DataFrame({"chunk_id": [f"c{i}" for i in range(500)], "text": ["some text"] * 500})
    a, b = store.write("chunks", "doc-a", frame), store.write("keywords", "doc-b", frame)
    fresh = store.write("chunks", "doc-c", frame)
    _settled(a), _settled(b)
    assert verify_extracts(store, ["doc-a", "doc-b", "doc-c"]) == {}
    assert set(store.read_verified()) == {"chunks/doc-a.parquet", "keywords/doc-b.parquet"}  # doc-c: too recent

    # damaged after it was recorded: truncated (size changes), or a footer byte flipped in place (size kept)
    _truncate(a)
    data = bytearray(b.read_bytes())
    data[-9] ^= 0xFF  # last byte of the footer's metadata
    b.write_bytes(bytes(data))
    _truncate(fresh)
    problems = verify_extracts(store, ["doc-a", "doc-b", "doc-c"])
    assert set(problems) == {"doc-a", "doc-b", "doc-c"}
    assert str(a) in problems["doc-a"] and str(b) in problems["doc-b"] and "footer" in problems["doc-b"]
    assert store.read_verified() == {}  # damaged files are not recorded as whole

    # a file whose size and mtime are as recorded is not parsed again (what keeps the check cheap)
    good = store.write("keywords", "doc-b", frame)
    _settled(good)
    assert verify_extracts(store, ["doc-b"]) == {}
    recorded = good.stat()
    good.write_bytes(b"PAR1" + b"\0" * (recorded.st_size - 8) + b"PAR1")
    os.utime(good, ns=(recorded.st_atime_ns, recorded.st_mtime_ns))
    assert verify_extracts(store, ["doc-b"]) == {}
    assert "footer" in store.problems("doc-b")[good]  # the direct check still parses it


@pytest.mark.parametrize("record", [b"", b"{not json", b"[1, 2]", b'{"files": [1]}',
                                    b'{"files": {"chunks/doc-a.parquet": "whole"}}'])
def test_a_damaged_record_is_ignored_and_everything_verified(tmp_path, record):
    store = ExtractStore(tmp_path)
    path = store.write("chunks", "doc-a", pl.DataFrame({"chunk_id": ["c1"] * 100}))
    _truncate(path)
    _settled(path)
    (tmp_path / VERIFIED_FILE).write_bytes(record)
    assert "truncated" in verify_extracts(store, ["doc-a"])["doc-a"]


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    """`lexgraph ingest` in this process with an ephemeral Dagster instance."""
    import contextlib
    import io

    from orchestration.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.pop(k) for k in cleared_variables()}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--home", str(home), "ingest", "--quiet", *args])
    finally:
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def _doc(home: Path, name: str) -> str:
    catalog = VectorStore(Settings.from_env(home=home).lance_uri).sources()
    return catalog.filter(pl.col("relative_path") == name)["doc_id"][0]


@pytest.mark.ingest
def test_truncated_extract_files_are_reingested_and_the_index_converges(tiny_corpus, home, embedder):
    code, out, _ = _cli(home, str(tiny_corpus))
    assert code == 0, out
    clean = store_snapshot(home)
    store = ExtractStore(Settings.from_env(home=home).extract_dir)
    alpha, gamma = _doc(home, "alpha.md"), _doc(home, "gamma.md")
    _truncate(store.path("chunks", alpha))
    _truncate(store.path("keywords", gamma), keep=0.3)

    code, out, err = _cli(home, str(tiny_corpus))
    assert code == 0, out + err
    assert "in 1 Dagster run(s)" in out  # the two damaged documents, re-ingested together
    assert verify_extracts(store, [alpha, gamma], ["chunks", "keywords"]) == {}
    assert_same_stores(store_snapshot(home), clean)


@pytest.mark.ingest
def test_damage_that_cannot_be_reingested_names_the_file(tiny_corpus, home, embedder):
    assert _cli(home, str(tiny_corpus))[0] == 0
    store = ExtractStore(Settings.from_env(home=home).extract_dir)
    gamma = _doc(home, "gamma.md")
    damaged = store.path("keywords", gamma)
    _truncate(damaged)
    (tiny_corpus / "gamma.md").unlink()  # its source left the inbox: nothing to re-ingest it from
    (tiny_corpus / "delta.md").write_text("# Delta\n\nDelta Freight chartered a vessel from Alpha Shipping.\n")

    code, out, err = _cli(home, str(tiny_corpus))
    assert f"failed: {damaged}" in out and "no longer in the inbox" in out
    # The corpus update reads only the changed documents' keywords (delta's), so it goes on: the rest of the
    # corpus is indexed, and the damaged file is named, as a failed document is, on every run until pruned.
    assert code == 0 and "corpus-wide index update" not in err, out + err
    assert _doc(home, "delta.md")
    again = _cli(home, "--strict", str(tiny_corpus))
    assert again[0] == 1 and f"failed: {damaged}" in again[1]  # not silently "fixed" by running again

    code, out, err = _cli(home, "--prune", str(tiny_corpus))  # once the document is removed, all is well
    assert code == 0 and "1 removed" in out, out + err
