"""Shared test helpers: read the real stores and the Dagster event log."""
import logging
from pathlib import Path

import dagster as dg

from lexgraph.storage.graph_store import GraphStore
from lexgraph.settings import Settings
from lexgraph.storage.vector_store import VectorStore


def stores(home: Path) -> tuple[VectorStore, Settings]:
    settings = Settings.from_env(home=home)
    return VectorStore(settings.lance_uri), settings


def graph_counts(home: Path, tables=("Source", "Chunk", "PART_OF", "NEXT")) -> dict[str, int]:
    graph = GraphStore(Settings.from_env(home=home).graph_path)
    try:
        return {t: graph.count(t) for t in tables}
    finally:
        graph.close()


def materialized_partitions(instance: dg.DagsterInstance, asset: str) -> list[str]:
    """Partition keys of every materialization of an asset, in event order (one per partition per run)."""
    records = instance.fetch_materializations(dg.AssetKey(asset), limit=10_000).records
    return [r.asset_materialization.partition for r in sorted(records, key=lambda r: r.storage_id)]


def run_partition_keys(instance: dg.DagsterInstance) -> list[list[str]]:
    """For each run, the partition keys it covered (from its range tags)."""
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    keys = instance.get_dynamic_partitions("documents")
    covered = []
    for run in reversed(instance.get_runs()):  # oldest first
        start, end = run.tags.get(ASSET_PARTITION_RANGE_START_TAG), run.tags.get(ASSET_PARTITION_RANGE_END_TAG)
        if start and end and start in keys and end in keys:
            covered.append(keys[keys.index(start): keys.index(end) + 1])
    return covered


def write(path, data: bytes | str):
    """Write text (as UTF-8) or raw bytes, creating folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


class LogLines(logging.Handler):
    """Keeps every message logged to it (attach to a logger to read what a sensor said)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())
