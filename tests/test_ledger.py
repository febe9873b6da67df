"""The cost ledger: Parquet parts appended by concurrent writers, totals, damaged parts skipped by name."""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import polars as pl
import pytest

from lexgraph.ledger import SCHEMA, CostLedger, LedgerError, LedgerWarning

ROOT = Path(__file__).resolve().parent.parent


def rows(run_id="run-1", stage="chunk_extractions", model="gpt-x", n=3, **extra):
    return [{"run_id": run_id, "stage": stage, "doc_id": "doc-a", "chunk_id": f"c{i}", "model": model,
             "prompt_tokens": 100, "completion_tokens": 10, "seconds": 0.5, **extra} for i in range(n)]


def test_record_and_read(tmp_path):
    ledger = CostLedger(tmp_path / "ledger")
    assert ledger.read().is_empty() and ledger.read().schema == pl.Schema(SCHEMA)
    assert ledger.record([]) is None

    part = ledger.record(rows(n=2))
    assert part.parent == tmp_path / "ledger" and part.name.startswith("part-") and part.suffix == ".parquet"
    frame = ledger.read()
    assert frame.schema == pl.Schema(SCHEMA)
    assert frame.height == 2
    row = frame.row(0, named=True)
    assert (row["run_id"], row["stage"], row["model"], row["cache_hit"], row["outcome"], row["attempts"]) == (
        "run-1", "chunk_extractions", "gpt-x", False, "ok", 1)
    assert row["at"].tzinfo is not None and abs(row["at"] - dt.datetime.now(dt.timezone.utc)).total_seconds() < 60
    assert not list((tmp_path / "ledger").glob(".*"))  # no temporary files left


def test_totals_by_stage_and_model(tmp_path):
    ledger = CostLedger(tmp_path)
    ledger.record(rows(n=3))
    ledger.record(rows(n=2, cache_hit=True, prompt_tokens=0, completion_tokens=0, seconds=0.0))
    ledger.record(rows(n=2, outcome="fallback: server error (500) after 3 tries", attempts=3))
    ledger.record(rows(stage="embed", model="all-MiniLM-L6-v2", n=4, completion_tokens=0))
    ledger.record(rows(run_id="run-2", stage="embed", model="all-MiniLM-L6-v2", n=1, completion_tokens=0))

    totals = {(r["stage"], r["model"]): r for r in ledger.totals().iter_rows(named=True)}
    extraction = totals[("chunk_extractions", "gpt-x")]
    assert extraction["calls"] == 7 and extraction["cache_hits"] == 2
    assert extraction["requests"] == 3 + 0 + 6  # cache hits made no request, the fallbacks three each
    assert extraction["prompt_tokens"] == 500 and extraction["completion_tokens"] == 50
    assert extraction["seconds"] == pytest.approx(2.5)
    embed = totals[("embed", "all-MiniLM-L6-v2")]
    assert (embed["calls"], embed["prompt_tokens"]) == (5, 500)

    only_run_2 = ledger.totals(run_id="run-2")
    assert only_run_2.height == 1 and only_run_2["calls"][0] == 1
    everything = ledger.read()  # a frame already read holds every run: run_id still restricts it
    assert ledger.totals(by=(), run_id="run-2", frame=everything)["calls"][0] == 1
    assert ledger.totals(by=(), frame=everything)["calls"][0] == 12
    overall = ledger.totals(by=())
    assert overall["calls"][0] == 12
    by_outcome = ledger.totals(by="outcome")
    assert set(by_outcome["outcome"]) == {"ok", "fallback: server error (500) after 3 tries"}
    with pytest.raises(LedgerError, match="cannot total by"):
        ledger.totals(by=("nope",))


def test_bad_rows_are_rejected_before_anything_is_written(tmp_path):
    ledger = CostLedger(tmp_path)
    with pytest.raises(LedgerError, match="lacks"):
        ledger.record([{"stage": "embed", "model": "m"}])
    with pytest.raises(LedgerError, match="unknown ledger column"):
        ledger.record([{"run_id": "r", "stage": "embed", "model": "m", "tokens": 3}])
    with pytest.raises(LedgerError, match="timezone"):
        ledger.record([{"run_id": "r", "stage": "embed", "model": "m", "at": dt.datetime(2024, 1, 1)}])
    with pytest.raises(LedgerError, match="negative"):
        ledger.record([{"run_id": "r", "stage": "embed", "model": "m", "prompt_tokens": -1}])
    assert ledger.parts() == []


def test_concurrent_threads_append_without_loss(tmp_path):
    ledger = CostLedger(tmp_path)

    def write(worker: int) -> None:
        for batch in range(10):
            ledger.record(rows(run_id=f"w{worker}", n=5))

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ledger.parts()) == 40
    frame = ledger.read()
    assert frame.height == 200
    assert frame.group_by("run_id").len().sort("run_id")["len"].to_list() == [50] * 4


WRITER = """
import sys
from lexgraph.ledger import CostLedger
ledger = CostLedger(sys.argv[1])
for batch in range(15):
    ledger.record([{"run_id": sys.argv[2], "stage": "embed", "model": "m", "prompt_tokens": 1}] * 4)
"""


@pytest.mark.subprocess
def test_two_processes_append_to_one_ledger(tmp_path):
    folder = tmp_path / "ledger"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), name], cwd=ROOT)
               for name in ("proc-a", "proc-b")]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    ledger = CostLedger(folder)
    assert len(ledger.parts()) == 30
    totals = ledger.totals(by=("run_id",))
    assert totals["calls"].to_list() == [60, 60] and totals["prompt_tokens"].to_list() == [60, 60]


def test_a_truncated_part_is_skipped_with_a_warning_naming_it(tmp_path):
    ledger = CostLedger(tmp_path)
    ledger.record(rows(n=2))
    damaged = ledger.record(rows(run_id="run-damaged", n=3))
    ledger.record(rows(n=1))
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])  # a crash or a bad copy, not our atomic write
    (tmp_path / ".part-interrupted.parquet.tmp").write_bytes(b"PAR1 half a write")  # a writer killed mid-batch

    with pytest.warns(LedgerWarning, match=damaged.name):
        frame = ledger.read()
    assert frame.height == 3 and "run-damaged" not in frame["run_id"].to_list()
    with pytest.warns(LedgerWarning):
        assert ledger.totals(by=())["calls"][0] == 3


def test_a_part_damaged_past_its_footer_magic_is_skipped_too(tmp_path):
    ledger = CostLedger(tmp_path)
    good = ledger.record(rows(n=1))
    bad = ledger.record(rows(n=1))
    data = bytearray(bad.read_bytes())
    data[4:-8] = b"\0" * (len(data) - 12)  # magic intact at both ends, everything between zeroed
    bad.write_bytes(bytes(data))
    with pytest.warns(LedgerWarning, match=bad.name):
        frame = ledger.read()
    assert frame.height == 1 and good.exists()


def test_a_runs_totals_read_only_the_parts_that_may_hold_it(tmp_path):
    ledger = CostLedger(tmp_path)
    ledger.record(rows(run_id="run-1", n=2))
    ledger.merge([ledger.record(rows(run_id="run-0", n=1)), ledger.record(rows(run_id="run-2", n=4))])  # spans run-1
    pl.DataFrame(rows(run_id="run-1", n=1), schema_overrides={"prompt_tokens": pl.Int64}).write_parquet(
        tmp_path / "part-0-no-statistics.parquet", statistics=False)  # a footer that cannot rule the run out
    other = ledger.record(rows(run_id="run-3", n=5))
    data = bytearray(other.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[4:len(data) - 8 - footer] = b"\0" * (len(data) - 12 - footer)  # pages zeroed, footer whole
    other.write_bytes(bytes(data))

    with pytest.warns(LedgerWarning, match=other.name):
        everything = ledger.read()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # run-3's damaged part is not read: its footer names only run-3
        assert ledger.read(run_id="run-1").equals(everything.filter(pl.col("run_id") == "run-1"))
        assert ledger.totals(by=(), run_id="run-1")["calls"][0] == 3
        assert ledger.totals(by=(), run_id="run-2")["calls"][0] == 4
    with pytest.warns(LedgerWarning, match=other.name):
        assert ledger.totals(by=(), run_id="run-3")["calls"][0] == 0
    # a torn part has no footer to rule any run out: every run's totals name it, and skip it
    torn = ledger.record(rows(run_id="run-4", n=1))
    torn.write_bytes(torn.read_bytes()[:40])
    with pytest.warns(LedgerWarning, match=torn.name):
        assert ledger.totals(by=(), run_id="run-1")["calls"][0] == 3
