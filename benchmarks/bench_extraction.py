"""LLM extraction cost (issue 8): what the skeleton saves, read from the cost ledger.

The project's local OpenAI-protocol test server (tests.llm_server.LLMTestServer, a real HTTP server on
127.0.0.1 answering schema-valid extractions with usage counts) stands in for the LLM. Every cost figure is
read from the index's cost ledger (stage "extraction"), never counted here.

1. A base index: the corpus minus one held-out document, ingested through the Dagster asset graph with the
   offline (spaCy) extractor (every chunk extracted, no LLM). With --index, the base starts from a copy of an
   already-ingested index of the corpus (e.g. the `lexgraph bench` cache), so the chunks are not embedded
   again; the original is never written to.
2. For each β, a copy of the base: `ingest_folder` with the LLM configured and LEXGRAPH_BETA=β (rebuilds the
   skeleton at β and re-extracts the documents with newly selected chunks), then `reextract_index` (every
   document whose skeleton chunks are not yet extracted by the LLM). LLM calls, requests and prompt /
   completion tokens of those runs, as ratios to β = 1.0; LLM-extracted chunks against ⌊β·n⌋.
3. At the default β: the held-out document is added and the folder ingested again (the calls of that ingest's
   runs); then a second ingest and a `reextract` with nothing changed (their calls: zero expected).
4. In the same process, on the same chunks: the offline extractor's throughput (chunks/s) against the
   embedding model's (the call the embedding stage makes), median of repeats, alternating.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import dagster as dg
import polars as pl

from lexgraph.indexing import lexical_extraction
from lexgraph.indexing.corpus_skeleton import read_selection_diff
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.pipeline import CHUNKS, EXTRACTIONS
from lexgraph.indexing.skeleton import DEFAULT_BETA, skeleton_size
from lexgraph.ids import document_id
from lexgraph.inbox import iter_corpus_files
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from orchestration.runner import IngestReport, ReextractReport, ingest_folder, reextract_index

BETAS = (1.0, 0.8, 0.2)
Log = Callable[[str], None]


def _copy(source: Path, target: Path) -> Path:
    """cp -a: the tree with its links, modes and times."""
    shutil.copytree(source, target, symlinks=True)
    return target


def _runs(report: IngestReport | ReextractReport) -> list[str]:
    """Every Dagster run an ingest or reextract call made."""
    if isinstance(report, IngestReport):
        runs = [*report.runs, *report.extraction_runs, report.corpus_run, report.lexical_run]
    else:
        runs = [*report.runs, report.lexical_run]
    return [r for r in runs if r]


def llm_cost(settings: Settings, run_ids: Sequence[str] | None = None) -> dict:
    """Extraction-stage ledger rows (of these runs, or all): calls that reached the model, cache hits, HTTP
    requests, prompt and completion tokens, failed calls."""
    ledger = CostLedger(settings.ledger_dir).read().filter(pl.col("stage") == lexical_extraction.EXTRACTION_STAGE)
    if run_ids is not None:
        ledger = ledger.filter(pl.col("run_id").is_in(list(run_ids)))
    calls = ledger.filter(~pl.col("cache_hit"))
    return {"llm_calls": calls.height, "cache_hits": ledger.height - calls.height,
            "requests": int(calls["attempts"].sum() or 0), "prompt_tokens": int(calls["prompt_tokens"].sum() or 0),
            "completion_tokens": int(calls["completion_tokens"].sum() or 0),
            "failed_calls": calls.filter(pl.col("outcome") != "ok").height,
            "llm_seconds": round(float(calls["seconds"].sum() or 0.0), 1)}


def extraction_state(settings: Settings) -> dict:
    """Chunks, the skeleton selection, and how the chunks are extracted now (from the Extract store)."""
    skeleton = pl.read_parquet(CorpusFiles(settings.index_dir).skeleton, columns=["chunk_id", "selected"])
    store = ExtractStore(settings.extract_dir)
    scan = store.scan(EXTRACTIONS)
    rows = (scan.select("chunk_id", "extractor", "outcome", "in_skeleton").collect() if scan is not None
            else pl.DataFrame(schema={"chunk_id": pl.Utf8, "extractor": pl.Utf8, "outcome": pl.Utf8,
                                      "in_skeleton": pl.Boolean}))
    by_llm = rows.filter((pl.col("extractor") == "openai") & (pl.col("outcome") == "ok"))
    selected = set(skeleton.filter("selected")["chunk_id"].to_list())
    n = skeleton.height
    return {"chunks": n, "skeleton_selected": len(selected), "floor_beta_n": skeleton_size(n, settings.beta),
            "extracted_chunks": rows.height, "llm_extracted_chunks": by_llm.height,
            "llm_extracted_in_skeleton": int(by_llm["chunk_id"].is_in(list(selected)).sum()),
            "skeleton_not_llm_extracted": len(selected - set(by_llm["chunk_id"].to_list()))}


def prepare_base(corpus: Path, work: Path, held_out: str, index_home: Path | None, log: Log) -> tuple[Path, Path, Path]:
    """(inbox folder without the held-out document, base index home, the held-out file's copy)."""
    folder = _copy(corpus, work / "corpus")
    held = work / "held_out" / held_out
    held.parent.mkdir(parents=True)
    shutil.move(folder / held_out, held)
    home = _copy(index_home, work / "base") if index_home is not None else work / "base"
    settings = Settings.from_env(home=home, inbox=folder, beta=DEFAULT_BETA, llm_base_url="")  # offline extraction only
    started = time.perf_counter()
    with dg.DagsterInstance.ephemeral() as instance:  # what `lexgraph ingest` runs on
        report = ingest_folder(folder, instance, settings=settings, prune=True, progress=False)
        if report.failed or report.corpus_index_ok is False:
            raise SystemExit(f"base ingest failed: {report.failed or report.corpus_error}")
        redo = reextract_index(instance, settings, progress=False)  # documents never extracted (an older index)
        if redo.failed or redo.lexical_ok is False:
            raise SystemExit(f"base extraction failed: {redo.failed}")
    log(f"base: {report.new} new, {report.unchanged} unchanged, {report.removed} removed (held out: {held_out}); "
        f"{len(redo.documents)} documents extracted offline; {time.perf_counter() - started:.0f} s")
    return folder, home, held


def llm_settings(home: Path, folder: Path, server, beta: float) -> Settings:
    return Settings.from_env(home=home, inbox=folder, beta=beta, llm_base_url=server.base_url, llm_model=server.model)


def measure_beta(base: Path, folder: Path, work: Path, server, beta: float, instance, log: Log) -> tuple[dict, Settings]:
    """Extract the corpus at β with the LLM on a copy of the base: ingest, then reextract; their ledger rows."""
    home = _copy(base, work / f"beta-{beta}")
    settings = llm_settings(home, folder, server, beta)
    started = time.perf_counter()
    ingest = ingest_folder(folder, instance, settings=settings, progress=False)
    redo = reextract_index(instance, settings, progress=False)
    seconds = time.perf_counter() - started
    problems = {**ingest.failed, **redo.failed}
    if problems or ingest.corpus_index_ok is False or redo.lexical_ok is False:
        raise SystemExit(f"β={beta}: extraction failed: {problems or ingest.corpus_error}")
    figures = {"beta": beta, **llm_cost(settings, _runs(ingest) + _runs(redo)), **extraction_state(settings),
               "documents_reextracted_by_selection_diff": len(ingest.reextracted),
               "documents_reextracted_by_reextract": len(redo.documents),
               "ledger_llm_calls_total": llm_cost(settings)["llm_calls"], "wall_seconds": round(seconds, 1)}
    log(f"β={beta}: {figures['llm_calls']} LLM calls, {figures['prompt_tokens']} prompt tokens; "
        f"{figures['llm_extracted_chunks']} LLM-extracted chunks of {figures['chunks']} "
        f"(⌊β·n⌋ = {figures['floor_beta_n']}); {seconds:.0f} s")
    return figures, settings


def measure_add_one(settings: Settings, folder: Path, held: Path, held_out: str, instance, log: Log) -> dict:
    """Add the held-out document to the extracted index and ingest; then ingest and reextract with nothing changed."""
    files = CorpusFiles(settings.index_dir)
    before = set(pl.read_parquet(files.skeleton).filter("selected")["chunk_id"].to_list())
    target = folder / held_out
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(held, target)
    started = time.perf_counter()
    add = ingest_folder(folder, instance, settings=settings, progress=False)
    seconds = time.perf_counter() - started
    if add.failed or add.corpus_index_ok is False or add.new != 1:
        raise SystemExit(f"adding {held_out} failed: {add.failed or add.corpus_error} (new: {add.new})")
    skeleton = pl.read_parquet(files.skeleton)
    diff = read_selection_diff(files)
    after = set(skeleton.filter("selected")["chunk_id"].to_list())
    new_doc = ExtractStore(settings.extract_dir).read(CHUNKS, document_id(held_out))
    new_chunks = set(new_doc["chunk_id"].to_list())
    added = {"document": held_out, "document_chunks": len(new_chunks),
             "document_chunks_selected": len(new_chunks & after),
             "newly_selected_chunks": len(after - before), "newly_selected_in_other_documents": len((after - before) - new_chunks),
             "diff_newly_selected": diff.get("newly_selected_count"),
             "documents_reextracted": len(add.reextracted), **llm_cost(settings, _runs(add)),
             **extraction_state(settings), "wall_seconds": round(seconds, 1)}
    again = ingest_folder(folder, instance, settings=settings, progress=False)
    redo = reextract_index(instance, settings, progress=False)
    unchanged = {"ingest": {"new": again.new, "changed": again.changed, "reextracted": len(again.reextracted),
                            **llm_cost(settings, _runs(again))},
                 "reextract": {"documents": len(redo.documents), **llm_cost(settings, _runs(redo))}}
    log(f"add {held_out} ({len(new_chunks)} chunks): {added['llm_calls']} LLM calls "
        f"({added['newly_selected_chunks']} newly selected chunks, {added['documents_reextracted']} documents "
        f"re-extracted); nothing changed: ingest {unchanged['ingest']['llm_calls']} calls, reextract "
        f"{unchanged['reextract']['llm_calls']} calls")
    return {"add_one_document": added, "nothing_changed": unchanged}


def throughput(settings: Settings, repeats: int, embed_repeats: int, log: Log) -> dict:
    """Offline extraction and embedding of the same chunks, in this process, alternating; medians."""
    from lexgraph.extract.embedder import Embedder

    chunks = ExtractStore(settings.extract_dir).scan(CHUNKS).select("chunk_id", "doc_id", "text", "heading_path").collect()
    inputs = lexical_extraction.chunk_inputs(chunks)
    texts = chunks["text"].to_list()
    offline = lexical_extraction.offline_extractor(settings)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    embedder.embed(["warm up the model before timing"])
    offline.extract(inputs[0])
    times: dict[str, list[float]] = {"offline": [], "embedding": []}
    for repeat in range(max(repeats, embed_repeats)):
        if repeat < repeats:
            started = time.perf_counter()
            for start in range(0, len(inputs), lexical_extraction.OfflineRows.BATCH):  # batched as the extraction stage does
                offline.extract_many(inputs[start:start + lexical_extraction.OfflineRows.BATCH])
            times["offline"].append(time.perf_counter() - started)
        if repeat < embed_repeats:
            started = time.perf_counter()
            embedder.embed(texts)
            times["embedding"].append(time.perf_counter() - started)
        log(f"throughput repeat {repeat + 1} on {len(texts)} chunks: "
            + ", ".join(f"{kind} {runs[-1]:.1f} s" for kind, runs in times.items() if len(runs) == repeat + 1))
    offline_cps = len(inputs) / statistics.median(times["offline"])
    embedding_cps = len(texts) / statistics.median(times["embedding"])
    return {"chunks": len(inputs), "offline_seconds": [round(t, 2) for t in times["offline"]],
            "embedding_seconds": [round(t, 2) for t in times["embedding"]],
            "offline_chunks_per_s": round(offline_cps, 1), "embedding_chunks_per_s": round(embedding_cps, 1),
            "offline_over_embedding": round(offline_cps / embedding_cps, 2), "embed_model": settings.embed_model}


def measure(corpus: str | Path, work: str | Path, server, *, index_home: str | Path | None = None,
            betas: Sequence[float] = BETAS, add_beta: float = DEFAULT_BETA, held_out: str | None = None,
            repeats: int = 3, embed_repeats: int = 3, log: Log = print) -> dict:
    """Every figure of the benchmark as one dict (see the module docstring). corpus: a folder of documents;
    work: an empty scratch folder; server: a running LLMTestServer; index_home: an ingested index of the corpus
    to start from (copied); repeats / embed_repeats 0 skip the throughput timing."""
    corpus, work = Path(corpus), Path(work)
    files = iter_corpus_files(corpus)
    held_out = held_out or files[-1].relative_to(corpus).as_posix()
    folder, base, held = prepare_base(corpus, work, held_out, Path(index_home) if index_home else None, log)
    results: dict = {"documents": len(files), "held_out": held_out, "betas": []}
    add_settings = None
    with dg.DagsterInstance.ephemeral() as instance:  # what `lexgraph ingest` runs on
        for beta in betas:
            figures, settings = measure_beta(base, folder, work, server, beta, instance, log)
            results["betas"].append(figures)
            if math.isclose(beta, add_beta):
                add_settings = settings
        reference = next((f for f in results["betas"] if f["beta"] == 1.0), None)
        for figures in results["betas"]:
            for key in ("llm_calls", "prompt_tokens", "completion_tokens"):
                figures[f"{key}_ratio"] = (round(figures[key] / reference[key], 3)
                                           if reference and reference[key] else None)
        if add_settings is not None:
            results.update(measure_add_one(add_settings, folder, held, held_out, instance, log))
    if repeats or embed_repeats:
        results["throughput"] = throughput(Settings.from_env(home=base), max(repeats, 1), max(embed_repeats, 1), log)
    return results


def table(results: dict) -> str:
    lines = ["| β | LLM calls | ratio | prompt tokens | ratio | completion tokens | ratio | LLM-extracted chunks | "
             "⌊β·n⌋ of n |", "|---|---|---|---|---|---|---|---|---|"]
    for f in results["betas"]:
        lines.append(f"| {f['beta']} | {f['llm_calls']} | {f['llm_calls_ratio']} | {f['prompt_tokens']} | "
                     f"{f['prompt_tokens_ratio']} | {f['completion_tokens']} | {f['completion_tokens_ratio']} | "
                     f"{f['llm_extracted_chunks']} | {f['floor_beta_n']} of {f['chunks']} |")
    if "add_one_document" in results:
        a, u = results["add_one_document"], results["nothing_changed"]
        lines += ["", f"add one document ({a['document']}, {a['document_chunks']} chunks, "
                      f"{a['document_chunks_selected']} selected): {a['llm_calls']} LLM calls, "
                      f"{a['prompt_tokens']} prompt tokens, {a['cache_hits']} cache hits; "
                      f"{a['newly_selected_chunks']} chunks newly selected "
                      f"({a['newly_selected_in_other_documents']} in other documents), "
                      f"{a['documents_reextracted']} documents re-extracted",
                  f"nothing changed: second ingest {u['ingest']['llm_calls']} LLM calls, reextract "
                  f"{u['reextract']['llm_calls']} LLM calls ({u['reextract']['documents']} documents)"]
    if "throughput" in results:
        t = results["throughput"]
        lines += ["", f"throughput on the same {t['chunks']} chunks, one process (median of "
                      f"{len(t['offline_seconds'])} / {len(t['embedding_seconds'])} runs): offline extractor "
                      f"{t['offline_chunks_per_s']} chunks/s, embedding ({t['embed_model']}) "
                      f"{t['embedding_chunks_per_s']} chunks/s, ratio {t['offline_over_embedding']}x"]
    return "\n".join(lines)


def main() -> None:
    from lexgraph.evaluation.corpus import prepare_corpus
    from tests.llm_server import LLMTestServer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="folder of documents or a .zip of them")
    parser.add_argument("--index", help="an ingested index home of the corpus to copy (default: the `lexgraph "
                                        "bench` cache of the corpus under LEXGRAPH_HOME, when it exists)")
    parser.add_argument("--betas", default=",".join(str(b) for b in BETAS))
    parser.add_argument("--repeats", type=int, default=3, help="offline extraction timing repeats")
    parser.add_argument("--embed-repeats", type=int, default=3, help="embedding timing repeats")
    parser.add_argument("--held-out", help="relative path of the document added last (default: the last file)")
    parser.add_argument("--out", help="JSON file (default: bench-extraction.json in the work folder's parent)")
    parser.add_argument("--work", help="scratch folder (default: a new temporary folder, removed at the end)")
    args = parser.parse_args()
    cache_root = Settings.from_env().home
    prepared = prepare_corpus(args.corpus, cache_root)  # a .zip is extracted once into the bench cache
    index_home = Path(args.index) if args.index else (prepared.index_home if prepared.index_home.is_dir() else None)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="lexgraph-bench-extraction-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise SystemExit(f"{work}: the work folder must be empty")
    started = time.perf_counter()
    try:
        with LLMTestServer(max_lifetime=0) as server:
            results = measure(prepared.folder, work, server, index_home=index_home,
                              betas=[float(b) for b in args.betas.split(",")], held_out=args.held_out,
                              repeats=args.repeats, embed_repeats=args.embed_repeats,
                              log=lambda line: print(line, flush=True))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    results.update({"corpus": str(args.corpus), "index_copied_from": str(index_home) if index_home else None,
                    "server": "tests.llm_server.LLMTestServer (prompt/completion tokens are its word counts)",
                    "machine": f"{platform.machine()}, {platform.python_version()}, "
                               f"{os.cpu_count()} cores", "seconds": round(time.perf_counter() - started)})
    out = Path(args.out) if args.out else Path(cache_root) / "bench-extraction.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print()
    print(table(results))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
