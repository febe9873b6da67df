"""Three parts of a one-document add to a large index, the way before round 8 against now, in one process.

Why: a whole add in a fresh process varies by ±3 s on these shared cores, more than each of these saves, so
each is timed alone on the same index (medians over alternating repeats):

- the SIMILAR diff's restore of chunks without edges (every add's new chunks have none yet): all 2.65M saved
  edges named by chunk id, then filtered, against naming only the rows that touch those chunks;
- the keyword diff's whole-table KEYWORD_IN count, planned from the keyword side against the chunk side;
- one document's statement vectors after its keyword sentences: embedded again, against reused inside the
  ingest's reusing_recent_vectors() block (the LLM-free extractor's statements repeat those sentences).

    python -m benchmarks.bench_add_parts .lexgraph/bench/synthetic-100000-100-7-g2/home/default/v7592b8fa
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_knn_edges import _alternating  # noqa: E402
from lexgraph.indexing import corpus_index as ci  # noqa: E402
from lexgraph.indexing.pipeline import CHUNKS, STATEMENTS  # noqa: E402
from lexgraph.extract.embedder import Embedder, reusing_recent_vectors  # noqa: E402
from lexgraph.extract.keywords import extract_keywords  # noqa: E402
from lexgraph.storage.extract_store import ExtractStore  # noqa: E402
from lexgraph.storage.graph_store import GraphStore  # noqa: E402


def restored_edges(index: Path, repeats: int) -> str:
    edges = ci.read_edges(ci.CorpusFiles(index))
    if edges is None:
        raise SystemExit(f"{index}: no whole KNN save to read")
    lost = list(np.random.default_rng(0).choice(edges.chunk_ids, min(20, len(edges.chunk_ids)), replace=False))
    touches = pl.col("src").is_in(lost) | pl.col("dst").is_in(lost)
    before, now = _alternating(lambda: edges.frame().filter(touches), lambda: edges.touching(lost).frame(), repeats)
    return f"restored edges of {len(lost)} chunks among {edges.height} edges: {before:.3f} s -> {now:.3f} s ({now / before:.2f}x)"


def keyword_link_count(index: Path, repeats: int) -> str:
    graph = GraphStore(index / "graph.kuzu")
    try:
        old = ("MATCH (a:Keyword)-[r:KEYWORD_IN]->(b:Chunk) WITH a.id AS s, b.id AS d RETURN count(*) AS n")
        counts = []
        before, now = _alternating(lambda: counts.append(graph.query(old)["n"][0]),
                                   lambda: counts.append(graph.count("KEYWORD_IN")), repeats)
    finally:
        graph.close()
    if len(set(counts)) != 1:
        raise SystemExit(f"the two counts disagree: {sorted(set(counts))}")
    return f"KEYWORD_IN count ({counts[0]} links): {before:.3f} s -> {now:.3f} s ({now / before:.2f}x)"


def statement_vectors(index: Path, repeats: int) -> str:
    store = ExtractStore(index / "extract")
    doc_id = store.doc_ids(STATEMENTS)[-1]
    chunks = store.read(CHUNKS, doc_id)
    sentences = extract_keywords(list(zip(chunks["chunk_id"], chunks["text"]))).sentences
    statements = store.read(STATEMENTS, doc_id)["text"].to_list()
    embedder = Embedder.shared()
    embedder.embed(["warm up"])

    def ingest(reusing: bool) -> None:
        with reusing_recent_vectors() if reusing else nullcontext():
            embedder.embed(sentences)
            embedder.embed(statements)

    before, now = _alternating(lambda: ingest(False), lambda: ingest(True), repeats)
    shared = len(set(statements) & set(sentences))
    return (f"{len(sentences)} keyword sentences then {len(statements)} statements ({shared} the same text) of one "
            f"document: {before:.3f} s -> {now:.3f} s ({now / before:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("index", type=Path, help="an index folder (the one holding corpus/, extract/, graph.kuzu)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for part in (restored_edges, keyword_link_count, statement_vectors):
        print(part(args.index, args.repeats), flush=True)


if __name__ == "__main__":
    main()
