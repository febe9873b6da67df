"""Kùzu access: one writer process at a time, replace-by-document loads."""
import subprocess
import sys
from datetime import datetime, timezone

import polars as pl
import pytest

from lexgraph.storage.graph_store import GraphBusyError, GraphStore, writer_lock


def test_second_writer_process_waits_then_gives_up(tmp_path):
    path = tmp_path / "graph.kuzu"
    script = (f"from lexgraph.storage.graph_store import writer_lock\n"
              f"with writer_lock({str(path)!r}, timeout=0.5):\n    print('got it')\n")
    with writer_lock(path):
        held = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert held.returncode != 0 and "locked by another writer" in held.stderr
    free = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert free.returncode == 0 and "got it" in free.stdout


def test_lock_in_same_process_times_out(tmp_path):
    with writer_lock(tmp_path / "g.kuzu"):
        with pytest.raises(GraphBusyError):
            with writer_lock(tmp_path / "g.kuzu", timeout=0.3):
                pass


def test_replace_documents_is_idempotent(tmp_path):
    sources = pl.DataFrame({"id": ["d1"], "uri": ["file:///d1"], "relative_path": ["d1.md"], "title": ["D1"], "format": ["markdown"],
                            "content_hash": ["h"], "version": ["v"], "size_bytes": [3],
                            "ingested_at": [datetime(2026, 1, 1, tzinfo=timezone.utc)]})
    chunks = pl.DataFrame({"chunk_id": ["d1-a", "d1-b"], "doc_id": ["d1", "d1"], "order": [0, 1],
                           "text": ["a", "b"], "char_start": [0, 2], "char_end": [1, 3], "heading_path": ["", ""],
                           "token_count": [1, 1]})
    with GraphStore.writer(tmp_path / "g.kuzu") as graph:
        for _ in range(2):
            graph.replace_documents(sources, chunks)
        counts = {t: graph.count(t) for t in ("Source", "Chunk", "PART_OF", "NEXT")}
        graph.delete_documents(["d1"])
        after = {t: graph.count(t) for t in ("Source", "Chunk", "PART_OF", "NEXT")}
    assert counts == {"Source": 1, "Chunk": 2, "PART_OF": 2, "NEXT": 1}
    assert after == {"Source": 0, "Chunk": 0, "PART_OF": 0, "NEXT": 0}
