"""Writing the KNN graph's SIMILAR edges into Kùzu at scale: the whole set the old way (delete every edge,
then copy), the whole set by recreating the table, and the diff of one document's add (delete the edges
that went, copy the new ones).

    .venv/bin/python benchmarks/bench_graph_writes.py --chunks 100000 --edges 2000000 --changed 300
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from lexgraph.storage.graph_store import GraphStore


def chunk_rows(ids: np.ndarray) -> pl.DataFrame:
    n = len(ids)
    return pl.DataFrame({"id": ids, "doc_id": [f"d{i // 20}" for i in range(n)]}).with_columns(
        pl.lit(0, pl.Int32).alias("ord"), pl.lit("").alias("text"), pl.lit(0, pl.Int64).alias("char_start"),
        pl.lit(0, pl.Int64).alias("char_end"), pl.lit(None, pl.Int32).alias("page_start"),
        pl.lit(None, pl.Int32).alias("page_end"), pl.lit("").alias("heading_path"),
        pl.lit(0, pl.Int32).alias("token_count"), pl.lit(0.0).alias("pagerank"), pl.lit(False).alias("in_skeleton"))


def edges(ids: np.ndarray, count: int, rng: np.random.Generator, kind: str) -> pl.DataFrame:
    return pl.DataFrame({"src": ids[rng.integers(0, len(ids), count)], "dst": ids[rng.integers(0, len(ids), count)],
                         "kind": [kind] * count, "weight": rng.random(count)})


def timed(label: str, action) -> float:
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    print(f"| {label} | {seconds:.2f} |", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=2_000_000)
    parser.add_argument("--changed", type=int, default=300, help="edges removed and added by the diff")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = np.array([f"c{i:08d}" for i in range(args.chunks)])
    all_edges = edges(ids, args.edges, rng, "semantic")
    folder = Path(tempfile.mkdtemp(prefix="lexgraph-graph-writes-"))
    try:
        with GraphStore.writer(folder / "graph.kuzu") as graph:
            graph._copy("Chunk", chunk_rows(ids))
            graph.add_similarity_edges(all_edges)
            print(f"| {args.chunks} chunks, {args.edges} SIMILAR edges | seconds |\n|---|---|")

            def old_rewrite() -> None:
                graph.conn.execute("MATCH ()-[r:SIMILAR]->() DELETE r")
                graph.add_similarity_edges(all_edges)

            timed("whole set, delete every edge then copy (before)", old_rewrite)
            timed("whole set, recreate the table then copy", lambda: graph.replace_similarity_edges(all_edges))
            gone, new = all_edges.sample(args.changed, seed=1), edges(ids, args.changed, rng, "lexical")
            timed(f"diff: delete {args.changed} edges", lambda: graph.delete_similarity_edges(gone))
            timed(f"diff: copy {args.changed} edges", lambda: graph.add_similarity_edges(new))
            timed("find chunks without SIMILAR edges (reloaded)", graph.chunks_without_similar_edges)
            assert graph.count("SIMILAR") == args.edges
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
