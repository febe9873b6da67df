"""Scale benchmark of the KET-RAG skeleton: chunk KNN (both kinds) + PageRank + β-selection.

Why: the issue requires nothing quadratic in memory and time close to n·log n; this measures
both on generated corpora and prints the growth exponent log(t2/t1)/log(n2/n1) per stage.

Corpora: clustered random 384-d unit vectors (topics of ~50 chunks, subtopics of ~5) and word
lists drawn 70% from a global Zipf vocabulary and 30% from a per-topic Zipf vocabulary.
Each size runs in its own process, after a warm-up that loads faiss and BLAS. Memory is the
peak resident set size (RSS, read from /proc/self/statm every 5 ms by a sampling thread) above
the RSS when the stage started, so it covers numpy, scipy, faiss and polars allocations alike.

Then the add of one document in a fresh `lexgraph ingest` process, index load included, on a
synthetic index of --fresh-chunks chunks built once through lexgraph's own ingestion and cached
under .lexgraph/bench/ (benchmarks.fresh_add, benchmarks.synthetic_index say what is synthetic).

    python benchmarks/bench_scale.py --sizes 10000 50000 100000 --k 20 --mode approx
    python -m benchmarks.bench_scale --fresh-only --fresh-chunks 100000 --fresh-repeats 3
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lexgraph.indexing.knn import DEFAULT_K, DEFAULT_MAX_DF, lexical_knn, semantic_knn  # noqa: E402
from lexgraph.indexing.pagerank import pagerank  # noqa: E402
from lexgraph.indexing.skeleton import DEFAULT_BETA, select_skeleton, selection_diff  # noqa: E402
from lexgraph.cli import _positive_int  # noqa: E402  (the CLI's own check: at least 1, a clear message)

DIM = 384
WORDS_PER_CHUNK = 60
GLOBAL_VOCABULARY = 50_000
TOPIC_VOCABULARY = 300
CLUSTER_SIZE = 50
SUBTOPIC_SIZE = 5
DOC_CHUNKS = 20  # size of the document added in the incremental stage
RECALL_SAMPLE = 200
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


@contextmanager
def measured(results: dict[str, dict[str, float]], stage: str) -> Iterator[None]:
    """Wall time and peak RSS growth of the enclosed block."""
    start_rss, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
        peak[0] = max(peak[0], _rss())
        results[stage] = {"seconds": elapsed, "peak_mib": (peak[0] - start_rss) / 2**20}


def generate(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """Chunk ids, clustered unit vectors and Zipf word lists for n chunks.

    A vector is topic + 0.8·subtopic + 0.6·noise (each a random unit vector), normalised: cosine
    about 0.82 inside a subtopic of ~5 chunks, 0.5 inside a topic of ~50 and 0 across topics.
    """
    rng = np.random.default_rng(seed)

    def unit(rows: int) -> np.ndarray:
        raw = rng.normal(size=(rows, DIM)).astype(np.float32)
        return raw / np.linalg.norm(raw, axis=1, keepdims=True)

    topics = max(1, n // CLUSTER_SIZE)
    subtopic = rng.integers(0, max(1, n // SUBTOPIC_SIZE), n)
    topic = subtopic % topics
    vectors = unit(topics)[topic] + 0.8 * unit(int(subtopic.max()) + 1)[subtopic] + 0.6 * unit(n)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    hashes = rng.integers(0, 2**32, n)
    ids = np.array([f"doc{i // DOC_CHUNKS:06d}-c{i % DOC_CHUNKS:05d}-{h:08x}" for i, h in enumerate(hashes)])
    topical = rng.random((n, WORDS_PER_CHUNK)) < 0.3
    ranks = rng.zipf(1.2, size=(n, WORDS_PER_CHUNK))
    global_words = np.char.add("w", (ranks % GLOBAL_VOCABULARY).astype(str))
    prefix = np.char.add(np.char.add("t", topic.astype(str)), "_")
    topic_words = np.char.add(prefix[:, None], (ranks % TOPIC_VOCABULARY).astype(str))
    words = np.where(topical, topic_words, global_words).tolist()
    return ids, vectors, words


def largest_component_share(ids: np.ndarray, edges: pl.DataFrame) -> float:
    position = {chunk: i for i, chunk in enumerate(ids.tolist())}
    src = np.array([position[c] for c in edges["src"].to_list()], dtype=np.int64)
    dst = np.array([position[c] for c in edges["dst"].to_list()], dtype=np.int64)
    graph = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(len(ids), len(ids)))
    _, labels = connected_components(graph, directed=False)
    return float(np.bincount(labels).max() / len(ids))


def semantic_recall(state: pl.DataFrame, ids: np.ndarray, vectors: np.ndarray, k: int) -> float:
    """Share of the exact top-k found, on a sample of chunks (brute force for the sample only)."""
    rng = np.random.default_rng(1)
    sample = rng.choice(len(ids), min(RECALL_SAMPLE, len(ids)), replace=False)
    sims = vectors[sample] @ vectors.T
    sims[np.arange(len(sample)), sample] = -np.inf
    exact = np.argsort(-sims, axis=1)[:, :k]
    found = state.group_by("chunk_id").agg(pl.col("neighbor_id"))
    lists = dict(zip(found["chunk_id"].to_list(), found["neighbor_id"].to_list()))
    hits = [len(set(ids[exact[i]].tolist()) & set(lists.get(ids[s], []))) for i, s in enumerate(sample)]
    return float(np.sum(hits) / (k * len(sample)))


def run_one(n: int, k: int, mode: str, max_df: int) -> dict[str, object]:
    ids, vectors, words = generate(n + DOC_CHUNKS, seed=n)
    doc_ids, doc_vectors, doc_words = ids[n:], vectors[n:], words[n:]
    ids, vectors, words = ids[:n], vectors[:n], words[:n]
    # Load faiss and BLAS and let them set up their threads before anything is measured.
    semantic_knn(ids[:50], vectors[:50], k, mode=mode)  # type: ignore[arg-type]
    stages: dict[str, dict[str, float]] = {}
    with measured(stages, "knn_semantic"):
        semantic = semantic_knn(ids, vectors, k, mode=mode)  # type: ignore[arg-type]
    with measured(stages, "knn_lexical"):
        lexical = lexical_knn(ids, words, k, max_df=max_df)
    edges = pl.concat([semantic.edges(), lexical.edges()])
    with measured(stages, "pagerank"):
        scores = pagerank(semantic.chunk_ids, edges["src"], edges["dst"], edges["weight"])
    with measured(stages, "selection"):
        selected = select_skeleton(semantic.chunk_ids, scores, DEFAULT_BETA)
    with measured(stages, "add_document"):
        semantic.add(doc_ids, doc_vectors)
        lexical.add(doc_ids, doc_words)
        new_edges = pl.concat([semantic.edges(), lexical.edges()])
        new_scores = pagerank(semantic.chunk_ids, new_edges["src"], new_edges["dst"], new_edges["weight"])
        reselected = select_skeleton(semantic.chunk_ids, new_scores, DEFAULT_BETA)
        documents = {chunk: chunk.split("-")[0] for chunk in ids.tolist()}
        diff = selection_diff(selected.tolist(), reselected.tolist(), documents)
    recall = semantic_recall(semantic.state_frame(), ids, vectors, k) if mode == "approx" else 1.0
    return {
        "n": n,
        "k": k,
        "stages": stages,
        "edges": edges.height,
        "largest_component": largest_component_share(ids, edges),
        "churn": len(diff.newly_selected) + len(diff.deselected),
        "recall": recall,
    }


def print_report(rows: list[dict[str, object]]) -> None:
    stage_names = ["knn_semantic", "knn_lexical", "pagerank", "selection", "add_document"]
    print(f"{'n':>8} {'k':>3} {'stage':<14} {'seconds':>9} {'peak MiB':>9}")
    for row in rows:
        stages = row["stages"]
        total = sum(stages[s]["seconds"] for s in stage_names[:4])  # type: ignore[index]
        for stage in stage_names:
            values = stages[stage]  # type: ignore[index]
            print(f"{row['n']:>8} {row['k']:>3} {stage:<14} {values['seconds']:>9.3f} {values['peak_mib']:>9.1f}")
        print(f"{row['n']:>8} {row['k']:>3} {'total (build)':<14} {total:>9.3f}")
    print()
    print(f"{'n':>8} {'k':>3} {'edges':>9} {'largest comp':>13} {'semantic recall':>16} {'churn (+1 doc)':>16}")
    for row in rows:
        print(
            f"{row['n']:>8} {row['k']:>3} {row['edges']:>9} {row['largest_component']:>13.4f} "
            f"{row['recall']:>16.4f} {row['churn']:>16}"
        )
    print()
    print("growth exponent log(t2/t1)/log(n2/n1); n·log n alone gives ~1.05-1.10 over these ranges")
    for k in sorted({int(row["k"]) for row in rows}):  # type: ignore[call-overload]
        series = [row for row in rows if row["k"] == k]
        for small, large in zip(series, series[1:]):
            ratio = math.log(large["n"] / small["n"])  # type: ignore[operator]
            parts = []
            for stage in stage_names:
                t1 = small["stages"][stage]["seconds"]  # type: ignore[index]
                t2 = large["stages"][stage]["seconds"]  # type: ignore[index]
                parts.append(f"{stage}={math.log(t2 / t1) / ratio:.2f}")
            print(f"k={k} {small['n']}->{large['n']}: " + "  ".join(parts))


# The retired 10 s target's regression guard (issue 42): what an add costs may grow with the index, this much
GUARD_RATIO = 3.0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def fresh_process_add(args: argparse.Namespace) -> int:
    """The fresh-process add at --fresh-chunks, and (unless --no-guard) at --guard-chunks as its baseline in the
    same command; 1 when the add costs more than --guard-limit (GUARD_RATIO) × the baseline's."""
    from benchmarks import fresh_add
    from benchmarks.synthetic_index import CorpusSpec

    def one(chunks: int, breakdown: bool):
        spec = CorpusSpec(chunks, min(args.fresh_doc_chunks, chunks))
        result = fresh_add.measure(spec, args.fresh_repeats, args.fresh_new_chunks, args.fresh_cache,
                                   breakdown=breakdown, log=lambda line: print(line, flush=True))
        print("\n".join(fresh_add.report(result)), flush=True)
        return result

    baseline = None if args.no_guard else one(args.guard_chunks, breakdown=False)
    result = one(args.fresh_chunks, breakdown=not args.no_breakdown)
    if baseline is None:
        return 0
    ratio = result.median_seconds / baseline.median_seconds
    verdict = "ok" if ratio <= args.guard_limit else "REGRESSION"
    print(f"add-guard chunks={args.fresh_chunks} baseline_chunks={args.guard_chunks} "
          f"add_s={result.median_seconds:.2f} baseline_s={baseline.median_seconds:.2f} ratio={ratio:.2f} "
          f"limit={args.guard_limit:g} {verdict}", flush=True)
    return 0 if ratio <= args.guard_limit else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--k", type=int, nargs="+", default=[DEFAULT_K], help="one or more K values")
    parser.add_argument("--mode", choices=["exact", "approx"], default="approx")
    parser.add_argument("--max-df", type=int, default=DEFAULT_MAX_DF)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child process: one size, one k
    fresh = parser.add_argument_group("fresh-process add (a synthetic index, one new document, `lexgraph ingest`)")
    fresh.add_argument("--fresh-chunks", type=_positive_int, default=100_000, help="chunks in the synthetic index")
    fresh.add_argument("--fresh-doc-chunks", type=_positive_int, default=100, help="chunks per synthetic document")
    fresh.add_argument("--fresh-new-chunks", type=_positive_int, default=DOC_CHUNKS, help="chunks of the added document")
    fresh.add_argument("--fresh-repeats", type=_positive_int, default=3, help="timed repeats (the median is reported)")
    fresh.add_argument("--fresh-cache", type=Path, help="folder of cached synthetic indexes (default .lexgraph/bench)")
    fresh.add_argument("--fresh-only", action="store_true", help="only the fresh-process add")
    fresh.add_argument("--no-fresh", action="store_true", help="skip the fresh-process add")
    fresh.add_argument("--no-breakdown", action="store_true", help="skip the untimed repeat that gives step timings")
    fresh.add_argument("--guard-chunks", type=_positive_int, default=1_000,
                       help="the guard's baseline index: the add must cost at most --guard-limit × the add here")
    fresh.add_argument("--guard-limit", type=_positive_float, default=GUARD_RATIO,
                       help=f"the largest ratio of the add to the baseline's that passes (default {GUARD_RATIO:g})")
    fresh.add_argument("--no-guard", action="store_true", help="skip the baseline add and the guard")
    args = parser.parse_args()
    if args.fresh_only and args.no_fresh:
        parser.error("--fresh-only and --no-fresh exclude each other")
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.k[0], args.mode, args.max_df)))
        return 0
    if args.fresh_only:
        return fresh_process_add(args)
    rows = []
    for k in args.k:
        for n in sorted(args.sizes):
            options = ["--k", str(k), "--mode", args.mode, "--max-df", str(args.max_df)]
            command = [sys.executable, __file__, "--one", str(n), *options]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(output.strip().splitlines()[-1]))
    print(f"mode={args.mode} max_df={args.max_df} beta={DEFAULT_BETA} dim={DIM} cores={os.cpu_count()}")
    print_report(rows)
    if args.no_fresh:
        return 0
    print()
    return fresh_process_add(args)


if __name__ == "__main__":
    sys.exit(main())
