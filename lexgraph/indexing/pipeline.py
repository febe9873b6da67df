"""The ingestion stages as plain functions: Dagster assets and the direct benchmark call the same code.

Each stage reads the previous stage's Parquet output from the ExtractStore and writes its own, so
any stage can be re-run alone and the stores can be rebuilt from files.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import polars as pl

from lexgraph import progress as report
from lexgraph.extract.chunking import TokenCounter, chunk_text
from lexgraph.extract.embedder import Embedder
from lexgraph.extract.keywords import KeywordExtraction, extract_keywords, keyword_stats
from lexgraph.extract.readers import PLAIN_TEXT_FORMATS, DocumentError, SourceDocument, read_document
from lexgraph.extract.source_texts import page_of, save_source_text
from lexgraph.faults import CATALOG, EMBEDDING, crash_point
from lexgraph.ids import chunk_id
from lexgraph.inbox import record_read_results
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore

SOURCES, CHUNKS, VECTORS = "sources", "chunks", "vectors"
KEYWORDS, KEYWORD_STATS = "keywords", "keyword_stats"
# The lexical graph's per-document stages (lexgraph.indexing.lexical_extraction and lexical write them).
EXTRACTIONS = "extractions"
STATEMENTS, TOPICS, FACTS, ENTITIES, RELATIONS = "statements", "topics", "facts", "entities", "relations"
# Cost-ledger stages of the embedding calls.
EMBEDDING_STAGE, KEYWORDS_STAGE = "embedding", "keywords"
HEADING_SEPARATOR = " > "
# Chunks embedded together across small documents, so a batch is never a handful of texts.
EMBED_GROUP_CHUNKS = 2048

Progress = Callable[[int], None]


@dataclass
class StageResult:
    """What one stage did over a batch of documents; failures never stop the others."""

    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # doc_id -> "path: problem"
    rows: int = 0
    tokens: int = 0
    figures: dict[str, dict] = field(default_factory=dict)  # doc_id -> that document's own figures


def save_source(document: SourceDocument, store: ExtractStore, version: str) -> None:
    row = {
        "doc_id": document.doc_id, "uri": document.uri, "relative_path": document.relative_path,
        "title": document.title, "format": document.format, "content_hash": document.content_hash,
        "size_bytes": document.size_bytes, "modified_at": document.modified_at, "version": version,
        "text": document.text, "page_starts": list(document.page_starts),
    }
    save_source_text(document, store)  # every version's text stays, so old citations can be shown
    store.write(SOURCES, document.doc_id, pl.DataFrame([row], schema_overrides={"page_starts": pl.List(pl.Int64)}))


def load_sources(paths: dict[str, Path | None], root: Path, store: ExtractStore, version: str) -> StageResult:
    """Read and validate each file (doc_id -> path, None when it is gone); bad files are reported."""
    result = StageResult()
    report.start("reading", len(paths), "documents")
    for doc_id, path in paths.items():
        report.advance("reading")
        if path is None:
            result.failed[doc_id] = f"{root}/{doc_id}: file no longer exists in the inbox (removed after it was scheduled)"
            continue
        try:
            document = read_document(path, root)
        except DocumentError as error:
            result.failed[doc_id] = str(error)
            continue
        save_source(replace(document, doc_id=doc_id), store, version)  # the caller's key is the partition key
        result.done.append(doc_id)
        result.rows += 1
        result.figures[doc_id] = {"rows": 1, "source_path": document.relative_path, "sha256": document.content_hash,
                                  "size_bytes": document.size_bytes, "modified_at": document.modified_at.isoformat(),
                                  "format": document.format, "characters": len(document.text)}
    # Read failures are remembered in the index's problems.json (beside extract/), so an unchanged bad file
    # is not re-run on every ingest; documents that read fine now are forgotten there.
    record_read_results(store.root.parent, root, paths, result.done, result.failed)
    return result


def chunk_frame(source: dict, counter: TokenCounter, max_tokens: int) -> pl.DataFrame:
    chunks = chunk_text(source["text"], counter, max_tokens, markdown=source["format"] not in PLAIN_TEXT_FORMATS)
    pages = source.get("page_starts") or []  # PDF pages, PPTX slides; none for other formats
    rows = [
        {
            "chunk_id": chunk_id(source["doc_id"], c.order, c.text),
            "doc_id": source["doc_id"], "order": c.order, "text": c.text,
            "char_start": c.char_start, "char_end": c.char_end,
            "page_start": page_of(pages, c.char_start), "page_end": page_of(pages, c.char_end - 1),
            "heading_path": HEADING_SEPARATOR.join(c.heading_path), "token_count": c.token_count,
            "source_path": source["relative_path"], "content_hash": source["content_hash"],
        }
        for c in chunks
    ]
    return pl.DataFrame(rows, schema=CHUNK_COLUMNS)


CHUNK_COLUMNS = {
    "chunk_id": pl.Utf8, "doc_id": pl.Utf8, "order": pl.Int32, "text": pl.Utf8, "char_start": pl.Int64,
    "char_end": pl.Int64, "heading_path": pl.Utf8, "token_count": pl.Int32, "source_path": pl.Utf8,
    "content_hash": pl.Utf8, "page_start": pl.Int32, "page_end": pl.Int32,
}


def chunk_documents(doc_ids: Iterable[str], store: ExtractStore, counter: TokenCounter, max_tokens: int,
                    progress: Progress | None = None) -> StageResult:
    limit = getattr(counter, "max_tokens", max_tokens)
    if max_tokens > limit:
        raise ValueError(f"chunk size {max_tokens} exceeds the embedder's input limit of {limit} word pieces")
    result = StageResult()
    doc_ids = list(doc_ids)
    report.start("chunking", len(doc_ids), "documents")
    for doc_id in doc_ids:
        source = store.read(SOURCES, doc_id).row(0, named=True)
        frame = chunk_frame(source, counter, max_tokens)
        report.advance("chunking")
        if frame.height == 0:
            result.failed[doc_id] = f"{source['relative_path']}: no text to index after normalisation"
            continue
        store.write(CHUNKS, doc_id, frame)
        result.done.append(doc_id)
        result.rows += frame.height
        result.tokens += int(frame["token_count"].sum())
        result.figures[doc_id] = {"rows": frame.height, "tokens": int(frame["token_count"].sum())}
        if progress:
            progress(1)
    return result


def shares(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights`, in whole numbers that add up to it."""
    whole = sum(weights)
    if not weights:
        return []
    if whole <= 0:
        return [total // len(weights)] * (len(weights) - 1) + [total - total // len(weights) * (len(weights) - 1)]
    parts = [total * w // whole for w in weights]
    parts[-1] += total - sum(parts)
    return parts


def ledger_rows(stage: str, model: str, run_id: str, doc_ids: list[str], weights: list[int], tokens: int,
                seconds: float) -> list[dict]:
    """One cost-ledger row per document for a batched embedding call, its tokens and time shared by weight."""
    token_shares = shares(tokens, weights)
    whole = sum(weights) or 1
    return [{"run_id": run_id or "direct", "stage": stage, "doc_id": d, "model": model, "prompt_tokens": n,
             "seconds": seconds * w / whole, "attempts": 1}
            for d, w, n in zip(doc_ids, weights, token_shares)]


def _embed_group(group: list[str], frames: list[pl.DataFrame], store: ExtractStore, embedder: Embedder,
                 vectors: VectorStore, ledger: CostLedger | None = None, run_id: str = "") -> int:
    chunks = pl.concat(frames)
    embedded = report.counter("embedding")
    before, started = embedder.stats.tokens, time.perf_counter()
    matrix = embedder.embed(chunks["text"].to_list(), progress=embedded)
    embedded.finish(chunks.height)
    if ledger is not None:
        ledger.record(ledger_rows(EMBEDDING_STAGE, embedder.model_name, run_id, group,
                                  [int(f["token_count"].sum()) for f in frames], embedder.stats.tokens - before,
                                  time.perf_counter() - started))
    offset = 0
    for doc_id, frame in zip(group, frames):
        part = matrix[offset : offset + frame.height]
        offset += frame.height
        store.write(VECTORS, doc_id, frame.select("chunk_id").with_columns(
            pl.Series("vector", part, dtype=pl.Array(pl.Float32, embedder.dimension))))
    vectors.replace_chunks(group, chunks.with_columns(pl.lit(embedder.model_name).alias("model")), matrix)
    return chunks.height


def embed_documents(doc_ids: Iterable[str], store: ExtractStore, embedder: Embedder, vectors: VectorStore,
                    progress: Progress | None = None, ledger: CostLedger | None = None,
                    run_id: str = "") -> StageResult:
    """Embed chunks of many documents in shared batches and replace them in LanceDB; each document's
    share of every batch is a cost-ledger row (stage "embedding")."""
    result = StageResult()
    group: list[str] = []
    frames: list[pl.DataFrame] = []
    before = embedder.stats.tokens
    doc_ids = list(doc_ids)
    report.start("embedding", sum(store.rows(CHUNKS, d) for d in doc_ids), "chunks")

    def flush() -> None:
        if group:
            result.rows += _embed_group(group, frames, store, embedder, vectors, ledger, run_id)
            result.done.extend(group)
            result.figures.update({d: {"rows": f.height, "tokens": int(f["token_count"].sum())} for d, f in zip(group, frames)})
            crash_point(EMBEDDING)
            if progress:
                progress(len(group))
        group.clear()
        frames.clear()

    for doc_id in doc_ids:
        group.append(doc_id)
        frames.append(store.read(CHUNKS, doc_id))
        if sum(f.height for f in frames) >= EMBED_GROUP_CHUNKS:
            flush()
    flush()
    result.tokens = embedder.stats.tokens - before
    return result


def load_graph(doc_ids: list[str], store: ExtractStore, graph: GraphStore, vectors: VectorStore) -> StageResult:
    """Write Source/Chunk nodes and edges, then mark the documents indexed in the catalog (last, so a
    crash before it makes the next reconcile redo the document)."""
    result = StageResult()
    if not doc_ids:
        return result
    report.start("graph", len(doc_ids), "documents")
    now = datetime.now(timezone.utc)
    sources = pl.concat([store.read(SOURCES, d).drop("text") for d in doc_ids]).with_columns(
        pl.lit(now).alias("ingested_at"))
    chunks = pl.concat([store.read(CHUNKS, d) for d in doc_ids])
    graph.replace_documents(sources.rename({"doc_id": "id"}), chunks)
    counts = chunks.group_by("doc_id").len("chunk_count")
    vectors.upsert_sources(sources.join(counts, on="doc_id", how="left").with_columns(
        pl.col("chunk_count").fill_null(0).cast(pl.Int32)))
    crash_point(CATALOG)
    report.advance("graph", len(doc_ids))
    result.done = list(doc_ids)
    result.rows = chunks.height
    per_doc = dict(counts.iter_rows())
    result.figures = {d: {"rows": int(per_doc.get(d, 0))} for d in doc_ids}
    return result


def purge_documents(doc_ids: list[str], store: ExtractStore, graph: GraphStore, vectors: VectorStore) -> None:
    """Everything indexed from these documents goes: graph nodes and edges, vectors, Parquet files."""
    graph.delete_documents(doc_ids)
    vectors.delete_documents(doc_ids)
    for doc_id in doc_ids:
        store.delete_document(doc_id)


def ingest_directly(paths: dict[str, Path], root: Path, settings: Settings, embedder: Embedder) -> dict[str, StageResult]:
    """All stages in one process without Dagster: the baseline for measuring orchestration overhead."""
    store = ExtractStore(settings.extract_dir)
    vectors = VectorStore(settings.lance_uri)
    ledger = CostLedger(settings.ledger_dir)
    sources = load_sources(paths, root, store, settings.index_version)
    chunks = chunk_documents(sources.done, store, embedder, settings.chunk_tokens)
    embedded = embed_documents(chunks.done, store, embedder, vectors, ledger=ledger, run_id="direct")
    keywords = extract_document_keywords(chunks.done, store, embedder, ledger=ledger, run_id="direct")
    with GraphStore.writer(settings.graph_path) as graph:
        graph_result = load_graph(embedded.done, store, graph, vectors)
    return {"sources": sources, "chunks": chunks, "vectors": embedded, "keywords": keywords, "graph": graph_result}



def extract_document_keywords(doc_ids: Iterable[str], store: ExtractStore, embedder: Embedder,
                              progress: Progress | None = None, ledger: CostLedger | None = None,
                              run_id: str = "") -> StageResult:
    """LLM-free keywords per chunk, plus per-keyword sums of sentence embeddings (KET-RAG's keyword
    vectors are their means); sentences of many documents are embedded in shared batches, each
    document's share a cost-ledger row (stage "keywords")."""
    result = StageResult()
    pending: list[tuple[str, KeywordExtraction]] = []
    before = embedder.stats.tokens

    def flush() -> None:
        sentences = [s for _, extraction in pending for s in extraction.sentences]
        report.start("keywords", len(sentences), "sentences")
        embedded = report.counter("keywords")
        tokens_before, started = embedder.stats.tokens, time.perf_counter()
        matrix = embedder.embed(sentences, progress=embedded)
        embedded.finish(len(sentences))
        if ledger is not None:
            ledger.record(ledger_rows(KEYWORDS_STAGE, embedder.model_name, run_id, [d for d, _ in pending],
                                      [len(e.sentences) for _, e in pending], embedder.stats.tokens - tokens_before,
                                      time.perf_counter() - started))
        offset = 0
        for doc_id, extraction in pending:
            vectors = matrix[offset : offset + len(extraction.sentences)]
            offset += len(extraction.sentences)
            store.write(KEYWORDS, doc_id, extraction.occurrences)
            store.write(KEYWORD_STATS, doc_id, keyword_stats(extraction.occurrences, vectors))
            result.done.append(doc_id)
            result.rows += extraction.occurrences.height
            result.figures[doc_id] = {"rows": extraction.occurrences.height, "sentences": len(extraction.sentences),
                                      "keywords": extraction.occurrences["keyword"].n_unique()}
        if progress:
            progress(len(pending))
        pending.clear()

    queued = 0
    for doc_id in doc_ids:
        chunks = store.read(CHUNKS, doc_id)
        extraction = extract_keywords(list(zip(chunks["chunk_id"].to_list(), chunks["text"].to_list())))
        pending.append((doc_id, extraction))
        queued += len(extraction.sentences)
        if queued >= EMBED_GROUP_CHUNKS:
            flush()
            queued = 0
    if pending:
        flush()
    result.tokens = embedder.stats.tokens - before
    return result
