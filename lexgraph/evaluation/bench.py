"""The retrieval benchmark: index a corpus once (cached by content hash), ask every question of
every method, and report recall, coverage and latency side by side (DESIGN.md §7).

Why the baselines run in the same process and over the same index: a figure for the graph
channels only means something next to NaiveRAG (dense) and BM25 measured on the same chunks,
questions and machine, so each table row is directly comparable to the others.

Corpus forms: a folder of .txt/.md files (indexed in place), a .zip of them (extracted once into
the cache), or one large text file, split into parts as :func:`split_text_file` says.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol, Sequence

import polars as pl

from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.answers import ENGINE_METHODS, EngineSearcher, answer_figures, build_engine, summarise_answers
from lexgraph.evaluation.corpus import BenchError, PreparedCorpus, prepare_corpus
from lexgraph.evaluation.report import answers_table, recall_svg, report_markdown, summary_table
from lexgraph.ids import document_key
from lexgraph.query.retrieval import DEFAULT_TOP_N, METHODS, Retriever, index_loader
from lexgraph.storage.vector_store import CHUNKS as CHUNK_TABLE, VectorStore
from lexgraph.query.retrieval_types import Hit, RetrievalParams
from lexgraph.settings import Settings


DEFAULT_BUDGET = 1024
DEFAULT_KS = (1, 3, 5, 10)



@dataclass
class IndexBuild:
    """What indexing cost: zero on a cached re-run (nothing is re-embedded)."""

    new: int = 0
    changed: int = 0
    unchanged: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    embedding_tokens: int = 0
    dagster_runs: int = 0
    reused: bool = False


class IngestOutcome(Protocol):
    """What an indexer reports back (orchestration.runner.IngestReport satisfies it)."""

    new: int
    changed: int
    unchanged: int
    failed: dict[str, str]
    runs: list[str]
    corpus_run: str | None
    corpus_index_ok: bool | None
    corpus_error: str | None


# Indexes a folder into an index home and brings the corpus-wide index up to date. The engine does
# not drive Dagster itself: the CLI hands in the Dagster runner (orchestration.cli).
CorpusIndexer = Callable[[Path, Path, bool], IngestOutcome]


def ensure_index(corpus: PreparedCorpus, indexer: CorpusIndexer, progress: bool = True) -> tuple[Settings, IndexBuild]:
    """Index new or changed files with the given indexer; unchanged files cost nothing. Without
    progress, the indexer's progress bar is swallowed too."""
    import io

    from lexgraph.extract.embedder import Embedder

    settings = Settings.from_env(home=corpus.index_home)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    before, start = embedder.stats.tokens, time.perf_counter()
    silence = contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())
    with silence:
        report = indexer(corpus.folder, corpus.index_home, True)
    if VectorStore(settings.lance_uri).count("chunks") == 0:
        problems = "; ".join(sorted(report.failed.values())[:3]) or "no readable text files"
        raise BenchError(f"{corpus.source}: no document could be indexed ({problems})")
    if report.corpus_index_ok is False:
        raise BenchError(f"{corpus.index_home}: the corpus-wide index (KNN graph, keywords) failed to build: "
                         f"{report.corpus_error}")
    build = IndexBuild(report.new, report.changed, report.unchanged, dict(report.failed),
                       time.perf_counter() - start, embedder.stats.tokens - before,
                       len(report.runs) + (1 if report.corpus_run else 0),
                       reused=report.new == 0 and report.changed == 0)
    _record_build(corpus.home, build)
    return settings, build


def _record_build(home: Path, build: IndexBuild) -> None:
    """Keep the first build's cost, so a cached re-run still reports what the index cost to make."""
    path = home / "index_build.json"
    history = json.loads(path.read_text()) if path.exists() else []
    if not build.reused or not history:
        history.append({**asdict(build), "at": datetime.now(timezone.utc).isoformat()})
        path.write_text(json.dumps(history, indent=1))


def build_cost(home: Path | None) -> dict:
    """Wall time and embedding tokens summed over every build of this cached index (model calls and their
    tokens are read from the index's cost ledger: index_cost_from_store)."""
    path = home / "index_build.json" if home else None
    history = json.loads(path.read_text()) if path and path.exists() else []
    return {"embedding_tokens": sum(h["embedding_tokens"] for h in history),
            "build_seconds": round(sum(h["seconds"] for h in history), 1),
            "builds": len([h for h in history if not h["reused"]])}


def index_cost_from_store(settings: Settings) -> dict:
    """What the index cost, read from its cost ledger (every model call, embeddings and LLM, cache hits
    included): LLM calls and prompt/completion tokens per stage, embedding tokens per stage. An index built
    before the ledger existed has none: its chunk embedding tokens are then recounted from the Extract store."""
    from lexgraph.ledger import CostLedger

    ledger = CostLedger(settings.ledger_dir).read()
    llm = ledger.filter(pl.col("stage") == "extraction")
    embedding = ledger.filter(pl.col("stage") != "extraction")
    by_stage = (ledger.group_by("stage").agg(pl.len().alias("calls"), pl.col("cache_hit").sum().alias("cache_hits"),
                                             pl.col("prompt_tokens").sum(), pl.col("completion_tokens").sum())
                .sort("stage"))
    cost = {"llm_calls": int(llm.height - llm["cache_hit"].sum()), "llm_cache_hits": int(llm["cache_hit"].sum()),
            "llm_prompt_tokens": int(llm["prompt_tokens"].sum()),
            "llm_completion_tokens": int(llm["completion_tokens"].sum()),
            "embedding_tokens_by_stage": {r["stage"]: int(r["prompt_tokens"]) for r in by_stage.iter_rows(named=True)
                                          if r["stage"] != "extraction"},
            "by_stage": {r["stage"]: {k: int(v) for k, v in r.items() if k != "stage"}
                         for r in by_stage.iter_rows(named=True)},
            "source": "ledger"}
    chunk_tokens = int(embedding.filter(pl.col("stage") == "embedding")["prompt_tokens"].sum())
    if not ledger.height:
        from lexgraph.indexing.pipeline import CHUNKS
        from lexgraph.storage.extract_store import ExtractStore

        scan = ExtractStore(settings.extract_dir).scan(CHUNKS)
        chunk_tokens = int(scan.select(pl.col("token_count").sum()).collect().item()) if scan is not None else 0
        cost["source"] = "recounted (no ledger)"
    cost["chunk_embedding_tokens"] = chunk_tokens
    return cost


def index_size(settings: Settings) -> dict[str, int]:
    """Bytes on disk per part of the index version (LanceDB, Kùzu, Extract Parquet, corpus state)."""
    root = Path(settings.index_dir)
    sizes: dict[str, int] = {}
    if root.exists():
        for child in sorted(root.iterdir()):
            if child.name.endswith(".lock"):
                continue  # the graph writer's lock file, not data
            files = [child] if child.is_file() else [p for p in child.rglob("*") if p.is_file()]
            sizes[child.name] = sum(p.stat().st_size for p in files)
    sizes["total"] = sum(sizes.values())
    return sizes


# ---------------------------------------------------------------------------------------------
# running the questions


@dataclass
class QuestionResult:
    method: str
    qid: str
    qtype: str
    latency_ms: float
    top_score: float | None
    documents: list[str]  # distinct document keys in rank order (first max-k)
    recall: dict[int, float | None]
    all_found: dict[int, bool | None]
    covered: bool | None
    route: str | None = None  # auto / answer: the route taken
    answer: dict | None = None  # answer: answer_figures


BENCH_METHODS = (*METHODS, *ENGINE_METHODS)


def top_n_for(ks: Sequence[int], budget: int) -> int:
    """Enough chunks for k distinct documents and for filling the budget with small chunks."""
    return max(DEFAULT_TOP_N, 5 * max(ks), math.ceil(budget / 32))


def ask(searcher: EngineSearcher, method: str, question: ev.Question, ks: Sequence[int], budget: int) -> QuestionResult:
    start = time.perf_counter()
    hits: list[Hit] = searcher.search(method, question.question, top_n_for(ks, budget))
    latency = (time.perf_counter() - start) * 1000
    keys = [h.doc_key for h in hits]
    covered = None if question.is_null else ev.coverage_at_budget(question.answer, hits, budget)
    last = searcher.last or {}
    return QuestionResult(
        method, question.qid, question.qtype, latency, hits[0].score if hits else None,
        ev.ranked_documents(keys, max(ks)),
        {k: ev.evidence_recall(keys, question.evidence, k) for k in ks},
        {k: ev.all_evidence_found(keys, question.evidence, k) for k in ks}, covered, last.get("route"),
        answer_figures(question, last["answer"]) if last.get("answer") is not None else None)


@contextlib.contextmanager
def single_threaded_torch():
    """Encode one query at a time on one thread: on a busy 2-core machine, torch's second thread
    waits for a core and a 20 ms query embedding takes 500 ms. Restored afterwards, since a Dagster
    run may go on to embed in bulk in the same process."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_questions(retriever: EngineSearcher, questions: Sequence[ev.Question], methods: Sequence[str],
                  ks: Sequence[int], budget: int, progress: bool = False) -> list[QuestionResult]:
    results = []
    for method in methods:
        retriever.search(method, "warm up before timing", 5)
        for i, question in enumerate(questions):
            results.append(ask(retriever, method, question, ks, budget))
            if progress and (i + 1) % 100 == 0:
                print(f"  {method}: {i + 1}/{len(questions)} questions", file=sys.stderr, flush=True)
    return results


def summarise(results: Sequence[QuestionResult], ks: Sequence[int]) -> dict:
    """Per method and question type (and overall): means of recall@k, all-found@k and coverage
    over the questions where they are defined, latency p50/p95, and for Null questions the mean
    top-hit score next to the answerable questions' (there is no answerer, so no abstention rate)."""
    summary: dict = {}
    for method in dict.fromkeys(r.method for r in results):
        mine = [r for r in results if r.method == method]
        groups = {t: [r for r in mine if r.qtype == t] for t in dict.fromkeys(r.qtype for r in mine)}
        groups = {t: groups[t] for t in sorted(groups, key=lambda t: (ev.QUESTION_TYPES + (t,)).index(t))}
        groups["overall"] = mine
        summary[method] = {name: _group_figures(group, ks) for name, group in groups.items()}
        answerable = [r.top_score for r in mine if r.qtype != "Null" and r.top_score is not None]
        null = [r.top_score for r in mine if r.qtype == "Null" and r.top_score is not None]
        summary[method]["overall"]["top_score_answerable"] = ev.mean(answerable)
        summary[method]["overall"]["top_score_null"] = ev.mean(null)
        routes = [r.route for r in mine if r.route]
        if routes:
            summary[method]["overall"]["routes"] = {route: routes.count(route) for route in sorted(set(routes))}
        answered = [r for r in mine if r.answer is not None]
        if answered:
            summary[method]["overall"]["answers"] = summarise_answers([(r.qtype == "Null", r.answer) for r in answered])
    return summary


def _group_figures(group: Sequence[QuestionResult], ks: Sequence[int]) -> dict:
    latencies = [r.latency_ms for r in group]
    with_evidence = [r for r in group if r.recall[ks[0]] is not None]
    return {
        "questions": len(group), "with_evidence": len(with_evidence),
        "recall": {k: ev.mean(r.recall[k] for r in group) for k in ks},
        "all_found": {k: ev.mean(r.all_found[k] for r in group) for k in ks},
        "coverage": ev.mean(r.covered for r in group), "coverage_questions": sum(r.covered is not None for r in group),
        "latency_ms_p50": ev.percentile(latencies, 50), "latency_ms_p95": ev.percentile(latencies, 95),
    }


def unmatched_evidence(questions: Sequence[ev.Question], doc_keys: set[str]) -> list[str]:
    """Evidence ids that name no indexed document: a wrong corpus or id format shows here."""
    return sorted({e for q in questions for e in q.evidence if e not in doc_keys})


# ---------------------------------------------------------------------------------------------
# entry points


@dataclass
class BenchReport:
    data: dict
    markdown: str
    out_dir: Path

    @property
    def table(self) -> str:
        return self.data["table_markdown"]


def evaluate_index(settings: Settings, questions_path: str | Path, budget: int = DEFAULT_BUDGET,
                   ks: Sequence[int] = DEFAULT_KS, out_dir: str | Path | None = None,
                   methods: Sequence[str] = BENCH_METHODS, params: RetrievalParams | None = None,
                   corpus_info: dict | None = None, build: IndexBuild | None = None,
                   cost: dict | None = None, progress: bool = False) -> BenchReport:
    """Run the questions over an existing index and write report.md / report.json to out_dir."""
    from lexgraph.extract.embedder import Embedder

    ks = tuple(sorted(set(ks)))
    if not ks or ks[0] < 1:
        raise BenchError(f"k values must be positive integers, got {ks}")
    unknown = [m for m in methods if m not in BENCH_METHODS]
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(unknown)}; expected some of {', '.join(BENCH_METHODS)}")
    try:
        questions = ev.load_questions(questions_path)
    except ev.QuestionsFileError as error:
        raise BenchError(str(error)) from None
    params = params or RetrievalParams()
    load, _ = index_loader(settings)  # the query backend the settings choose, as `ask` and `serve` do
    index = load(settings, params)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    tokens_before = embedder.stats.tokens
    retriever = Retriever(index, embedder.embed_query, params, embedder.embed_queries)
    engine = build_engine(retriever, budget) if set(methods) & set(ENGINE_METHODS) else None
    started = time.perf_counter()
    with single_threaded_torch():
        results = run_questions(EngineSearcher(retriever, engine), questions, methods, ks, budget, progress)
    doc_keys = {document_key(p) for p in VectorStore(settings.lance_uri).scan(CHUNK_TABLE, ["source_path"])
                ["source_path"].unique().to_list()}
    missing = unmatched_evidence(questions, doc_keys)
    data = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "corpus": corpus_info or {"index_dir": str(settings.index_dir)},
        "questions": {"path": str(questions_path), "count": len(questions),
                      "by_type": {t: sum(q.qtype == t for q in questions) for t in dict.fromkeys(q.qtype for q in questions)},
                      "unmatched_evidence_ids": missing},
        "settings": {"index_version": settings.index_version, "embed_model": settings.embed_model,
                     "chunk_tokens": settings.chunk_tokens, "budget_tokens": budget, "ks": list(ks),
                     "methods": list(methods), "retrieval": asdict(params), "top_n_chunks": top_n_for(ks, budget),
                     "query_torch_threads": 1},
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "index": {"chunks": index.size, "documents": len(doc_keys), "size_bytes": index_size(settings),
                  "cost": {**index_cost_from_store(settings), **(cost or {})},
                  "build_this_run": asdict(build) if build else None},
        "query_embedding_tokens": embedder.stats.tokens - tokens_before,
        "evaluation_seconds": round(time.perf_counter() - started, 1),
        "summary": summarise(results, ks),
        "per_question": [asdict(r) for r in results],
    }
    data["table_markdown"] = summary_table(data["summary"], ks, budget)
    answers = answers_table(data["summary"])
    if answers:
        data["table_markdown"] += "\n\n" + answers
    markdown = report_markdown(data)
    out = Path(out_dir) if out_dir else Path(settings.index_dir).parent / "bench-report"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(markdown)
    (out / "recall_at_k.svg").write_text(recall_svg(data["summary"], ks))
    return BenchReport(data, markdown, out)


def run_bench(corpus: str | Path, questions: str | Path, indexer: CorpusIndexer, budget: int = DEFAULT_BUDGET,
              ks: Sequence[int] = DEFAULT_KS, out_dir: str | Path | None = None,
              cache_root: str | Path | None = None, methods: Sequence[str] = BENCH_METHODS,
              params: RetrievalParams | None = None, progress: bool = True) -> BenchReport:
    """Prepare and (once) index the corpus, then evaluate every method on the questions.

    The questions file is validated before anything is indexed, so a typo costs nothing.
    """
    try:
        ev.load_questions(questions)
    except ev.QuestionsFileError as error:
        raise BenchError(str(error)) from None
    cache_root = Path(cache_root) if cache_root else Settings.from_env().home
    prepared = prepare_corpus(corpus, cache_root)
    settings, build = ensure_index(prepared, indexer, progress=progress)
    info = {"path": str(prepared.source), "kind": prepared.kind, "sha256": prepared.corpus_hash,
            "folder": str(prepared.folder), "index_dir": str(settings.index_dir),
            "files": build.new + build.changed + build.unchanged, "failed_files": build.failed}
    out = out_dir or prepared.home / "report"
    return evaluate_index(settings, questions, budget, ks, out, methods, params, info, build,
                          build_cost(prepared.home), progress)


def parse_params(assignments: Sequence[str] | None) -> RetrievalParams:
    """RetrievalParams with NAME=VALUE overrides (``decompose=false``, ``fusion=rrf``,
    ``fusion_weights=dense:0.5,bm25:1,keyword:0``), so every ablation is one reproducible command."""
    import dataclasses

    params = RetrievalParams()
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    changes: dict = {}
    for assignment in assignments or []:
        name, _, raw = assignment.partition("=")
        name, raw = name.strip(), raw.strip()
        if name not in fields or not raw:
            raise BenchError(f"--param {assignment!r}: expected NAME=VALUE with NAME one of {', '.join(fields)}")
        current = fields[name]
        try:
            if isinstance(current, bool):
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                changes[name] = raw.lower() in ("true", "1", "yes")
            elif isinstance(current, tuple):
                changes[name] = tuple((c, float(w)) for c, w in (item.split(":") for item in raw.split(",")))
            else:
                changes[name] = type(current)(raw)
        except ValueError:
            raise BenchError(f"--param {assignment!r}: {raw!r} is not a valid {type(current).__name__}") from None
    return dataclasses.replace(params, **changes)


def command(corpus: str, questions: str, budget: int, ks: str, out: str | None, home: str | None,
            indexer: CorpusIndexer, methods: str | None = None, quiet: bool = False,
            params: Sequence[str] | None = None) -> int:
    """`lexgraph bench`: print the table; exit 2 with a one-line reason on unusable input."""
    try:
        k_values = tuple(int(k) for k in ks.split(",") if k.strip())
    except ValueError:
        print(f"error: --k must be comma-separated integers, got {ks!r}", file=sys.stderr)
        return 2
    chosen = tuple(m.strip() for m in methods.split(",")) if methods else BENCH_METHODS
    if budget <= 0:
        print(f"error: --budget must be a positive number of tokens, got {budget}", file=sys.stderr)
        return 2
    try:
        report = run_bench(corpus, questions, indexer, budget, k_values, out, home, chosen, parse_params(params),
                           progress=not quiet)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    build = report.data["index"]["build_this_run"] or {}
    print(f"corpus {report.data['corpus']['path']}: {build.get('new', 0)} new, {build.get('changed', 0)} changed, "
          f"{build.get('unchanged', 0)} unchanged document(s); index {report.data['corpus']['index_dir']}")
    missing = report.data["questions"]["unmatched_evidence_ids"]
    if missing:
        print(f"warning: {len(missing)} evidence id(s) name no indexed document, e.g. {', '.join(missing[:3])}",
              file=sys.stderr)
    print(report.table)
    print(f"\nreport: {report.out_dir / 'report.md'} and report.json")
    return 0


