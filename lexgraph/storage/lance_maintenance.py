"""Compaction of the LanceDB tables that per-document writes fragment.

Every document written adds a fragment and a version to a table (the statements table of LiHua-World's 442
documents held 442 fragments and 883 versions). Scans slow down with the fragment count (that table's full
scan: 0.49 s before compaction, 0.085 s after) and every old version keeps its files on disk. Compacting
rewrites the small fragments into a few and prunes versions older than KEEP_VERSIONS; a table is compacted
when it has SMALL_FRAGMENTS small fragments or VERSIONS versions old enough to prune.

Tables with an index of LanceDB's own (the chunk and keyword tables past LEXGRAPH_LANCE_THRESHOLD, the
keyword links) are left to lexgraph.storage.lance_indexes.refresh, which folds new rows into their indexes;
a query process also keeps those tables open between questions. Every other table is read by opening it
afresh, at its latest version, so pruning versions an hour old takes nothing from a reader.
No Dagster here (assets/maintenance.py runs it)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from lexgraph.storage.vector_store import VectorStore

SMALL_FRAGMENTS = 32  # compact a table once it has this many small fragments ...
VERSIONS = 200  # ... or keeps this many versions older than KEEP_VERSIONS (younger ones cannot be pruned yet)
KEEP_VERSIONS = timedelta(hours=1)


@dataclass
class TableCompaction:
    table: str
    decision: str  # "compacted", "current", "indexed: left to search_indexes", or "failed: <why>"
    fragments_before: int
    fragments_after: int
    versions_before: int
    versions_after: int
    bytes_before: int
    bytes_after: int
    seconds: float = 0.0


def _disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _shape(store: VectorStore, name: str) -> tuple[int, int, list[dict], int]:
    """(fragments, small fragments, versions, bytes on disk with old versions' files) of a table."""
    table = store.db.open_table(name)
    fragments = table.stats()["fragment_stats"]
    return (int(fragments["num_fragments"]), int(fragments["num_small_fragments"]), table.list_versions(),
            _disk_bytes(Path(store.table_uri(name))))


def _prunable(versions: list[dict]) -> int:
    """Versions older than KEEP_VERSIONS: what a compaction would prune. Counting all versions instead made
    every corpus run in the hour after a big build rewrite a table whose versions were all too young to go
    (the statements table of a 100k-chunk build: 2,001 versions, 6 s per add, nothing pruned)."""
    def age(stamp: datetime) -> timedelta:  # LanceDB gives naive local times
        return (datetime.now(timezone.utc) if stamp.tzinfo else datetime.now()) - stamp

    return sum(age(version["timestamp"]) > KEEP_VERSIONS for version in versions)


def compact_table(store: VectorStore, name: str) -> TableCompaction:
    fragments, small, versions, size = _shape(store, name)
    result = TableCompaction(name, "current", fragments, fragments, len(versions), len(versions), size, size)
    table = store.db.open_table(name)
    if table.list_indices():
        result.decision = "indexed: left to search_indexes"
        return result
    if small < SMALL_FRAGMENTS and _prunable(versions) < VERSIONS:
        return result
    started = time.perf_counter()
    try:
        table.optimize(cleanup_older_than=KEEP_VERSIONS)
    except Exception as error:  # e.g. a commit conflict with a concurrent writer: the next run tries again
        result.decision = f"failed: {type(error).__name__}: {error}"
        return result
    result.seconds = round(time.perf_counter() - started, 3)
    result.fragments_after, _, after, result.bytes_after = _shape(store, name)
    result.versions_after = len(after)
    result.decision = "compacted"
    return result


def compact_tables(store: VectorStore) -> list[dict]:
    """Compact every table that needs it (see the module's doc) -> one report per table."""
    return [asdict(compact_table(store, name)) for name in sorted(store.table_names())]
