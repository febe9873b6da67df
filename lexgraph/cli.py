"""`lexgraph` command line: ingest through the Dagster asset graph, inspect the index, search it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lexgraph.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(home=Path(args.home)) if args.home else Settings()


def cmd_ingest(args: argparse.Namespace) -> int:
    # Ingestion goes through the Dagster asset graph, so the orchestration layer is imported here
    # only: the engine and the query commands run without Dagster installed.
    from orchestration.runner import ingest_with_default_instance

    path = Path(args.path)
    if not path.is_dir():
        print(f"error: {path}: not a folder of documents", file=sys.stderr)
        return 2
    report = ingest_with_default_instance(path, home=str(_settings(args).home), prune=args.prune,
                                          progress=not args.quiet)
    print(f"ingested {path}: {report.new} new, {report.changed} changed, {report.unchanged} unchanged, "
          f"{report.removed} removed, {len(report.failed)} failed, in {len(report.runs)} Dagster run(s)"
          + (" and a corpus index update" if report.corpus_run else ""))
    for problem in sorted(report.failed.values()):
        print(f"  failed: {problem}")
    if report.corpus_index_ok is False:
        print("error: the corpus-wide index update (KNN graph, PageRank, skeleton, keywords) failed; "
              "see the Dagster run log", file=sys.stderr)
        return 1
    return 1 if report.failed and args.strict else 0


def cmd_status(args: argparse.Namespace) -> int:
    import polars as pl

    from lexgraph.corpus_index import CorpusFiles
    from lexgraph.graph_store import GraphStore
    from lexgraph.vector_store import VectorStore

    settings = _settings(args)
    vectors = VectorStore(settings.lance_uri)
    print(f"index {settings.index_dir} (collection {settings.collection}, version {settings.index_version})")
    print(f"  lancedb sources: {vectors.count('sources')}  chunks: {vectors.count('chunks')}")
    try:
        graph = GraphStore(settings.graph_path)
        counts = {t: graph.count(t) for t in ("Source", "Chunk", "PART_OF", "NEXT", "SIMILAR", "Keyword", "KEYWORD_IN")}
        graph.close()
        print("  kuzu " + "  ".join(f"{t}: {n}" for t, n in counts.items()))
    except RuntimeError as error:
        print(f"  kuzu: not readable now ({error}); a writer may hold it")
    skeleton = CorpusFiles(settings.index_dir).skeleton
    if skeleton.exists():
        selected = pl.read_parquet(skeleton)["selected"]
        print(f"  skeleton: {int(selected.sum())} of {selected.len()} chunks selected for extraction")
    catalog = vectors.sources()
    if catalog.height:
        print(f"  {'document':<56} {'chunks':>6}  path")
        for row in catalog.sort("relative_path").iter_rows(named=True):
            print(f"  {row['doc_id']:<56} {row['chunk_count']:>6}  {row['relative_path']}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from lexgraph.embedder import Embedder
    from lexgraph.vector_store import VectorStore

    settings = _settings(args)
    vectors = VectorStore(settings.lance_uri)
    if vectors.count("chunks") == 0:
        print("error: the index is empty; run `lexgraph ingest PATH` first", file=sys.stderr)
        return 2
    query = Embedder.shared(settings.embed_model).embed([args.text])[0]
    hits = vectors.search_chunks(query, args.k)
    for rank, row in enumerate(hits.iter_rows(named=True), 1):
        snippet = " ".join(row["text"].split())[:200]
        print(f"{rank}. {row['source_path']} [chars {row['char_start']}-{row['char_end']}] "
              f"score={1 - row['_distance']:.3f}  {row['heading_path'] or ''}\n   {snippet}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from lexgraph.bench import command

    return command(args.corpus, args.questions, args.budget, args.k, args.out, args.home, args.methods, args.quiet,
                   args.param)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lexgraph", description=__doc__)
    parser.add_argument("--home", help="index folder (default $LEXGRAPH_HOME or .lexgraph)")
    sub = parser.add_subparsers(dest="command", required=True)
    ingest = sub.add_parser("ingest", help="index the files under PATH through the Dagster asset graph")
    ingest.add_argument("path")
    ingest.add_argument("--prune", action="store_true", help="also remove indexed documents no longer under PATH")
    ingest.add_argument("--quiet", action="store_true", help="no progress bar")
    ingest.add_argument("--strict", action="store_true", help="exit 1 when any document failed")
    ingest.set_defaults(func=cmd_ingest)
    status = sub.add_parser("status", help="counts per table and per document")
    status.set_defaults(func=cmd_status)
    search = sub.add_parser("search", help="vector search over chunks")
    search.add_argument("text")
    search.add_argument("-k", type=int, default=5)
    search.set_defaults(func=cmd_search)
    bench = sub.add_parser("bench", help="retrieval benchmark: dense, BM25, keyword and hybrid side by side")
    bench.add_argument("--corpus", required=True, help="folder of .txt/.md files, a .zip of them, or one text file")
    bench.add_argument("--questions", required=True, help="JSON questions (LiHua-World object or list of {id, question, answer})")
    bench.add_argument("--budget", type=int, default=1024, help="context budget in word pieces for answer coverage")
    bench.add_argument("--k", default="1,3,5,10", help="comma-separated k for evidence recall@k")
    bench.add_argument("--out", help="report folder (default: beside the cached index)")
    bench.add_argument("--methods", help="comma-separated subset of dense,bm25,keyword,hybrid")
    bench.add_argument("--param", action="append", metavar="NAME=VALUE",
                       help="override a retrieval knob (lexgraph.retrieval.RetrievalParams), e.g. decompose=false")
    bench.add_argument("--quiet", action="store_true", help="no progress output")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
