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
import hashlib
import json
import math
import os
import platform
import re
import shutil
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import polars as pl

from lexgraph import evaluation as ev
from lexgraph.ids import content_hash
from lexgraph.retrieval import DEFAULT_TOP_N, METHODS, Hit, RetrievalParams, Retriever, load_index
from lexgraph.settings import Settings
from lexgraph.sources import SUPPORTED_SUFFIXES, iter_corpus_files

DEFAULT_BUDGET = 1024
DEFAULT_KS = (1, 3, 5, 10)
# A single large file is cut into parts of at most this many characters (~1,000 word pieces).
SPLIT_CHARS = 4000
SPLITTER_VERSION = "1"
_HEADING = re.compile(r"^#{1,2}\s")


class BenchError(Exception):
    """A benchmark input that cannot be used (missing corpus, bad questions): CLI exit code 2."""


# ---------------------------------------------------------------------------------------------
# corpus preparation and the cached index


@dataclass(frozen=True)
class PreparedCorpus:
    source: Path  # what the user named
    folder: Path  # the folder that is indexed
    kind: str  # folder | zip | file
    corpus_hash: str
    home: Path  # the cache folder of this corpus: index/ and, for zip and file, corpus/

    @property
    def index_home(self) -> Path:
        return self.home / "index"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "corpus"


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _hash_folder(folder: Path) -> str:
    """Paths and contents of every file, so a renamed or edited file gives another index."""
    digest = hashlib.sha256()
    for path in iter_corpus_files(folder):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + _hash_file(path).encode() + b"\n")
    return digest.hexdigest()


def prepare_corpus(path: str | Path, cache_root: str | Path) -> PreparedCorpus:
    """Locate (or make) the folder to index and its cache home ``<cache_root>/bench/<name>-<hash>``."""
    source = Path(path)
    if not source.exists():
        raise BenchError(f"{source}: corpus not found (expected a folder of .txt/.md files, a .zip of them, "
                         "or one text file)")
    if source.is_dir():
        kind, corpus_hash = "folder", _hash_folder(source)
        if not iter_corpus_files(source):
            raise BenchError(f"{source}: the corpus folder holds no files")
    elif source.suffix.lower() == ".zip":
        kind, corpus_hash = "zip", _hash_file(source)
    elif source.suffix.lower() in SUPPORTED_SUFFIXES:
        kind, corpus_hash = "file", content_hash(f"{_hash_file(source)}|split{SPLITTER_VERSION}|{SPLIT_CHARS}")
    else:
        raise BenchError(f"{source}: unsupported corpus file type {source.suffix or '(none)'}; "
                         f"expected a folder, a .zip or one of {', '.join(SUPPORTED_SUFFIXES)}")
    home = Path(cache_root) / "bench" / f"{_slug(source.stem)}-{corpus_hash[:12]}"
    folder = source if kind == "folder" else home / "corpus"
    if kind != "folder":
        _materialise(source, kind, folder, corpus_hash)
    return PreparedCorpus(source, folder, kind, corpus_hash, home)


def _materialise(source: Path, kind: str, folder: Path, corpus_hash: str) -> None:
    """Extract or split once; a marker holding the hash says the folder is complete."""
    marker = folder / ".complete"
    if marker.exists() and marker.read_text().strip() == corpus_hash:
        return
    if folder.exists():
        shutil.rmtree(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if kind == "zip":
        _extract_zip(source, partial)
    else:
        for name, text in split_text_file(source):
            (partial / name).write_text(text, encoding="utf-8")
    (partial / ".complete").write_text(corpus_hash)
    partial.rename(folder)


def _extract_zip(source: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(source) as archive:
            root = target.resolve()
            for member in archive.infolist():
                destination = (target / member.filename).resolve()
                if root != destination and root not in destination.parents:
                    raise BenchError(f"{source}: archive member {member.filename!r} points outside the archive")
                name = Path(member.filename).name
                if member.is_dir() or name.startswith(".") or "__MACOSX" in member.filename:
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(archive.read(member))
    except zipfile.BadZipFile as error:
        raise BenchError(f"{source}: not a readable zip archive ({error})") from None


def split_text_file(path: Path, limit: int = SPLIT_CHARS) -> list[tuple[str, str]]:
    """One large file as documents: blank-line-separated paragraphs packed in order into parts of
    at most `limit` characters (a longer paragraph is a part of its own, the chunker cuts it
    further), and a Markdown heading of level 1 or 2 always opens a new part. Parts are named
    ``<stem>-part-0001<suffix>``, so evidence ids name parts."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not paragraphs:
        raise BenchError(f"{path}: the corpus file holds no text")
    parts: list[list[str]] = [[]]
    size = 0
    for paragraph in paragraphs:
        if parts[-1] and (size + len(paragraph) > limit or _HEADING.match(paragraph)):
            parts.append([])
            size = 0
        parts[-1].append(paragraph)
        size += len(paragraph) + 2
    suffix = path.suffix.lower() if path.suffix.lower() in (".md", ".markdown") else ".txt"
    return [(f"{path.stem}-part-{i:04d}{suffix}", "\n\n".join(part) + "\n") for i, part in enumerate(parts, 1)]


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


_QUIET_RUN = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@contextlib.contextmanager
def _private_dagster_instance():
    """The orchestration runner records into $DAGSTER_HOME's instance when it is set; the bench's
    cached index must not add its partitions to the user's dev instance (whose inbox sensor would
    then plan purges for them), so the variable is hidden and an ephemeral instance is used."""
    saved = os.environ.pop("DAGSTER_HOME", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["DAGSTER_HOME"] = saved


def ensure_index(corpus: PreparedCorpus, progress: bool = True) -> tuple[Settings, IndexBuild]:
    """Index new or changed files through the Dagster asset graph; unchanged files cost nothing.
    The orchestration layer is imported here only, as the CLI's ingest does: lexgraph itself never
    imports Dagster. Without progress, the progress bar is swallowed too (Dagster's console log is
    silenced while a bar is shown)."""
    import io

    from lexgraph.corpus_index import CorpusFiles
    from lexgraph.embedder import Embedder
    from lexgraph.vector_store import VectorStore
    from orchestration.definitions import build_definitions
    from orchestration.runner import ingest_with_default_instance

    defs = build_definitions(inbox_path=str(corpus.folder), home=str(corpus.index_home))
    settings = defs.resources["index"].settings()
    embedder = Embedder.shared(settings.embed_model)
    before, start = embedder.stats.tokens, time.perf_counter()
    silence = contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())
    with _private_dagster_instance(), silence:
        report = ingest_with_default_instance(corpus.folder, home=str(corpus.index_home), prune=True, progress=True)
        runs = len(report.runs)
        if VectorStore(settings.lance_uri).count("chunks") == 0:
            problems = "; ".join(sorted(report.failed.values())[:3]) or "no readable text files"
            raise BenchError(f"{corpus.source}: no document could be indexed ({problems})")
        files = CorpusFiles(settings.index_dir)
        if not (files.keyword_index.exists() and files.pagerank.exists() and files.skeleton.exists()):
            # A previous run stopped before the corpus assets: finish them now (ephemeral instance).
            result = defs.resolve_job_def("build_corpus_index").execute_in_process(
                run_config=_QUIET_RUN, raise_on_error=False)
            if not result.success:
                raise BenchError(f"{corpus.index_home}: the corpus-wide index (KNN graph, keywords) failed to build")
            runs += 1
    build = IndexBuild(report.new, report.changed, report.unchanged, dict(report.failed),
                       time.perf_counter() - start, embedder.stats.tokens - before, runs,
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
    """Embedding tokens and wall time summed over every build of this cached index; no LLM is used."""
    path = home / "index_build.json" if home else None
    history = json.loads(path.read_text()) if path and path.exists() else []
    return {"embedding_tokens": sum(h["embedding_tokens"] for h in history),
            "build_seconds": round(sum(h["seconds"] for h in history), 1),
            "builds": len([h for h in history if not h["reused"]]), "llm_calls": 0, "llm_prompt_tokens": 0,
            "llm_completion_tokens": 0}


def index_cost_from_store(settings: Settings) -> dict:
    """Embedding tokens recounted from the Extract store (chunk token counts); used when no build
    was recorded, e.g. for an index made by the Dagster sensors rather than by the bench."""
    from lexgraph.extract_store import ExtractStore
    from lexgraph.pipeline import CHUNKS

    scan = ExtractStore(settings.extract_dir).scan(CHUNKS)
    tokens = int(scan.select(pl.col("token_count").sum()).collect().item()) if scan is not None else 0
    return {"chunk_embedding_tokens": tokens, "llm_calls": 0, "llm_prompt_tokens": 0, "llm_completion_tokens": 0}


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


def top_n_for(ks: Sequence[int], budget: int) -> int:
    """Enough chunks for k distinct documents and for filling the budget with small chunks."""
    return max(DEFAULT_TOP_N, 5 * max(ks), math.ceil(budget / 32))


def ask(retriever: Retriever, method: str, question: ev.Question, ks: Sequence[int], budget: int) -> QuestionResult:
    start = time.perf_counter()
    hits: list[Hit] = retriever.search(method, question.question, top_n_for(ks, budget))
    latency = (time.perf_counter() - start) * 1000
    keys = [h.doc_key for h in hits]
    covered = None if question.is_null else ev.coverage_at_budget(question.answer, hits, budget)
    return QuestionResult(
        method, question.qid, question.qtype, latency, hits[0].score if hits else None,
        ev.ranked_documents(keys, max(ks)),
        {k: ev.evidence_recall(keys, question.evidence, k) for k in ks},
        {k: ev.all_evidence_found(keys, question.evidence, k) for k in ks}, covered)


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


def run_questions(retriever: Retriever, questions: Sequence[ev.Question], methods: Sequence[str],
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
                   methods: Sequence[str] = METHODS, params: RetrievalParams | None = None,
                   corpus_info: dict | None = None, build: IndexBuild | None = None,
                   cost: dict | None = None, progress: bool = False) -> BenchReport:
    """Run the questions over an existing index and write report.md / report.json to out_dir."""
    from lexgraph.embedder import Embedder

    ks = tuple(sorted(set(ks)))
    if not ks or ks[0] < 1:
        raise BenchError(f"k values must be positive integers, got {ks}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise BenchError(f"unknown method(s) {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
    try:
        questions = ev.load_questions(questions_path)
    except ev.QuestionsFileError as error:
        raise BenchError(str(error)) from None
    params = params or RetrievalParams()
    index = load_index(settings, params)
    embedder = Embedder.shared(settings.embed_model)
    tokens_before = embedder.stats.tokens
    retriever = Retriever(index, lambda text: embedder.embed([text])[0], params, embedder.embed)
    started = time.perf_counter()
    with single_threaded_torch():
        results = run_questions(retriever, questions, methods, ks, budget, progress)
    doc_keys = {ev.document_key(p) for p in index.chunks["source_path"].unique().to_list()}
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
    markdown = report_markdown(data)
    out = Path(out_dir) if out_dir else Path(settings.index_dir).parent / "bench-report"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    (out / "report.md").write_text(markdown)
    (out / "recall_at_k.svg").write_text(recall_svg(data["summary"], ks))
    return BenchReport(data, markdown, out)


def run_bench(corpus: str | Path, questions: str | Path, budget: int = DEFAULT_BUDGET,
              ks: Sequence[int] = DEFAULT_KS, out_dir: str | Path | None = None,
              cache_root: str | Path | None = None, methods: Sequence[str] = METHODS,
              params: RetrievalParams | None = None, progress: bool = True) -> BenchReport:
    """Prepare and (once) index the corpus, then evaluate every method on the questions.

    The questions file is validated before anything is indexed, so a typo costs nothing.
    """
    try:
        ev.load_questions(questions)
    except ev.QuestionsFileError as error:
        raise BenchError(str(error)) from None
    cache_root = Path(cache_root) if cache_root else Settings().home
    prepared = prepare_corpus(corpus, cache_root)
    settings, build = ensure_index(prepared, progress=progress)
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
            methods: str | None = None, quiet: bool = False, params: Sequence[str] | None = None) -> int:
    """`lexgraph bench`: print the table; exit 2 with a one-line reason on unusable input."""
    try:
        k_values = tuple(int(k) for k in ks.split(",") if k.strip())
    except ValueError:
        print(f"error: --k must be comma-separated integers, got {ks!r}", file=sys.stderr)
        return 2
    chosen = tuple(m.strip() for m in methods.split(",")) if methods else METHODS
    if budget <= 0:
        print(f"error: --budget must be a positive number of tokens, got {budget}", file=sys.stderr)
        return 2
    try:
        report = run_bench(corpus, questions, budget, k_values, out, home, chosen, parse_params(params),
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


# ---------------------------------------------------------------------------------------------
# rendering


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _all_found_k(ks: Sequence[int]) -> int:
    return 5 if 5 in ks else max(ks)


def summary_table(summary: dict, ks: Sequence[int], budget: int) -> str:
    """One row per method × question type: recall@k, all-found, coverage at the budget, latency."""
    ks = [int(k) for k in ks]
    k_all = _all_found_k(ks)
    head = ["method", "type", "n", *(f"R@{k}" for k in ks), f"all@{k_all}", f"cov@{budget}", "p50 ms", "p95 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, groups in summary.items():
        for name, g in groups.items():
            recall, found = _keyed(g["recall"]), _keyed(g["all_found"])
            cells = [method, name, str(g["questions"]), *(_fmt(recall.get(k)) for k in ks), _fmt(found.get(k_all)),
                     _fmt(g["coverage"]), _fmt(g["latency_ms_p50"], 1), _fmt(g["latency_ms_p95"], 1)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _keyed(values: dict) -> dict[int, float | None]:
    """JSON turns int keys into strings; accept both."""
    return {int(k): v for k, v in values.items()}


def ratio_table(summary: dict, k: int) -> str:
    """Recall@k of every method as a ratio to the dense and BM25 baselines, per question type."""
    baselines = [b for b in ("dense", "bm25") if b in summary]
    if not baselines:
        return ""
    types = [t for t in next(iter(summary.values())) if t != "Null"]
    head = ["method", *(f"{t} vs {b}" for t in types for b in baselines)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, groups in summary.items():
        cells = [method]
        for t in types:
            for b in baselines:
                mine, base = _keyed(groups[t]["recall"]).get(k), _keyed(summary[b][t]["recall"]).get(k)
                cells.append("–" if mine is None or not base else f"{mine / base:.2f}×")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recall_bars_markdown(summary: dict, ks: Sequence[int], width: int = 30) -> str:
    """Recall@k per method over the questions with evidence, as a Markdown bar chart."""
    lines = ["| method | k | recall | |", "|---|---|---|---|"]
    for method, groups in summary.items():
        recall = _keyed(groups["overall"]["recall"])
        for k in ks:
            value = recall.get(int(k)) or 0.0
            lines.append(f"| {method} | {k} | {value:.3f} | {'█' * round(width * value)} |")
    return "\n".join(lines)


def recall_svg(summary: dict, ks: Sequence[int]) -> str:
    """A dependency-free SVG bar chart of overall recall@k per method (grouped by k)."""
    methods = list(summary)
    colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"]
    bar, gap, height, left, top = 16, 18, 200, 40, 20
    group_width = len(methods) * bar + gap
    width = left + len(ks) * group_width + 150
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="14">evidence recall@k (questions with evidence)</text>']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + height * (1 - tick)
        parts.append(f'<line x1="{left}" x2="{left + len(ks) * group_width}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                     f'<text x="4" y="{y + 4}">{tick:.2f}</text>')
    for gi, k in enumerate(ks):
        x0 = left + gi * group_width + gap / 2
        for mi, method in enumerate(methods):
            value = _keyed(summary[method]["overall"]["recall"]).get(int(k)) or 0.0
            h = height * value
            parts.append(f'<rect x="{x0 + mi * bar}" y="{top + height - h}" width="{bar - 2}" height="{h}" '
                         f'fill="{colours[mi % len(colours)]}"><title>{method} R@{k} = {value:.3f}</title></rect>')
        parts.append(f'<text x="{x0}" y="{top + height + 16}">k={k}</text>')
    for mi, method in enumerate(methods):
        y = top + 14 * mi
        x = left + len(ks) * group_width + 10
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colours[mi % len(colours)]}"/>'
                     f'<text x="{x + 14}" y="{y + 9}">{method}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def report_markdown(data: dict) -> str:
    """The whole report: what was run on what, the table, baseline ratios, index size and cost."""
    s, ks = data["settings"], data["settings"]["ks"]
    k_ratio = 5 if 5 in ks else max(ks)
    corpus, questions, index = data["corpus"], data["questions"], data["index"]
    cost = index["cost"]
    lines = [
        "# Retrieval benchmark", "",
        f"- date: {data['date']}",
        f"- corpus: `{corpus.get('path', corpus.get('index_dir'))}` ({corpus.get('kind', 'index')}, "
        f"sha256 {str(corpus.get('sha256', '–'))[:12]}), {index['documents']} documents, {index['chunks']} chunks",
        f"- questions: `{questions['path']}`: {questions['count']} "
        f"({', '.join(f'{t} {n}' for t, n in questions['by_type'].items())})",
        f"- settings: index {s['index_version']}, {s['embed_model']}, chunks ≤ {s['chunk_tokens']} word pieces, "
        f"context budget {s['budget_tokens']} word pieces, top {s['top_n_chunks']} chunks per query",
        f"- machine: {data['machine']['cpus']} CPUs, Python {data['machine']['python']}",
        "", data["table_markdown"], "",
        "R@k: mean share of a question's evidence documents among the top-k distinct documents; "
        f"all@{_all_found_k(ks)}: share of questions with every evidence document there; cov: normalised gold "
        "answer found in the context cut at the budget (Null questions excluded); latency per query including "
        "the query embedding.", "",
        f"## Recall@{k_ratio} relative to the baselines", "", ratio_table(data["summary"], k_ratio), "",
        "## Null questions", "",
        "No answerer runs here (no LLM), so there is no abstention rate. Mean score of the top hit, "
        "answerable vs Null questions (a threshold can only abstain if these differ):", "",
        "| method | top score, answerable | top score, Null |", "|---|---|---|",
        *(f"| {m} | {_fmt(g['overall']['top_score_answerable'])} | {_fmt(g['overall']['top_score_null'])} |"
          for m, g in data["summary"].items()), "",
        "## Index", "",
        "| part | size |", "|---|---|",
        *(f"| {part} | {_mb(size)} |" for part, size in index["size_bytes"].items()), "",
        f"Cost: {cost.get('embedding_tokens', '–')} embedding tokens at build (chunks and keyword sentences; "
        f"chunk tokens alone {cost.get('chunk_embedding_tokens', '–')}), build wall time "
        f"{cost.get('build_seconds', '–')} s, LLM calls {cost['llm_calls']}, LLM tokens 0. "
        f"Query embedding tokens this run: {data['query_embedding_tokens']}.",
    ]
    if questions["unmatched_evidence_ids"]:
        missing = questions["unmatched_evidence_ids"]
        lines += ["", f"Warning: {len(missing)} evidence id(s) name no indexed document: {', '.join(missing[:10])}"]
    return "\n".join(lines) + "\n"
