"""`lexgraph` command line: inspect the index and search it. Ingestion and the bench's indexing drive
Dagster, so they are handed in by orchestration.cli, the console-script entry point."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from lexgraph.evaluation.answers import ENGINE_METHODS
from lexgraph.query.retrieval import METHODS
from lexgraph.settings import Settings, SettingsError


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(home=args.home or None)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.ingest is None:
        print("error: ingestion runs through Dagster; use the `lexgraph` console script (orchestration.cli)",
              file=sys.stderr)
        return 2
    if not args.path.strip():
        print("error: PATH is empty; name the folder of documents to ingest", file=sys.stderr)
        return 2
    path = Path(args.path)
    if not path.is_dir():
        print(f"error: {path}: not a folder of documents", file=sys.stderr)
        return 2
    settings = _settings(args)  # validated before anything is read or imported
    try:
        report = args.ingest(path, settings, prune=args.prune, progress=not args.quiet)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as error:  # the folder itself
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"ingested {path}: {report.new} new, {report.changed} changed, {report.unchanged} unchanged, "
          f"{report.removed} removed, {len(report.failed)} failed, in {len(report.runs)} Dagster run(s)"
          + (" and a corpus index update" if report.corpus_run else ""))
    for problem in sorted(report.failed.values()):
        print(f"  failed: {problem}")
    for problem in sorted(getattr(report, "repaired", {}).values()):
        print(f"  re-ingested (damaged extract file): {problem}")
    for run_id in getattr(report, "abandoned_runs", []):
        print(f"  marked failed: run {run_id}, whose process was killed before it finished")
    if report.corpus_index_ok is False:
        print("error: the corpus-wide index update (KNN graph, PageRank, skeleton, keywords) failed: "
              f"{report.corpus_error or 'see the Dagster run log'}\n"
              "  the next `lexgraph ingest` (or sensor tick) retries it", file=sys.stderr)
        return 1
    return 1 if report.failed and args.strict else 0


def cmd_status(args: argparse.Namespace) -> int:
    import polars as pl

    from lexgraph.index import LexIndex
    from lexgraph.storage.graph_store import GraphStore

    settings = _settings(args)
    index = LexIndex(settings)
    vectors = index.vectors
    print(f"index {settings.index_dir} (collection {settings.collection}, version {settings.index_version})")
    others = _other_versions(settings)
    if others:  # after an upgrade that changes the version, the old index is still on disk but no longer read
        print(f"  other index versions in this collection, not read (built by another chunker, model or chunk "
              f"size; delete a folder to free its space): {', '.join(others)}")
    print(f"  lancedb sources: {vectors.count('sources')}  chunks: {vectors.count('chunks')}")
    try:
        graph = GraphStore(settings.graph_path)
        counts = {t: graph.count(t) for t in ("Source", "Chunk", "PART_OF", "NEXT", "SIMILAR", "Keyword", "KEYWORD_IN")}
        known = graph.tables()
        lexical = {t: graph.count(t) if t in known else 0 for t in ("Statement", "Topic", "Fact", "Entity")}
        graph.close()
        print("  kuzu " + "  ".join(f"{t}: {n}" for t, n in counts.items()))
        print("  lexical graph " + "  ".join(f"{t}: {n}" for t, n in lexical.items()))
    except RuntimeError as error:
        print(f"  kuzu: not readable now ({error}); a writer may hold it")
    skeleton = index.corpus_files.skeleton
    if skeleton.exists():
        selected = pl.read_parquet(skeleton)["selected"]
        print(f"  skeleton: {int(selected.sum())} of {selected.len()} chunks selected for extraction")
    extractor = f"openai ({settings.llm_model} at {_endpoint(settings.llm_base_url)})" \
        if settings.extractor == "openai" else "nlp (spaCy en_core_web_sm; no LLM endpoint configured)"
    calls = _llm_calls(settings)
    print(f"  extractor: {extractor}; LLM calls so far: {calls['calls']} ({calls['cache_hits']} cache hits, "
          f"{calls['prompt_tokens']} prompt + {calls['completion_tokens']} completion tokens)")
    catalog = vectors.sources()
    if catalog.height:
        print(f"  {'document':<56} {'chunks':>6}  path")
        for row in catalog.sort("relative_path").iter_rows(named=True):
            print(f"  {row['doc_id']:<56} {row['chunk_count']:>6}  {row['relative_path']}")
    return 0


def _other_versions(settings: Settings) -> list[str]:
    collection = Path(settings.index_dir).parent
    if not collection.is_dir():
        return []
    return sorted(p.name for p in collection.iterdir()
                  if p.is_dir() and p.name != settings.index_version and re.fullmatch(r"v[0-9a-f]{8}", p.name))


def _endpoint(url: str) -> str:
    """The endpoint without any user or password part."""
    from urllib.parse import urlparse

    parts = urlparse(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"


def _llm_calls(settings: Settings) -> dict[str, int]:
    """LLM extraction calls so far, from the cost ledger: calls that reached a model, and cache hits."""
    from lexgraph.indexing.lexical_extraction import EXTRACTION_STAGE
    from lexgraph.ledger import CostLedger

    totals = CostLedger(settings.ledger_dir).totals(by=["stage"])
    row = totals.filter(totals["stage"] == EXTRACTION_STAGE)
    if not row.height:
        return {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0}
    row = row.row(0, named=True)
    return {"calls": row["calls"] - row["cache_hits"], "cache_hits": row["cache_hits"],
            "prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"]}


def cmd_cost(args: argparse.Namespace) -> int:
    """Cost-ledger totals by stage and model: every model call, embeddings and LLM, cache hits included."""
    from lexgraph.ledger import CostLedger

    settings = _settings(args)
    ledger = CostLedger(settings.ledger_dir)
    totals = ledger.totals(by=["stage", "model"])
    print(f"cost ledger {settings.ledger_dir}")
    if not totals.height:
        print("  no model calls recorded yet")
        return 0
    header = f"  {'stage':<20} {'model':<28} {'calls':>7} {'cache hits':>10} {'requests':>8} " \
             f"{'prompt tokens':>13} {'completion tokens':>17} {'seconds':>8}"
    print(header)
    for row in totals.iter_rows(named=True):
        print(f"  {row['stage']:<20} {row['model']:<28} {row['calls']:>7} {row['cache_hits']:>10} {row['requests']:>8} "
              f"{row['prompt_tokens']:>13} {row['completion_tokens']:>17} {row['seconds']:>8.1f}")
    total = ledger.totals(by=[])
    if total.height:
        row = total.row(0, named=True)
        print(f"  {'total':<20} {'':<28} {row['calls']:>7} {row['cache_hits']:>10} {row['requests']:>8} "
              f"{row['prompt_tokens']:>13} {row['completion_tokens']:>17} {row['seconds']:>8.1f}")
    return 0


def cmd_reextract(args: argparse.Namespace) -> int:
    if args.reextract is None:
        print("error: re-extraction runs through Dagster; use the `lexgraph` console script (orchestration.cli)",
              file=sys.stderr)
        return 2
    settings = _settings(args)
    report = args.reextract(settings, progress=not args.quiet)
    if not report.documents:
        print("reextract: every document's extractions match the current extractors; nothing to do")
    else:
        print(f"reextracted {len(report.documents)} document(s) in {len(report.runs)} Dagster run(s): "
              f"{report.llm_calls} LLM call(s), {report.cache_hits} cache hit(s)")
        for doc_id, reason in sorted(report.documents.items())[:20]:
            print(f"  {doc_id}: {reason}")
        if len(report.documents) > 20:
            print(f"  ... and {len(report.documents) - 20} more")
    for problem in sorted(report.failed.values()):
        print(f"  failed: {problem}")
    if report.lexical_ok is False:
        print("error: the lexical graph rebuild failed; see the Dagster run log", file=sys.stderr)
        return 1
    return 1 if report.failed else 0


def cmd_search(args: argparse.Namespace) -> int:
    from lexgraph.index import LexIndex
    from lexgraph.query.retrieval import EmptyIndexError

    if not args.text.strip():
        print("error: the query is empty; give the text to search for", file=sys.stderr)
        return 2
    index = LexIndex(_settings(args))
    try:
        hits = index.search(args.text, args.k, args.method)
    except EmptyIndexError as error:
        print(f"error: {error}; run `lexgraph ingest PATH` with the same LEXGRAPH_* settings first",
              file=sys.stderr)
        return 2
    for rank, hit in enumerate(hits, 1):
        snippet = " ".join(hit.text.split())[:200]
        print(f"{rank}. {hit.citation}  score={hit.score:.3f}  {hit.heading_path or ''}\n   {snippet}")
    return 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535, got {value}")
    return value


def _empty_index_message(error: Exception) -> str:
    return f"error: {error}; run `lexgraph ingest PATH` with the same LEXGRAPH_* settings first"


def cmd_ask(args: argparse.Namespace) -> int:
    """One question: the answer and its numbered citations, or with --json exactly the answer JSON."""
    import json

    from lexgraph.query.retrieval import EmptyIndexError
    from lexgraph.query.service import QueryError, QueryService

    try:
        args.question.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line arrive as lone surrogates
        print("error: the question is not valid UTF-8 text", file=sys.stderr)
        return 2
    service = QueryService(_settings(args))
    try:
        answer = service.ask(args.question, route=args.route)
    except QueryError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except EmptyIndexError as error:
        print(_empty_index_message(error), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(answer, ensure_ascii=False))
        return 0
    # the short answer first (with what it is, for a span), then the sentence it came from, cited
    kind = answer.get("answer_type") or ""
    if answer.get("answer"):
        typed = f"  ({kind.replace('_', ' ')})" if kind not in ("", "sentence", "yes_no") else ""
        print(f"{answer['answer']}{typed}")
    else:
        print("(no answer)")
    for number, citation in enumerate(answer.get("citations") or [], 1):
        page = f" p. {citation['page']}" if citation.get("page") is not None else ""
        text = " ".join(str(citation.get("text") or "").split())
        text = text if len(text) <= 300 else text[:299] + "…"
        print(f"  {number}. [{citation['id']}] {citation['source']}{page} "
              f"[chars {citation['char_start']}–{citation['char_end']}]: \"{text}\"")
    flags = "".join(f"  {flag}" for flag in ("abstained", "uncertain") if answer.get(flag))
    confidence = answer.get("confidence")
    confidence = f"{confidence:.2f}" if isinstance(confidence, (int, float)) else confidence
    print(f"route: {answer.get('route')}  confidence: {confidence}{flags}  query id: {answer.get('query_id')}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """The audit bundle of one answer (lexgraph.query.audit): print the path written."""
    from lexgraph.query.audit import AuditError, UnknownQueryError, bundle_format, write_audit_bundle

    if args.out is not None:
        try:
            bundle_format(Path(args.out))  # before the settings are read: a typo costs nothing
        except AuditError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    try:
        written = write_audit_bundle(_settings(args), args.query_id, args.out)
    except UnknownQueryError as error:
        print(f"error: {error.args[0] if error.args else error}; the ids are in the answers of `lexgraph ask` "
              "(query id) and in queries/log.jsonl under the index home", file=sys.stderr)
        return 2
    except AuditError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot write the audit bundle: {error}", file=sys.stderr)
        return 2
    print(written)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from lexgraph.query.http_api import ServeError, check_bind, resolve_token, serve

    settings = _settings(args)
    token = resolve_token(args.token, settings)
    try:
        check_bind(args.host, token)  # before the service or uvicorn are loaded
        serve(settings, args.host, args.port, token)
    except ServeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from lexgraph.evaluation.bench import command

    if args.indexer is None:
        print("error: the bench indexes its corpus through Dagster; use the `lexgraph` console script "
              "(orchestration.cli)", file=sys.stderr)
        return 2
    return command(args.corpus, args.questions, args.budget, args.k, args.out, args.home, args.indexer,
                   args.methods, args.quiet, args.param)


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
    status = sub.add_parser("status", help="counts per table and per document, and the LLM calls so far")
    status.set_defaults(func=cmd_status)
    cost = sub.add_parser("cost", help="cost-ledger totals by stage and model (LLM and embedding calls)")
    cost.set_defaults(func=cmd_cost)
    reextract = sub.add_parser("reextract", help="re-run extraction for every document whose extractions no longer "
                               "match the extractors (after a prompt, model or entity-type change), via Dagster")
    reextract.add_argument("--quiet", action="store_true", help="no progress bar")
    reextract.set_defaults(func=cmd_reextract)
    search = sub.add_parser("search", help="search the indexed chunks")
    search.add_argument("text")
    search.add_argument("-k", type=_positive_int, default=5, help="number of hits (at least 1)")
    search.add_argument("--method", choices=METHODS, default="hybrid",
                        help="retrieval method (default hybrid: dense + BM25 + keyword fused)")
    search.set_defaults(func=cmd_search)
    ask = sub.add_parser("ask", help="answer a question with citations (extractive without an LLM)")
    ask.add_argument("question")
    ask.add_argument("--route", choices=("auto", "semantic", "graph", "agentic"), default="auto",
                     help="retrieval route (default auto: the router decides)")
    ask.add_argument("--json", action="store_true", help="print the answer JSON (one object) instead of text")
    ask.set_defaults(func=cmd_ask)
    audit = sub.add_parser(
        "audit", help="write the audit bundle of one answer: one self-contained .html (or .json) file",
        description="Write the audit bundle of one answer: one self-contained file an auditor can archive, with "
        "the same content as GET /provenance/QUERY_ID. It holds the question, the answer, the route with its "
        "router log line, every citation with its span highlighted (<mark>) in the stored source text, the "
        "source versions (sha256), the extractor, model and prompt version of each cited statement, and the "
        "index and lexgraph versions. The .html page loads nothing and runs no script, so it opens offline; "
        ".json is the provenance JSON as the HTTP endpoint returns it. Prints the path written.",
        epilog="example: lexgraph audit q20261130163012-1a2b3c4d5e --out answer.html")
    audit.add_argument("query_id", metavar="QUERY_ID",
                       help="the query id printed by `lexgraph ask` (also in queries/log.jsonl under the index home)")
    audit.add_argument("--out", metavar="FILE.html|FILE.json",
                       help="file to write; the suffix chooses the format (default "
                       "<home>/queries/audit/QUERY_ID.html)")
    audit.set_defaults(func=cmd_audit)
    serve = sub.add_parser("serve", help="HTTP API: POST /ask, GET /provenance/{id}, GET /health (FastAPI, uvicorn)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1); any non-loopback host needs a token")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    serve.add_argument("--token", help="bearer token required by every endpoint but /health "
                       "(default $LEXGRAPH_SERVE_TOKEN; the variable keeps it out of the process list)")
    serve.set_defaults(func=cmd_serve)
    bench = sub.add_parser("bench", help="retrieval benchmark: every channel, the router (auto) and the answerer "
                           "(answer) side by side")
    bench.add_argument("--corpus", required=True, help="folder of .txt/.md files, a .zip of them, or one text file")
    bench.add_argument("--questions", required=True, help="JSON questions (LiHua-World object or list of {id, question, answer})")
    bench.add_argument("--budget", type=int, default=1024, help="context budget in word pieces for answer coverage")
    bench.add_argument("--k", default="1,3,5,10", help="comma-separated k for evidence recall@k")
    bench.add_argument("--out", help="report folder (default: beside the cached index)")
    bench.add_argument("--methods", help=f"comma-separated subset of {','.join((*METHODS, *ENGINE_METHODS))} "
                       "(default: all)")
    bench.add_argument("--param", action="append", metavar="NAME=VALUE",
                       help="override a retrieval knob (lexgraph.query.retrieval_types.RetrievalParams), e.g. decompose=false")
    bench.add_argument("--quiet", action="store_true", help="no progress output")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None, ingest=None, indexer=None, reextract=None) -> int:
    """ingest: runs an ingestion (path, settings, prune=, progress=) -> report; indexer: the bench's
    corpus indexer; reextract: the re-extraction backfill (settings, progress=) -> report. All drive Dagster,
    so orchestration.cli hands them in; the engine never imports it."""
    args = build_parser().parse_args(argv)
    args.ingest, args.indexer, args.reextract = ingest, indexer, reextract
    try:
        return args.func(args)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
