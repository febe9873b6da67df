"""A new process adding a few chunks to an approximate (HNSW) KNN graph: with the saved HNSW index loaded,
against the same add with the index file deleted (so rebuilt from all vectors, as before it was saved).

    .venv/bin/python benchmarks/bench_ann_persist.py --chunks 100000 --repeats 3

Synthetic clustered unit vectors (384-d) and word lists; engine only (lexgraph.indexing.corpus_index.update_knn),
each timed add in a fresh subprocess so nothing is warm in memory.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

DIM = 384


def corpus(n: int, seed: int = 0) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(n // 200, 8), DIM)).astype(np.float32)
    vectors = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.normal(size=(n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = pl.DataFrame({"chunk_id": [f"c{i:08d}" for i in range(n)], "doc_id": [f"d{i // 20:06d}" for i in range(n)]})
    words = chunks.select("chunk_id").with_columns(
        pl.Series("words", [[f"w{j}" for j in row] for row in rng.integers(0, 50_000, (n, 12))]))
    return chunks, vectors, words


def add(root: Path, n: int, added: int) -> dict:
    """One update in this process: the saved corpus of n - added chunks plus `added` new ones."""
    from lexgraph.indexing.corpus_index import CorpusFiles, update_knn

    chunks, vectors, words = corpus(n)
    started = time.perf_counter()
    result = update_knn(CorpusFiles(root), chunks, vectors, words, mode="approx")
    return {"seconds": time.perf_counter() - started, "ann_index": result.ann_index,
            "added": result.semantic.added if result.semantic else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--added", type=int, default=5, help="chunks added per timed update (one small document)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(add(Path(args.worker), args.chunks, args.added)))
        return
    from lexgraph.indexing.corpus_index import CorpusFiles, update_knn

    base = Path(tempfile.mkdtemp(prefix="lexgraph-ann-"))
    try:
        chunks, vectors, words = corpus(args.chunks)
        keep = args.chunks - args.added
        started = time.perf_counter()
        update_knn(CorpusFiles(base / "saved"), chunks.head(keep), vectors[:keep], words, mode="approx")
        print(f"initial approximate build of {keep} chunks: {time.perf_counter() - started:.1f} s", flush=True)
        timings: dict[str, list[float]] = {"loaded": [], "rebuilt": []}
        for _ in range(args.repeats):
            for kind in ("loaded", "rebuilt"):
                trial = base / kind
                shutil.rmtree(trial, ignore_errors=True)
                shutil.copytree(base / "saved", trial)
                if kind == "rebuilt":
                    for path in (trial / "corpus").glob("knn_hnsw.*.faiss"):
                        path.unlink()
                done = subprocess.run([sys.executable, __file__, "--worker", str(trial), "--chunks", str(args.chunks),
                                       "--added", str(args.added)], capture_output=True, text=True)
                line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode or not line:
                    raise SystemExit(done.stderr[-3000:])
                result = json.loads(line[-1][7:])
                assert result["ann_index"].startswith(kind), result
                timings[kind].append(result["seconds"])
                print(f"  {kind}: {result['seconds']:.1f} s ({result['ann_index']})", flush=True)
        size = sum(p.stat().st_size for p in (base / "saved" / "corpus").glob("knn_hnsw.*.faiss")) / 2**20
        loaded, rebuilt = statistics.median(timings["loaded"]), statistics.median(timings["rebuilt"])
        print(f"\n| {args.chunks} chunks, add {args.added} in a fresh process | median s |")
        print("|---|---|")
        print(f"| saved HNSW index loaded ({size:.0f} MiB file) | {loaded:.1f} |")
        print(f"| HNSW index rebuilt from all vectors | {rebuilt:.1f} |")
        print(f"| loaded / rebuilt | {loaded / rebuilt:.2f} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
