"""The saved KNN edges as positions against the chunk-id form they replaced, on one index, in one process.

Why: at 100k chunks a save holds 2.65M edges. The chunk-id form cost every add the string frame, a 36 MB
write and, in PageRank, a hash join of 5.3M ids back to positions; a query process built its neighbour
matrix with a Python lookup per edge end. Each figure here is a median over alternating repeats of the old
way (reconstructed below from the same edges, as the code before did it) and the current one.

    python -m benchmarks.bench_knn_edges .lexgraph/bench/synthetic-100000-100-7-g2/home/default/v7592b8fa
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lexgraph.indexing import corpus_index as ci  # noqa: E402
from lexgraph.indexing.pagerank import pagerank, pagerank_of_positions  # noqa: E402
from lexgraph.query.retrieval import _load_neighbours  # noqa: E402


def _alternating(before: Callable[[], object], now: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of each, run in turn."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, spent in ((before, times[0]), (now, times[1])):
            started = time.perf_counter()
            run()
            spent.append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def _neighbours_by_id(path: Path, position: dict[str, int]) -> sp.csr_matrix:
    """The query side's neighbour matrix from an edges file of chunk ids, as the code before built it."""
    edges = pl.read_parquet(path).filter(pl.col("src").is_in(list(position)) & pl.col("dst").is_in(list(position)))
    src = np.array([position[c] for c in edges["src"].to_list()])
    dst = np.array([position[c] for c in edges["dst"].to_list()])
    weight = edges["weight"].to_numpy().astype(float)
    graph = sp.csr_matrix((np.concatenate([weight, weight]), (np.concatenate([src, dst]), np.concatenate([dst, src]))),
                          shape=(len(position), len(position)))
    return sp.diags(1 / np.maximum(np.asarray(graph.sum(axis=1)).ravel(), 1e-12)) @ graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index_dir", type=Path, help="an index version's folder (holding corpus/)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    files = ci.CorpusFiles(args.index_dir)
    saved, reason = ci.load_knn(files)
    if saved is None:
        print(f"{files.root}: no KNN save to read ({reason})", file=sys.stderr)
        return 2
    rows = ci.saved_edge_rows(saved)
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    position = {chunk_id: i for i, chunk_id in enumerate(chunks["chunk_id"].to_list())}
    print(f"{files.root}: {chunks.height} chunks, {rows.height} edges")
    with tempfile.TemporaryDirectory() as scratch:
        by_id, by_position = Path(scratch) / "by_id.parquet", Path(scratch) / "by_position"
        named = rows.frame()
        copy = ci.CorpusFiles(by_position)  # a save's corpus and edges files, written by the current code
        copy.root.mkdir(parents=True)
        copy.knn_corpus.write_bytes(files.knn_corpus.read_bytes())

        def write_by_id() -> None:
            named.write_parquet(by_id, compression="lz4", statistics=False,
                                metadata={ci.KNN_GENERATION.decode(): saved.generation})

        def write_by_position() -> None:
            ci.write_saved_edges(copy.edges, rows, saved.generation)

        def pagerank_by_id() -> None:
            edges = pl.read_parquet(by_id, columns=["src", "dst", "weight"])
            pagerank(chunks["chunk_id"], edges["src"], edges["dst"], edges["weight"])

        def pagerank_by_position() -> None:
            edges = ci.read_edges(copy)
            pagerank_of_positions(chunks.height, edges.src, edges.dst, edges.weight)

        figures = [
            ("the edges of the lists", lambda: ci.saved_edges(saved), lambda: ci.saved_edge_rows(saved)),
            ("write the edges file", write_by_id, write_by_position),
            ("PageRank: read the edges and solve", pagerank_by_id, pagerank_by_position),
            ("query side: the neighbour matrix", lambda: _neighbours_by_id(by_id, position),
             lambda: _load_neighbours(copy, position)),
        ]
        write_by_id(), write_by_position()
        print(f"edges file: by chunk id {by_id.stat().st_size / 1e6:.1f} MB, by position "
              f"{copy.edges.stat().st_size / 1e6:.1f} MB")
        for name, before, now in figures:
            old, new = _alternating(before, now, args.repeats)
            print(f"{name}: by chunk id {old:.3f} s, by position {new:.3f} s ({new / old:.2f}x), median of {args.repeats}")
        difference = _neighbours_by_id(by_id, position) - _load_neighbours(copy, position)
        print(f"neighbour matrices equal: {difference.nnz == 0 or abs(difference).max() == 0}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
