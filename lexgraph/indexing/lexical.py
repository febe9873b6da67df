"""The lexical graph (Source → Chunk → Statement → Topic / Fact / Entity) in three replayable stages.

1. Extract (`lexical_extraction.extract_documents`): one ChunkExtraction per chunk, kept per document as the
   Parquet `extractions` stage (:mod:`lexgraph.indexing.lexical_extraction`: the LLM through the extraction
   cache for skeleton chunks, the offline extractor for the rest and for every failed call, every call in the
   cost ledger).
2. Flatten (`flatten_documents`): the extractions as tables per document: `statements`, `topics`,
   `facts`, `entities`, `relations`, each row with its provenance (extractor, model, prompt version,
   extraction time).
3. Load (`build_lexical_graph`): all documents' tables, with entity and fact resolution, into Kùzu
   (Statement, Topic, Fact, Entity nodes and their edges) and LanceDB (statement and entity vectors).
   Built from the Parquet files alone: rebuilding, or dropping a removed document's share, costs no
   LLM call. With a saved state (lexical_diff) only changed documents are read and only the difference
   is written; the whole rebuild is the checked fallback.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable, Sequence

import polars as pl

from lexgraph import progress as report
from lexgraph.indexing.pipeline import ENTITIES, EXTRACTIONS, FACTS, RELATIONS, STATEMENTS, TOPICS, StageResult
from lexgraph.faults import LEXICAL_GRAPH as LEXICAL_CRASH_POINT, crash_point
from lexgraph.ids import content_hash, short_hash
from lexgraph.indexing.lexical_tables import (COLUMNS, LEXICAL_STAGES, PROVENANCE, TOPIC_COLUMNS, LexicalGraphResult,
                                             stage_frame, write_merges)
from lexgraph.ledger import CostLedger
from lexgraph.storage.extract_store import ExtractStore

Progress = Callable[[int], None]


# --- 2. flatten ------------------------------------------------------------------------------------


def statement_id(chunk_id: str, topic: str, text: str) -> str:
    return f"st-{short_hash(f'{chunk_id}|{topic.casefold()}|{text}', 20)}"


def topic_id(doc_id: str, name: str) -> str:
    """Topics are scoped to one source: the same heading in two documents is two topics."""
    return f"tp-{short_hash(f'{doc_id}|{name.casefold()}', 20)}"


def flatten_extraction(row: dict, fact_id: Callable[[str, str, str], str],
                       out: dict[str, dict[str, list]] | None = None) -> dict[str, dict[str, list]]:
    """One extractions row as rows of the lexical tables (statements, topics, facts, entities, relations),
    appended column-wise to `out` (table -> column -> values; topics are derived from statements)."""
    if out is None:
        out = {stage: {column: [] for column in COLUMNS[stage]} for stage in LEXICAL_STAGES if stage != TOPICS}
    data = json.loads(row["extraction"])
    provenance = {k: row[k] for k in PROVENANCE}
    chunk, doc = row["chunk_id"], row["doc_id"]

    def add(stage: str, values: dict) -> None:
        for column, items in out[stage].items():
            items.append(values[column] if column in values else provenance[column])

    seen: set[str] = set()
    for topic in data.get("topics") or []:
        name = topic.get("name") or "general"
        tid = topic_id(doc, name)
        for statement in topic.get("statements") or []:
            text = statement.get("text") or ""
            sid = statement_id(chunk, name, text)
            if not text or sid in seen:
                continue
            seen.add(sid)
            add(STATEMENTS, {"statement_id": sid, "chunk_id": chunk, "doc_id": doc, "topic_id": tid, "topic": name,
                             "text": text})
            for fact in statement.get("facts") or []:
                subject, predicate, obj = fact.get("subject"), fact.get("predicate"), fact.get("object")
                try:
                    identifier = fact_id(subject or "", predicate or "", obj or "")
                except ValueError:  # a part with no letter or digit: not a fact
                    continue
                add(FACTS, {"fact_id": identifier, "subject": subject, "predicate": predicate, "object": obj,
                            "statement_id": sid, "chunk_id": chunk, "doc_id": doc})
    for entity in data.get("entities") or []:
        if entity.get("name"):
            add(ENTITIES, {"entity_name": entity["name"], "entity_type": entity.get("type") or "other",
                           "description": entity.get("description") or "", "mention": entity.get("mention") or "",
                           "chunk_id": chunk, "doc_id": doc})
    for relation in data.get("relations") or []:
        if relation.get("source") and relation.get("target"):
            add(RELATIONS, {"source": relation["source"], "target": relation["target"],
                            "predicate": relation.get("predicate") or "", "description": relation.get("description") or "",
                            "strength": float(relation.get("strength") or 0.0), "chunk_id": chunk, "doc_id": doc})
    return out


def flatten_documents(doc_ids: Iterable[str], store: ExtractStore, progress: Progress | None = None) -> StageResult:
    """Write each document's statements, topics, facts, entities and relations from its extractions.
    Figures per document: one count per table (`rows` is the statement count)."""
    from lexgraph.indexing.name_keys import fact_id

    result = StageResult()
    doc_ids = list(doc_ids)
    report.start("statements", len(doc_ids), "documents")
    for doc_id in doc_ids:
        columns = None
        for row in store.read(EXTRACTIONS, doc_id).iter_rows(named=True):
            columns = flatten_extraction(row, fact_id, columns)
        tables = {stage: pl.DataFrame(values, schema=COLUMNS[stage]) for stage, values in (columns or {}).items()}
        tables = {stage: tables.get(stage, stage_frame(stage, [])) for stage in LEXICAL_STAGES if stage != TOPICS}
        statements = tables[STATEMENTS]
        topics = (statements.group_by("topic_id", maintain_order=True)
                  .agg(pl.col("topic").first().alias("name"), pl.col("doc_id").first(),
                       pl.len().cast(pl.Int32).alias("statements"))
                  .select(list(TOPIC_COLUMNS))) if statements.height else stage_frame(TOPICS, [])
        frames = {STATEMENTS: statements, TOPICS: topics, FACTS: tables[FACTS], ENTITIES: tables[ENTITIES],
                  RELATIONS: tables[RELATIONS]}
        for stage, frame in frames.items():
            store.write(stage, doc_id, frame)
        result.done.append(doc_id)
        result.rows += statements.height
        result.figures[doc_id] = {"rows": statements.height, **{stage: frame.height for stage, frame in frames.items()}}
        report.advance("statements")
        if progress:
            progress(1)
    return result


def lexical_hashes(store: ExtractStore, stage: str, doc_ids: Iterable[str]) -> dict[str, str | None]:
    """doc_id -> hash of what a lexical stage holds for the document, with extraction times, cache hits and
    skeleton flags left out (so a re-run that extracts the same gives the same hash); None without output."""
    hashes: dict[str, str | None] = {}
    for doc_id in doc_ids:
        path = store.path(stage, doc_id)
        try:
            frame = pl.read_parquet(path)
        except Exception:  # missing or damaged: no hash, and the data version says so
            hashes[doc_id] = None
            continue
        kept = [c for c in frame.columns if c not in ("extracted_at", "cache_hit", "attempts", "in_skeleton")]
        hashes[doc_id] = content_hash(frame.select(kept).write_csv())
    return hashes


# --- 3. load (lexical_diff: by difference, or the whole rebuild) ---------------------------------------


def build_lexical_graph(doc_ids: Sequence[str], store: ExtractStore, graph, vectors, embedder,
                        ledger: CostLedger | None = None, run_id: str = "", merges_path=None,
                        state_dir=None) -> LexicalGraphResult:
    """Bring the lexical graph to these documents (the catalog) from their Parquet tables: every Statement,
    Topic, Fact and Entity node with its edges in Kùzu, statement and entity vectors in LanceDB (only new or
    changed texts are embedded; each embedding call is a ledger row), entity merges to `merges_path`.
    No LLM is called: a removed document's statements, and the facts and entities only it supported, go.

    state_dir: where the build keeps what it needs from earlier runs (lexical_diff); with it, only changed
    documents are read and only the differences written ("diff"), and everything is rebuilt when that state is
    missing, unreadable, not known to match the stores, or a count disagrees afterwards ("rebuild"). Without it,
    every run rebuilds. A document whose lexical table is damaged is named in `damaged` and keeps what it had."""
    from lexgraph.indexing import lexical_diff
    from lexgraph.indexing.lexical_state import load_state

    result = LexicalGraphResult()
    report.start("lexical graph", 1, "build")
    state, reason = load_state(state_dir)
    if state is not None:
        reason = lexical_diff.diff_lexical_graph(state, list(doc_ids), store, graph, vectors, embedder, result,
                                                 run_id, state_dir)
    if state is None or reason:
        result = LexicalGraphResult(reason=reason, ledger_rows=result.ledger_rows)  # a failed diff's calls stay paid
        lexical_diff.rebuild_lexical_graph(list(doc_ids), store, graph, vectors, embedder, result, run_id, state_dir)
    write_merges(result.merges_frame, merges_path)
    if ledger is not None and result.ledger_rows:
        ledger.record(result.ledger_rows)
    crash_point(LEXICAL_CRASH_POINT)
    report.advance("lexical graph", 1)
    return result
