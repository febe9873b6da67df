"""Shared test helpers: read the real stores and the Dagster event log."""
import logging
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl

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


def clustered_corpus(n: int, seed: int, doc_size: int, vocabulary: int, dim: int = 16
                     ) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    """n chunks (doc_size to a document) whose unit vectors sit around 8 centres, each with 6 words drawn from
    `vocabulary`: (chunk_id, doc_id), vectors, (chunk_id, words), for the KNN graph's tests."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(8, dim))
    raw = centres[rng.integers(0, 8, n)] + 0.3 * rng.normal(size=(n, dim))
    vectors = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype(np.float32)
    chunks = pl.DataFrame({"chunk_id": [f"c{i:04d}" for i in range(n)],
                           "doc_id": [f"d{i // doc_size:03d}" for i in range(n)]})
    words = chunks.select("chunk_id").with_columns(
        pl.Series("words", [sorted({f"w{j}" for j in rng.integers(0, vocabulary, 6)}) for _ in range(n)]))
    return chunks, vectors, words


def load_chunk_nodes(graph: GraphStore, chunks: pl.DataFrame) -> None:
    """Source and Chunk nodes for these chunks (chunk_id, doc_id), so edge writes have their ends."""
    from datetime import datetime, timezone

    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    for (doc_id,), part in chunks.group_by("doc_id", maintain_order=True):
        sources = pl.DataFrame({"id": [doc_id], "uri": [f"file:///{doc_id}"], "relative_path": [f"{doc_id}.md"],
                                "title": [doc_id], "format": ["markdown"], "content_hash": ["h"], "version": ["v"],
                                "size_bytes": [3], "ingested_at": [at]})
        rows = part.select("chunk_id", "doc_id").with_columns(
            pl.Series("order", range(part.height)), pl.col("chunk_id").alias("text"), pl.lit(0).alias("char_start"),
            pl.lit(1).alias("char_end"), pl.lit(None, dtype=pl.Int64).alias("page_start"),
            pl.lit("h").alias("heading_path"), pl.lit(1).alias("token_count"))
        graph.replace_documents(sources, rows)


def crash_keyword_update(root: Path, doc_ids: list[str], setup: str = ""):
    """update_keyword_index over root/index and root/extract (8-wide vectors) in a child process killed at
    the KEYWORD_INDEX crash point; `setup` is Python run first with `corpus_keywords` imported."""
    import os
    import subprocess
    import sys

    from lexgraph import faults

    script = ("import sys; from pathlib import Path; from lexgraph.indexing import corpus_keywords; "
              "from lexgraph.indexing.corpus_state import CorpusFiles; "
              "from lexgraph.storage.extract_store import ExtractStore\n"
              f"{setup}\n"
              "root = Path(sys.argv[1]); corpus_keywords.update_keyword_index(CorpusFiles(root / 'index'), "
              "ExtractStore(root / 'extract'), sys.argv[2].split(','), 8)")
    env = {**os.environ, faults.CRASH_ENV: faults.KEYWORD_INDEX}
    return subprocess.run([sys.executable, "-c", script, str(root), ",".join(doc_ids)],
                          cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                          timeout=120)


def add_keyword_stats(index: pl.DataFrame, document: pl.DataFrame) -> pl.DataFrame:
    """The whole keyword index with one document's stats added (the update itself works on a delta)."""
    from lexgraph.extract.keywords import apply_keyword_rows, updated_keyword_rows

    return apply_keyword_rows(index, updated_keyword_rows(index, document, +1))


def subtract_keyword_stats(index: pl.DataFrame, document: pl.DataFrame) -> pl.DataFrame:
    """The whole keyword index without one document's stats; keywords left with no sentence go."""
    from lexgraph.extract.keywords import apply_keyword_rows, updated_keyword_rows

    return apply_keyword_rows(index, updated_keyword_rows(index, document, -1))
