"""The lexical graph's first stage, extraction: one ChunkExtraction per chunk, kept per document as the Parquet
`extractions` stage (`extract_documents`), and what decides which documents are extracted again.

Skeleton chunks go to the LLM extractor when one is configured (through the extraction cache, keyed by chunk
content, model and prompt version, so a chunk never pays twice); every other chunk, and every chunk whose LLM
call failed or could not be sent, gets the offline extraction, and the failure is recorded on its row. Every
model call and cache hit is a cost-ledger row. Only the LLM's own answers are cached, never a fallback, so a
chunk whose call failed (or was refused by the open circuit breaker) is sent again by the next run
(`documents_with_llm_failures`), and only it: the chunks that succeeded are cache hits. A paid call is in the
ledger and the cache before anything else happens, so a run killed at any point pays for no call twice.

Also here: the extractors built from the settings (`offline_extractor`, `llm_extractor`, `pii_masker`,
`llm_prompt_version`, `extractor_signature`) and the documents whose extractions are stale (`stale_documents`,
what `lexgraph reextract` re-runs). The next stages, flatten and load: :mod:`lexgraph.indexing.lexical`.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Sequence

import polars as pl

from lexgraph import progress as report
from lexgraph.extract.extraction_cache import ExtractionCache, key_for
from lexgraph.extract.llm_client import CIRCUIT_OPEN
from lexgraph.extract.schemas import ChunkExtraction, ChunkInput, ExtractionOutcome, Extractor
from lexgraph.faults import EXTRACTION as EXTRACTION_CRASH_POINT, crash_point
from lexgraph.indexing.lexical_tables import LEXICAL_STAGES, stage_frame
from lexgraph.indexing.pipeline import CHUNKS, EXTRACTIONS, StageResult
from lexgraph.ledger import CostLedger
from lexgraph.storage.extract_store import ExtractStore

EXTRACTION_STAGE = "extraction"  # the ledger stage of the extraction's model calls

Progress = Callable[[int], None]


def _now() -> datetime:
    return datetime.now(timezone.utc)


# --- the extraction stage ------------------------------------------------------------------------------------


@dataclass
class ExtractionTally:
    """What extracting one document did and cost (its partition's figures)."""

    chunks: int = 0
    skeleton_chunks: int = 0
    llm_calls: int = 0  # calls that reached the model (cache misses; retries are one call)
    cache_hits: int = 0
    llm_failures: int = 0  # chunks that kept the offline extraction after the LLM failed
    llm_refused: int = 0  # chunks not sent because the circuit breaker was open (offline extraction kept)
    offline_chunks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    not_sent: str = ""  # why none of the document's chunks was sent (PII masking failed)

    def figures(self) -> dict:
        figures = {"rows": self.chunks, "chunks": self.chunks, "skeleton_chunks": self.skeleton_chunks,
                   "llm_calls": self.llm_calls, "cache_hits": self.cache_hits, "llm_failures": self.llm_failures,
                   "llm_refused_circuit_open": self.llm_refused, "offline_chunks": self.offline_chunks,
                   "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        if self.not_sent:
            figures["not_sent"] = self.not_sent
        return figures


def chunk_inputs(chunks: pl.DataFrame) -> list[ChunkInput]:
    return [ChunkInput(r["chunk_id"], r["doc_id"], r["text"], r["heading_path"] or "")
            for r in chunks.select("chunk_id", "doc_id", "text", "heading_path").iter_rows(named=True)]


def _cache_text(llm: Extractor, chunk: ChunkInput) -> str:
    """What an extraction depends on besides model and prompt version (the extractor says, if it can)."""
    method = getattr(llm, "cache_text", None)
    return method(chunk) if method else f"{chunk.heading_path}\n{chunk.text}"


def _masking_problem(llm: Extractor, chunks: Sequence[ChunkInput], masker: Callable | None) -> str:
    """Every chunk to be sent is masked first; one that cannot be keeps the whole document from the LLM.
    The extractor masks each message it sends (OpenAIExtractor(masker=...), which its prompt version
    records); `masker` is used when the extractor has none of its own."""
    user_message = getattr(llm, "user_message", None) if getattr(llm, "masker", None) is not None else None
    if user_message is None and masker is None:
        return ""
    for chunk in chunks:
        try:
            user_message(chunk) if user_message is not None else masker(chunk.text)
        except Exception as error:  # noqa: BLE001 - any masking failure means: send nothing
            return (f"PII masking failed on chunk {chunk.chunk_id} ({type(error).__name__}: {error}); "
                    "none of the document's chunks was sent to the LLM")
    return ""


def _ledger_row(llm: Extractor, outcome: ExtractionOutcome, chunk: ChunkInput, run_id: str, cache_hit: bool) -> dict:
    row = getattr(llm, "ledger_row", None)
    if row is not None:
        return row(outcome, chunk, run_id=run_id, stage=EXTRACTION_STAGE, cache_hit=cache_hit)
    return {"run_id": run_id, "stage": EXTRACTION_STAGE, "doc_id": chunk.doc_id, "chunk_id": chunk.chunk_id,
            "model": llm.model, "prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "seconds": float(outcome.seconds), "cache_hit": cache_hit, "outcome": outcome.outcome,
            "attempts": 0 if cache_hit else outcome.attempts}


def _extraction_json(extraction: ChunkExtraction) -> str:
    return json.dumps(extraction.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)


def _row(chunk: ChunkInput, extraction: ChunkExtraction | str, extractor: str, model: str, prompt_version: str,
         extracted_at: datetime, in_skeleton: bool, outcome: str = "ok", error: str | None = None,
         cache_hit: bool = False, attempts: int = 0) -> dict:
    """One extractions row; `extraction` as the model or as its JSON already."""
    return {"chunk_id": chunk.chunk_id, "doc_id": chunk.doc_id, "extractor": extractor, "model": model,
            "prompt_version": prompt_version, "extracted_at": extracted_at, "outcome": outcome, "error": error,
            "in_skeleton": in_skeleton, "cache_hit": cache_hit, "attempts": attempts,
            "extraction": extraction if isinstance(extraction, str) else _extraction_json(extraction)}


class OfflineRows:
    """Extractions rows by the offline extractor, whose output depends on a chunk's text and headings
    only: a text met again in the same run (page headers, signatures, a log's repeated lines, a file that
    repeats itself) reuses the JSON of its first extraction. Bounded, oldest first out."""

    BATCH = 64  # chunks parsed together: spaCy's nlp.pipe is several times faster than one call per chunk

    def __init__(self, offline: Extractor, limit: int = 2048) -> None:
        self.offline, self.limit = offline, limit
        self._known: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._ahead: list[ChunkInput] = []
        self._next = 0

    def plan(self, chunks: Iterable[ChunkInput]) -> None:
        """The chunks that will be asked for, in order: a miss extracts the next ones with it, in one batch."""
        self._ahead, self._next = list(chunks), 0

    def _extract(self, chunk: ChunkInput) -> None:
        batch, seen = [chunk], {(chunk.text, chunk.heading_path)}
        while self._next < len(self._ahead) and len(batch) < self.BATCH:
            one = self._ahead[self._next]
            self._next += 1
            key = (one.text, one.heading_path)
            if key not in self._known and key not in seen:
                batch.append(one)
                seen.add(key)
        many = getattr(self.offline, "extract_many", None)
        outcomes = many(batch) if many is not None else [self.offline.extract(c) for c in batch]
        for one, outcome in zip(batch, outcomes):
            self._known[(one.text, one.heading_path)] = _extraction_json(outcome.extraction)
        while len(self._known) > self.limit:
            self._known.popitem(last=False)

    def row(self, chunk: ChunkInput, in_skeleton: bool, outcome: str = "ok", error: str | None = None,
            attempts: int = 0) -> dict:
        key = (chunk.text, chunk.heading_path)
        extraction = self._known.get(key)
        if extraction is None:
            self._extract(chunk)
            extraction = self._known[key]
        else:
            self._known.move_to_end(key)
        h = self.offline
        return _row(chunk, extraction, h.name, h.model, h.prompt_version, _now(), in_skeleton, outcome, error,
                    attempts=attempts)


@dataclass
class _DocumentRun:
    """What extracting one document collects: its extractions rows, its ledger rows not yet recorded, the ledger
    parts its paid calls were recorded in at once, and its figures."""

    tally: ExtractionTally
    rows: list[dict] = field(default_factory=list)
    ledger_rows: list[dict] = field(default_factory=list)
    paid_parts: list = field(default_factory=list)


def extract_documents(doc_ids: Iterable[str], store: ExtractStore, skeleton: set[str], llm: Extractor | None,
                      offline: Extractor, cache: ExtractionCache | None, ledger: CostLedger | None, run_id: str,
                      masker: Callable | None = None, progress: Progress | None = None) -> StageResult:
    """Extract every chunk of the documents and write their `extractions` Parquet.

    skeleton: the chunk ids currently selected for LLM extraction. llm: None means offline only. A cache
    hit costs no call; a call that fails after the extractor's retries leaves the chunk its offline
    extraction, with the failure in `outcome` and `error` (so the next run sends it again: see
    documents_with_llm_failures). A paid call's ledger row is written at once, then its answer cached, then
    (crash point `extraction`) the next chunk goes; the document's rows are merged into one ledger part
    before its extractions are written. masker: applied by the caller's extractor
    (OpenAIExtractor(masker=...)); here only checked up front for the whole document, so a document whose
    masking fails sends nothing. Figures per document: ExtractionTally."""
    result = StageResult()
    doc_ids = list(doc_ids)
    offline_rows = OfflineRows(offline)
    frames = {d: store.read(CHUNKS, d) for d in doc_ids}
    # every chunk the offline extractor will see, in order, so that it parses them in batches across documents
    offline_rows.plan(c for frame in frames.values() for c in chunk_inputs(frame)
                      if llm is None or c.chunk_id not in skeleton)
    report.start("extracting", sum(f.height for f in frames.values()), "chunks")
    for doc_id, chunks in frames.items():
        run = _DocumentRun(ExtractionTally(chunks=chunks.height))
        tally = run.tally
        inputs = chunk_inputs(chunks)
        selected = [c for c in inputs if c.chunk_id in skeleton]
        tally.skeleton_chunks = len(selected)
        tally.not_sent = _masking_problem(llm, selected, masker) if llm is not None and selected else ""
        for chunk in inputs:
            in_skeleton = chunk.chunk_id in skeleton
            if llm is None or not in_skeleton or tally.not_sent:
                outcome = "not sent: masking failed" if (llm is not None and in_skeleton and tally.not_sent) else "ok"
                run.rows.append(offline_rows.row(chunk, in_skeleton, outcome,
                                                 tally.not_sent if outcome != "ok" else None))
                tally.offline_chunks += 1
            else:
                _extract_by_llm(chunk, llm, cache, ledger, run_id, run, offline_rows)
            report.advance("extracting")
        if ledger is not None and (run.ledger_rows or run.paid_parts):
            # before the extractions: a crash after a call never loses its cost; the document's per-call parts
            # and the rest of its rows (cache hits, refused chunks) end as one part
            part = ledger.record(run.ledger_rows)
            ledger.merge(run.paid_parts + ([part] if part else []))
        store.write(EXTRACTIONS, doc_id, stage_frame(EXTRACTIONS, run.rows))
        result.done.append(doc_id)
        result.rows += len(run.rows)
        result.tokens += tally.prompt_tokens + tally.completion_tokens
        result.figures[doc_id] = tally.figures()
        if progress:
            progress(1)
    return result


def _extract_by_llm(chunk: ChunkInput, llm: Extractor, cache: ExtractionCache | None, ledger: CostLedger | None,
                    run_id: str, run: _DocumentRun, offline_rows: OfflineRows) -> None:
    """One skeleton chunk by the LLM: a cache hit, else a call (its ledger row durable at once, its answer cached,
    then crash point `extraction`); a failed or refused call leaves the chunk its offline extraction."""
    tally = run.tally
    key = key_for(_cache_text(llm, chunk), llm.model, llm.prompt_version)
    entry = cache.entry(key) if cache is not None else None
    if entry is not None:
        extraction, meta = entry
        try:
            extracted_at = datetime.fromisoformat(meta["extracted_at"])
        except (KeyError, TypeError, ValueError):
            extracted_at = _now()
        run.rows.append(_row(chunk, extraction, llm.name, llm.model, llm.prompt_version, extracted_at, True,
                             cache_hit=True))
        run.ledger_rows.append(_ledger_row(llm, ExtractionOutcome(extraction, llm.name, llm.model,
                                                                  llm.prompt_version, attempts=0), chunk,
                                           run_id, cache_hit=True))
        tally.cache_hits += 1
        return
    outcome = llm.extract(chunk)
    row = _ledger_row(llm, outcome, chunk, run_id, cache_hit=False)
    if is_refused(outcome.outcome):  # nothing was sent: no cost, recorded with the document's rows
        run.ledger_rows.append(row)
        tally.llm_refused += 1
    else:
        if ledger is not None:  # durable at once: a crash after the call never loses its cost
            run.paid_parts.append(ledger.record([row]))
        tally.llm_calls += 1
        tally.prompt_tokens += outcome.prompt_tokens
        tally.completion_tokens += outcome.completion_tokens
    if outcome.outcome == "ok" and outcome.error is None and outcome.extractor == llm.name:
        extracted_at = _now()
        if cache is not None:  # only the LLM's own answer; a fallback is never cached as if it were
            cache.put(key, outcome.extraction, {"extracted_at": extracted_at.isoformat(),
                                                "chunk_id": chunk.chunk_id, "extractor": llm.name,
                                                "run_id": run_id, "attempts": outcome.attempts})
        run.rows.append(_row(chunk, outcome.extraction, outcome.extractor, outcome.model, outcome.prompt_version,
                             extracted_at, True, attempts=outcome.attempts))
    else:  # the chunk keeps its offline extraction; the failure is on its row and in the ledger
        if not is_refused(outcome.outcome):
            tally.llm_failures += 1
        tally.offline_chunks += 1
        run.rows.append(offline_rows.row(chunk, True, outcome.outcome, outcome.error or outcome.outcome,
                                         attempts=outcome.attempts))
    if not is_refused(outcome.outcome):
        crash_point(EXTRACTION_CRASH_POINT)  # the call is in the ledger and (if it succeeded) the cache


def is_refused(outcome: str) -> bool:
    """An extraction outcome of a chunk the circuit breaker did not send ("failed: circuit open", "fallback: …")."""
    return outcome.partition(": ")[2] == CIRCUIT_OPEN


def is_llm_failure(outcome: str) -> bool:
    """An extraction outcome of a skeleton chunk whose LLM call failed or was refused by the open circuit
    breaker (it kept its offline extraction); "not sent: masking failed" is not one: sending it again would
    fail the same way."""
    return outcome.startswith(("failed: ", "fallback: "))


def documents_with_llm_failures(store: ExtractStore, doc_ids: Iterable[str], skeleton: set[str]) -> dict[str, list[str]]:
    """doc_id -> its chunks still in the skeleton whose LLM extraction failed (or was refused by the circuit
    breaker) the last time: what the next run sends again. Only those chunks call the LLM then; the document's
    other chunks are cache hits."""
    doc_ids = set(doc_ids)
    if not doc_ids or not skeleton:
        return {}
    columns = ["doc_id", "chunk_id", "outcome"]
    try:
        frame = store.scan(EXTRACTIONS)
        frame = pl.DataFrame(schema={c: pl.Utf8 for c in columns}) if frame is None else frame.select(columns).collect()
    except Exception:  # noqa: BLE001 - a damaged file: read the others one by one (the damaged one is reported elsewhere)
        parts = []
        for doc_id in sorted(doc_ids):
            try:
                parts.append(store.read(EXTRACTIONS, doc_id).select(columns))
            except Exception:  # noqa: BLE001
                continue
        frame = pl.concat(parts) if parts else pl.DataFrame(schema={c: pl.Utf8 for c in columns})
    failed: dict[str, list[str]] = {}
    for doc_id, chunk, outcome in frame.iter_rows():
        if doc_id in doc_ids and chunk in skeleton and is_llm_failure(outcome or ""):
            failed.setdefault(doc_id, []).append(chunk)
    return {doc_id: sorted(chunks) for doc_id, chunks in sorted(failed.items())}


def documents_with_unflattened_extractions(store: ExtractStore, doc_ids: Iterable[str]) -> list[str]:
    """Documents whose lexical tables were not all written after their extractions: a run stopped (killed)
    between extracting a document and flattening it, so its statements, facts and entities are the previous
    extraction's. Re-running them costs no LLM call (their chunks are cache hits). By file times: a copy that
    does not keep them only makes documents re-run needlessly."""
    behind = []
    for doc_id in doc_ids:
        try:
            extracted = store.path(EXTRACTIONS, doc_id).stat().st_mtime_ns
        except FileNotFoundError:
            continue
        for stage in LEXICAL_STAGES:
            try:
                if store.path(stage, doc_id).stat().st_mtime_ns < extracted:
                    behind.append(doc_id)
                    break
            except FileNotFoundError:
                behind.append(doc_id)
                break
    return behind


def llm_failure_figures(ledger: pl.DataFrame, run_id: str) -> dict:
    """A run's LLM extraction failures from the cost ledger (a read ledger frame): failed calls in all and by
    reason, and chunks the open circuit breaker did not send. For the run's metadata."""
    rows = ledger.filter((pl.col("run_id") == run_id) & (pl.col("stage") == EXTRACTION_STAGE) & ~pl.col("cache_hit"))
    reasons: dict[str, int] = {}
    for outcome in rows["outcome"].to_list():
        if is_llm_failure(outcome or ""):
            reason = outcome.partition(": ")[2]
            reasons[reason] = reasons.get(reason, 0) + 1
    refused = reasons.pop(CIRCUIT_OPEN, 0)
    return {"batch_llm_failures": sum(reasons.values()), "batch_llm_failure_reasons": dict(sorted(reasons.items())),
            "batch_llm_refused_circuit_open": refused}


def read_skeleton(path) -> set[str]:
    """Chunk ids of the current skeleton selection (none before the corpus index was first built)."""
    try:
        frame = pl.read_parquet(path, columns=["chunk_id", "selected"])
    except FileNotFoundError:
        return set()
    return set(frame.filter(pl.col("selected"))["chunk_id"].to_list())


def documents_to_reextract(diff: dict, skeleton_path, catalog: Iterable[str]) -> list[str]:
    """Documents of the selection diff's newly selected chunks that are still indexed: only their chunks need
    the LLM. (A chunk that left the skeleton keeps the extraction it has: it was paid for.)"""
    newly = set(diff.get("newly_selected") or [])
    if not newly:
        return []
    try:
        frame = pl.read_parquet(skeleton_path, columns=["chunk_id", "doc_id"])
    except FileNotFoundError:
        return []
    catalog = set(catalog)
    docs = frame.filter(pl.col("chunk_id").is_in(list(newly)))["doc_id"].unique().to_list()
    return sorted(d for d in docs if d in catalog)


# --- extractors from the settings ----------------------------------------------------------------------


def offline_extractor(settings) -> Extractor:
    """The LLM-free extractor (spaCy's English pipeline): every chunk's extraction without a model call."""
    from lexgraph.extract.nlp_extractor import NLPExtractor

    return NLPExtractor(settings.entity_types)


def pii_masker(settings) -> Callable | None:
    """lexgraph.extract.pii.mask_pii when LEXGRAPH_PII_MASKING=on, else None."""
    if not settings.pii_masking_enabled:
        return None
    from lexgraph.extract.pii import mask_pii

    return mask_pii


def llm_config(settings):
    """The LLM client configuration of these settings: endpoint, model, key, entity types, timeouts and retries."""
    from lexgraph.extract.llm_config import LLMConfig

    return LLMConfig.from_settings(settings)


def llm_extractor(settings) -> Extractor | None:
    """The `openai` extractor when an endpoint is configured (settings.extractor), else None (offline only)."""
    if settings.extractor != "openai":
        return None
    from lexgraph.extract.llm_extractor import OpenAIExtractor

    return OpenAIExtractor(llm_config(settings), masker=pii_masker(settings))


def llm_prompt_version(settings) -> str:
    """The prompt version the `openai` extractor would have under these settings, computed without a client
    (equal to OpenAIExtractor(...).prompt_version): for code versions."""
    from lexgraph.extract.llm_extractor import SYSTEM_PROMPT, USER_TEMPLATE, compute_prompt_version
    from lexgraph.extract.schemas import extraction_model

    model = extraction_model(tuple(settings.entity_types))
    system = SYSTEM_PROMPT.replace("{entity_types}", ", ".join(model.entity_types))
    masker = pii_masker(settings)
    masking = None if masker is None else getattr(masker, "__qualname__", type(masker).__name__)
    return compute_prompt_version(system, model.entity_types, model, USER_TEMPLATE, masking)


def extractor_signature(settings) -> str:
    """What shapes an extraction besides the chunk: for the extraction assets' code versions, so a model or
    prompt change shows as a new code version."""
    offline = offline_extractor(settings)
    parts = [f"offline={offline.model}/{offline.prompt_version}", f"types={','.join(settings.entity_types)}"]
    if settings.extractor == "openai":
        parts.append(f"llm={settings.llm_model}/{llm_prompt_version(settings)}")
    return "|".join(parts)


def stale_documents(store: ExtractStore, doc_ids: Iterable[str], skeleton: set[str], llm_model: str | None,
                    llm_prompt: str | None, offline: Extractor) -> dict[str, str]:
    """doc_id -> why its extractions no longer match what the current extractors would give: a chunk without
    an extraction, a skeleton chunk not (successfully) extracted by the current LLM model and prompt version, or
    any other chunk not by the current offline rules; or lexical tables not flattened from the current
    extractions (a run killed between the two). What `lexgraph reextract` re-runs."""
    stale: dict[str, str] = {}
    doc_ids = list(doc_ids)
    for doc_id in documents_with_unflattened_extractions(store, doc_ids):
        stale[doc_id] = "its statements, facts and entities were not made from its current extractions"
    for doc_id in [d for d in doc_ids if d not in stale]:
        if not store.exists(CHUNKS, doc_id):
            continue
        chunks = store.read(CHUNKS, doc_id)["chunk_id"].to_list()
        if not store.exists(EXTRACTIONS, doc_id):
            stale[doc_id] = "never extracted"
            continue
        rows = {r["chunk_id"]: r for r in store.read(EXTRACTIONS, doc_id).iter_rows(named=True)}
        for chunk in chunks:
            row = rows.get(chunk)
            if row is None:
                stale[doc_id] = f"chunk {chunk} has no extraction"
                break
            by_llm = llm_model is not None and (row["model"], row["prompt_version"], row["outcome"]) == (
                llm_model, llm_prompt, "ok")
            if llm_model and chunk in skeleton:
                if not by_llm:
                    stale[doc_id] = (f"skeleton chunk {chunk} was extracted by {row['model']}/{row['prompt_version']} "
                                     f"({row['outcome']}), not {llm_model}/{llm_prompt}")
                    break
            # a chunk that left the skeleton keeps the LLM extraction it already paid for
            elif not by_llm and (row["model"], row["prompt_version"]) != (offline.model, offline.prompt_version):
                stale[doc_id] = (f"chunk {chunk} was extracted by {row['model']}/{row['prompt_version']}, "
                                 f"not {offline.model}/{offline.prompt_version}")
                break
    return stale
