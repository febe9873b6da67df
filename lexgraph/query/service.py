"""The query side as a Python API: `QueryService(settings).ask(question)` → the answer JSON that
`lexgraph ask --json` prints and `POST /ask` returns; `provenance(query_id)` → the audit record.

Needs no running Dagster: it reads LanceDB and the Parquet stores of an index. It reloads by itself
when the index changes under it (a new catalog or corpus state), checked at most every few seconds.
Every question is logged (one JSON line in `queries/log.jsonl` under the index home) and its
provenance kept (`queries/answers/<query_id>.json`); questions whose agentic steps keep failing go to
`queries/review_queue.jsonl`.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import unicodedata
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from lexgraph.atomic_json import write_json
from lexgraph.indexing.corpus_state import CorpusFiles, catalog_digest
from lexgraph.query.answer import Answer, ExtractiveAnswerer, LLMAnswerer
from lexgraph.query.engine import ROUTE_CHOICES, QueryEngine, QueryParams, Retrieval
from lexgraph.query.lance_backend import index_health, warm_lance
from lexgraph.query.provenance import citation_provenance, index_identity
from lexgraph.query.scale_engine import ScaleQueryEngine
from lexgraph.settings import Settings
from lexgraph.storage import lance_indexes
from lexgraph.storage.vector_store import VectorStore, table_write_stamps

RELOAD_CHECK_SECONDS = 2.0


class QueryError(ValueError):
    """A question or route that cannot be asked; the message says why."""


class UnknownQueryError(LookupError):
    """No logged question has this id."""


def clean_question(question: object, limit: int) -> str:
    """The question with control characters removed; QueryError when nothing askable is left."""
    if not isinstance(question, str):
        raise QueryError(f"the question must be text, got {type(question).__name__}")
    # control, format, separator and lone-surrogate characters (the last cannot even be encoded)
    cleaned = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") else c for c in question)
    cleaned = " ".join(cleaned.split())
    if not cleaned:
        raise QueryError("the question is empty")
    if len(cleaned) > limit:
        raise QueryError(f"the question is {len(cleaned)} characters long; the limit is {limit}")
    if not any(c.isalnum() for c in cleaned):
        raise QueryError("the question has no letters or digits")
    return cleaned


class QueryLog:
    """The question log, the answers' provenance records and the human-review queue of one index home."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.log = self.root / "log.jsonl"
        self.answers = self.root / "answers"
        self.review_queue = self.root / "review_queue.jsonl"
        self._lock = threading.Lock()

    def append(self, path: Path, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:  # one write per line: no torn lines
                handle.write(line)

    def keep(self, query_id: str, record: dict) -> None:
        write_json(self.answers / f"{query_id}.json", record, ensure_ascii=False, indent=1, default=str)

    def read(self, query_id: str) -> dict:
        if not query_id or not all(c.isalnum() or c == "-" for c in query_id):
            raise UnknownQueryError(f"no question with id {query_id!r}")
        path = self.answers / f"{query_id}.json"
        if not path.exists():
            raise UnknownQueryError(f"no question with id {query_id!r}")
        return json.loads(path.read_text(encoding="utf-8"))

    def lines(self) -> list[dict]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash: the others still count
        return out


    def summary(self) -> dict:
        """Route mix, retry, abstention, uncertainty and review rates, and p50/p95 latency per route."""
        lines = self.lines()
        n = len(lines) or 1
        routes = sorted({l.get("route") for l in lines if l.get("route")})
        latency = {route: [l["latency_ms"]["total"] for l in lines if l.get("route") == route] for route in routes}
        return {"questions": len(lines),
                "route_mix": {route: sum(l.get("route") == route for l in lines) for route in routes},
                "retry_rate": round(sum(bool(l.get("retries")) for l in lines) / n, 4),
                "abstention_rate": round(sum(bool(l.get("abstained")) for l in lines) / n, 4),
                "uncertain_rate": round(sum(bool(l.get("uncertain")) for l in lines) / n, 4),
                "sent_to_review": sum(bool(l.get("review")) for l in lines),
                "latency_ms": {route: {"p50": _percentile(values, 50), "p95": _percentile(values, 95)}
                               for route, values in latency.items()},
                "llm_calls": sum(l.get("cost", {}).get("llm_calls", 0) for l in lines)}


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


class QueryService:
    def __init__(self, settings: Settings, params: QueryParams | None = None, router=None, use_llm: bool | None = None):
        self.settings, self.params = settings, params or QueryParams()
        self.log = QueryLog(Path(settings.home) / "queries")
        self._router, self._use_llm = router, use_llm
        self._engine: QueryEngine | None = None
        self._signature: str | None = None
        self._stamps: tuple | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._loading = threading.Lock()
        self._llm = None

    # -- loading ----------------------------------------------------------------------------------------

    def _index_signature(self) -> tuple[str, dict[str, str]]:
        """(signature, catalog): the signature changes whenever ingestion or a corpus update changes what
        queries read; the catalog (doc_id -> content hash) is kept with the engine loaded from it."""
        catalog = VectorStore(self.settings.lance_uri).indexed_hashes()
        stamps = self._corpus_stamps()
        return f"{catalog_digest(catalog)}|{stamps[0]}|{stamps[1]}", catalog

    def _corpus_stamps(self) -> tuple[int, int]:
        """When built_from.json and the search indexes' state were last written (0: absent). The search indexes'
        refresh may compact the chunk table (new row ids): the lance backend reloads then."""
        files = CorpusFiles(self.settings.index_dir)
        return tuple(p.stat().st_mtime_ns if p.exists() else 0
                     for p in (files.built_from, lance_indexes.state_path(files.root)))

    def engine(self) -> QueryEngine:
        """The loaded engine; a changed index is loaded beside it while questions go on being answered by
        the old one, then swapped in (only the first load makes callers wait)."""
        with self._lock:
            now = time.monotonic()
            if self._engine is not None and now - self._checked < RELOAD_CHECK_SECONDS:
                return self._engine
            self._checked = now
            current, known, known_stamps = self._engine, self._signature, self._stamps
        stamps = self._write_stamps()
        if current is not None and stamps is not None and stamps == known_stamps:
            return current  # nothing was written since the last check: no need to read the catalog again
        signature, catalog = self._index_signature()
        if current is not None and signature == known:
            with self._lock:
                self._stamps = stamps
            return current
        with self._loading:  # one load at a time; a caller that waited finds it done
            if self._signature == signature and self._engine is not None:
                return self._engine
            engine = self._load()
            engine.catalog = catalog  # what the answers of this engine cite: their provenance reads it
            # the same for every answer of this engine: hashing 50,000 documents' catalog took ~20 ms a question
            engine.identity = index_identity(self.settings, catalog)
            with self._lock:
                self._engine, self._signature, self._stamps = engine, signature, stamps
            return engine

    def _write_stamps(self) -> tuple | None:
        """When each table and corpus file a query reads was last written (a new LanceDB version adds a
        manifest to the table's _versions folder): a few stats instead of reading the catalog, which takes
        ~0.1 s at 50,000 documents. None where a folder is missing: then the catalog is read."""
        tables = table_write_stamps(self.settings.lance_uri, ("sources", "chunks"))
        return None if tables is None else tables + self._corpus_stamps()

    def warm(self) -> threading.Thread:
        """Load the engine in a background thread (what `lexgraph serve` starts with, so the index, the model
        and the search indexes load while the server starts); a question asked meanwhile waits for it. A
        load that fails (an empty index) is left to the first question, which reports it."""
        def run() -> None:
            try:
                self.engine()
            except Exception as error:  # noqa: BLE001 - the first question loads again and answers with the error
                print(f"lexgraph serve: the index did not load at start ({type(error).__name__}: {error}); "
                      "the first question tries again", file=sys.stderr, flush=True)

        thread = threading.Thread(target=run, name="lexgraph-warm", daemon=True)
        thread.start()
        return thread

    def _load(self) -> QueryEngine:
        from concurrent.futures import ThreadPoolExecutor

        from lexgraph.extract.embedder import Embedder
        from lexgraph.query.retrieval import Retriever, index_loader

        load, lance = index_loader(self.settings)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lexgraph-load") as pool:
            # the model (and the router's exemplars, embedded by it) load beside the index: most of either is
            # native code (onnxruntime, LanceDB) that runs outside the GIL. As LexIndex.retriever (and with the
            # model LexIndex.embedder gives), which would load them one after the other.
            embedder = pool.submit(Embedder.shared, self.settings.embed_model, backend=self.settings.embed_backend)
            router = pool.submit(self._router_for, embedder)
            loaded = load(self.settings)
            if lance:
                warm_lance(loaded)
            embedder, router = embedder.result(), router.result()
        retriever = Retriever(loaded, embedder.embed_query, None, embedder.embed_queries)
        extractive = ExtractiveAnswerer(retriever.index.bm25)
        answerer, decompose = extractive, None
        llm = self._llm_client()
        if llm is not None:
            from lexgraph.query.decompose import llm_decomposer

            answerer, decompose = LLMAnswerer(llm, extractive), llm_decomposer(llm)
        if lance and retriever.index.graph is None:
            return ScaleQueryEngine(retriever, router, answerer, self.params, decompose,
                                    chunks=retriever.index.size, threshold=self.settings.lance_threshold,
                                    why=retriever.index.graph_missing)
        return QueryEngine(retriever, router, answerer, self.params, decompose)

    def _router_for(self, embedder):
        from lexgraph.query.router import default_router

        if self._router is not None:
            return self._router
        return default_router(self.settings.router_exemplars, lambda texts: embedder.result().embed_queries(texts))

    def _llm_client(self):
        from lexgraph.extract.llm_client import StructuredLLM
        from lexgraph.extract.llm_config import LLMConfig

        if self._use_llm is False or self.settings.extractor != "openai":
            return None
        if self._llm is None:
            self._llm = StructuredLLM(LLMConfig.from_settings(self.settings))
        return self._llm

    # -- asking -----------------------------------------------------------------------------------------

    def ask(self, question: str, route: str = "auto") -> dict:
        question = clean_question(question, self.params.max_question_chars)
        if route not in ROUTE_CHOICES:
            raise QueryError(f"unknown route {route!r}; expected one of {', '.join(ROUTE_CHOICES)}")
        engine = self.engine()
        started = time.perf_counter()
        retrieval, answer = engine.answer(question, route)
        total_ms = round((time.perf_counter() - started) * 1000, 2)
        query_id = f"q{datetime.now(timezone.utc):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:10]}"
        log_line = self._log_line(query_id, question, route, retrieval, answer, total_ms)
        self.log.append(self.log.log, log_line)
        if retrieval.review:
            self.log.append(self.log.review_queue, {"query_id": query_id, "question": question,
                                                    "reason": retrieval.review, "at": log_line["at"]})
        response = self._response(query_id, question, retrieval, answer)
        catalog = engine.catalog
        record = {**response, "asked_at": log_line["at"], "log": log_line,
                  "index": engine.identity,
                  "citations": citation_provenance(self.settings, answer.citations, catalog)}
        response["provenance"] = {k: record[k] for k in ("asked_at", "index")} | {
            "route_reason": log_line["reason"], "answerer": answer.answerer, "evidence_items": len(retrieval.context.items),
            "url": f"/provenance/{query_id}"}
        record["provenance"] = response["provenance"]
        self.log.keep(query_id, record)
        return response

    @staticmethod
    def _response(query_id: str, question: str, retrieval: Retrieval, answer: Answer) -> dict:
        return {"query_id": query_id, "question": question, "answer": answer.text, "answer_type": answer.answer_type,
                "answer_sentence": answer.sentence, "abstained": answer.abstained,
                "uncertain": retrieval.uncertain, "route": retrieval.route,
                "confidence": round(answer.confidence if retrieval.decision is None
                                    else min(answer.confidence, 1.0) * 0.5 + retrieval.decision.confidence * 0.5, 3),
                "citations": [c.public() for c in answer.citations], "provenance": {}}

    @staticmethod
    def _log_line(query_id, question, requested, retrieval: Retrieval, answer: Answer, total_ms) -> dict:
        decision = retrieval.decision
        return {"query_id": query_id, "at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                "question": question, "requested_route": requested, "route": retrieval.route,
                "confidence": round(decision.confidence, 3) if decision else None,
                "reason": decision.reason if decision else f"route {requested} requested",
                "probabilities": decision.probabilities if decision else None,
                "latency_ms": {**retrieval.latency_ms, "total": total_ms},
                "cost": {"llm_calls": answer.llm_calls, "prompt_tokens": answer.prompt_tokens,
                         "completion_tokens": answer.completion_tokens},
                "retries": retrieval.retries + ([{"answer": "citation validation", "count": answer.retries}]
                                                if answer.retries else []),
                "steps": retrieval.steps, "fusion_weights": retrieval.weights or None,
                "uncertain": retrieval.uncertain, "abstained": answer.abstained,
                "abstain_reason": answer.reason if answer.abstained else None, "review": retrieval.review,
                "answerer": answer.answerer, "evidence_items": len(retrieval.context.items),
                "context_tokens": retrieval.context.tokens, "pid": os.getpid()}

    def provenance(self, query_id: str) -> dict:
        return self.log.read(query_id)

    def health(self) -> dict:
        from lexgraph import __version__

        store = VectorStore(self.settings.lance_uri)
        chunks = store.count("chunks")
        return {"status": "ok", "documents": len(store.indexed_hashes()), "chunks": chunks,
                "index_version": self.settings.index_version, "lexgraph_version": __version__,
                "llm": self._llm_client() is not None, "query_backend": self._backend_health(store, chunks)}

    def _backend_health(self, store: VectorStore, chunks: int) -> dict:
        """Which backend answers (and why), and on the lance one each search index's state."""
        settings = self.settings
        backend = "lance" if settings.uses_lance(chunks) else "memory"
        why = (f"LEXGRAPH_QUERY_BACKEND={settings.query_backend}" if settings.query_backend != "auto" else
               f"auto: {chunks} chunks {'≥' if backend == 'lance' else '<'} LEXGRAPH_LANCE_THRESHOLD="
               f"{settings.lance_threshold}")
        out = {"backend": backend, "reason": why}
        if backend == "lance":
            out.update(index_health(lance_indexes.chunk_index_states(store),
                                    lance_indexes.KEYWORD_LINKS in store.table_names()))
        return out
