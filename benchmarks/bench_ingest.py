"""Ingest a corpus through the Dagster asset graph and directly, in one process; print throughput,
peak memory and the Dagster/direct wall-time ratio (median over repeats, rotating order).

Both paths run the same per-document stages (source, chunks, vectors, keywords, graph load); the
corpus-wide assets are measured by bench_incremental and bench_scale."""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg

from benchmarks.common import median, peak_rss_mb, prepare_corpus
from lexgraph.extract.embedder import Embedder
from lexgraph.ids import document_id
from lexgraph.indexing.pipeline import ingest_directly
from lexgraph.settings import Settings
from lexgraph.inbox import iter_corpus_files
from lexgraph.storage.vector_store import VectorStore
from orchestration.runner import ingest_folder


def run_direct(corpus: Path, home: Path, embedder: Embedder) -> tuple[float, int, int]:
    paths = {document_id(p.relative_to(corpus).as_posix()): p for p in iter_corpus_files(corpus)}
    start = time.perf_counter()
    results = ingest_directly(paths, corpus, Settings.from_env(home=home), embedder)
    return time.perf_counter() - start, len(results["graph"].done), results["chunks"].rows


def _instance(kind: str):
    """sqlite: a persistent instance as `make dev` uses; memory: the CLI's ephemeral instance."""
    return dg.instance_for_test() if kind == "sqlite" else dg.DagsterInstance.ephemeral()


def run_dagster(corpus: Path, home: Path, kind: str) -> tuple[float, int, int]:
    with _instance(kind) as instance:
        start = time.perf_counter()
        ingest_folder(corpus, instance, home=str(home), progress=True, corpus=False)  # as the CLI runs it
        elapsed = time.perf_counter() - start
    store = VectorStore(Settings.from_env(home=home).lance_uri)
    return elapsed, store.count("sources"), store.count("chunks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", required=True, help="folder of documents or a .zip of them")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    corpus = prepare_corpus(args.corpus)
    n_files = len(iter_corpus_files(corpus))
    embedder = Embedder.shared(backend=Settings.from_env().embed_backend)
    embedder.embed(["warm up the model before timing"])
    base_mb = peak_rss_mb()
    modes = ["direct", "dagster-memory", "dagster-sqlite"]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    docs = chunks = 0
    for repeat in range(args.repeats):
        for mode in modes[repeat % 3:] + modes[: repeat % 3]:  # rotate the order against drift
            home = Path(tempfile.mkdtemp(prefix=f"lexgraph-bench-{mode}-"))
            if mode == "direct":
                elapsed, docs, chunks = run_direct(corpus, home, embedder)
            else:
                elapsed, docs, chunks = run_dagster(corpus, home, mode.split("-")[1])
            times[mode].append(elapsed)
            shutil.rmtree(home, ignore_errors=True)
            print(f"repeat {repeat + 1} {mode:>15}: {elapsed:7.2f} s  ({docs} documents, {chunks} chunks)", flush=True)
    direct = median(times["direct"])
    print()
    print(f"corpus: {args.corpus} ({n_files} files)  repeats: {args.repeats}  model: {embedder.model_name}")
    print("| path | median wall s | documents/s | chunks/s | ratio to direct |")
    print("|---|---|---|---|---|")
    for mode in modes:
        value = median(times[mode])
        print(f"| {mode} | {value:.2f} | {docs / value:.1f} | {chunks / value:.1f} | {value / direct:.3f} |")
    print("\ntarget: Dagster overhead <= 25% of direct (ratio <= 1.25)")
    print(f"peak RSS: {peak_rss_mb():.0f} MB (after model load: {base_mb:.0f} MB)")


if __name__ == "__main__":
    main()
