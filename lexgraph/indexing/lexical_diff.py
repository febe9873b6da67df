"""The lexical graph kept current by difference: only changed documents' tables are read, only the entity, fact
and relation keys they touch are resolved again, and only what differs is written to Kùzu and LanceDB.

What the build needs from earlier runs (the documents' signatures, every document's keyed entity, fact and
relation rows, the resolved global frames) is the saved state, kept under the corpus folder: its files and
frames are :mod:`lexgraph.indexing.lexical_state`.

A name split by type (entity_resolution.entity_senses: a person and a place called Jordan) resolves every row of that
name by the key's split, so a change that creates, dissolves or tips a split ("resolved again") also rewrites
the other documents whose rows name it: their mentions, facts and relations of it now resolve to other ids.

Statement, Topic and their edges (EXTRACTED_FROM, BELONGS_TO, TOPIC_OF, SUPPORTS, MENTIONED_IN) belong to one
document each, so a changed document's share is deleted and written again whole. Facts, entities and their
edges are global: their old and new frames are compared and only the differences written.

Crash safety: the state is marked "not synced" (lexical_state.mark_writing) before any store is written and
saved as synced only after Kùzu, LanceDB and the new files are written, so a process killed in between makes
the next run rebuild everything.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from lexgraph.ids import content_hash
from lexgraph.indexing import lexical_tables
from lexgraph.indexing.lexical_state import (GLOBAL_NODES, GLOBAL_RELS, KEY, PAIR, ROW_TABLES, LexicalState,
                                             concat_tables, global_frames, keyed_rows, mark_writing, save_state,
                                             splice_frames, touched_tables, within)
from lexgraph.indexing.lexical_tables import LEXICAL_STAGES
from lexgraph.indexing.pipeline import ENTITIES, FACTS, RELATIONS, STATEMENTS

DOC_NODES = ("Statement", "Topic")
DOC_RELS = ("EXTRACTED_FROM", "BELONGS_TO", "TOPIC_OF", "SUPPORTS", "MENTIONED_IN")
# Doc-scoped rel tables too large to count whole on every run (one edge per statement): counted for the
# rewritten documents only; every other table is counted whole after a diff.
COUNTED_BY_DOCUMENT = ("EXTRACTED_FROM", "BELONGS_TO")
# Past this share of the documents (and this many), a rebuild is cheaper than the diff: deleting a document's
# share goes row by row, dropping and recreating the tables does not.
REBUILD_SHARE, REBUILD_MIN_DOCUMENTS = 0.25, 50


def rewrite_is_cheaper(changed: int, total: int) -> bool:
    """A store diff over this many of `total` documents costs more than writing the store again (Kùzu
    deletes edges one by one: a diff over every document of a 100k-chunk corpus ran for over 10 minutes)."""
    return changed >= REBUILD_MIN_DOCUMENTS and changed > REBUILD_SHARE * total


def lexical_signature(store, doc_id: str) -> str | None:
    """One hash of the size and modification time of a document's lexical tables; None when one is missing."""
    parts = []
    for stage in LEXICAL_STAGES:
        try:
            stat = store.path(stage, doc_id).stat()
        except FileNotFoundError:
            return None
        parts.append(f"{stage}|{stat.st_size}|{stat.st_mtime_ns}")
    return content_hash("\n".join(parts))[:16]


# --- frames --------------------------------------------------------------------------------------------------


def anchored_global(frames: dict) -> dict[str, pl.DataFrame]:
    """The SUBJECT, OBJECT and RELATED edges whose nodes exist (a fact's subject need not be an extracted entity)."""
    entities, facts = frames["Entity"]["id"], frames["Fact"]["id"]
    return {
        "SUBJECT": frames["SUBJECT"].filter(within("from", entities) & within("to", facts)),
        "OBJECT": frames["OBJECT"].filter(within("from", entities) & within("to", facts)),
        "RELATED": frames["RELATED"].filter(within("from", entities) & within("to", entities)),
    }


def anchored_documents(nodes: dict[str, pl.DataFrame], edges: dict[str, pl.DataFrame], chunks: pl.DataFrame,
                       sources: set[str], frames: dict) -> dict[str, pl.DataFrame]:
    """The doc-scoped edges whose nodes exist, each with the `doc_id` it belongs to (dropped before writing).
    chunks: id, doc_id of the graph's Chunk nodes of these documents; sources: Source ids in the graph."""
    statements = nodes["Statement"].select("id", "doc_id")
    topics = nodes["Topic"]["id"]
    by_statement = lambda frame, column: frame.join(statements.rename({"id": column}), on=column)  # noqa: E731
    chunk_docs = chunks.select(pl.col("id").alias("to"), "doc_id")
    return {
        "EXTRACTED_FROM": by_statement(edges["EXTRACTED_FROM"], "from").filter(within("to", chunks["id"])),
        "BELONGS_TO": by_statement(edges["BELONGS_TO"], "from").filter(within("to", topics)),
        "TOPIC_OF": edges["TOPIC_OF"].filter(within("from", topics) & within("to", list(sources)))
                                     .with_columns(pl.col("to").alias("doc_id")),
        "SUPPORTS": by_statement(edges["SUPPORTS"], "to").filter(within("from", frames["Fact"]["id"])),
        "MENTIONED_IN": edges["MENTIONED_IN"].filter(within("from", frames["Entity"]["id"]))
                                             .join(chunk_docs, on="to"),
    }


def document_counts(doc_ids: list[str], nodes: dict[str, pl.DataFrame], anchored: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """doc_id and its rows in each doc-scoped table, as written."""
    counts = pl.DataFrame({"doc_id": doc_ids}, schema={"doc_id": pl.String})
    for table, frame in [*((t, nodes[t]) for t in DOC_NODES), *anchored.items()]:
        per_doc = frame.group_by("doc_id").agg(pl.len().cast(pl.Int64).alias(table))
        counts = counts.join(per_doc, on="doc_id", how="left").with_columns(pl.col(table).fill_null(0))
    return counts


def frame_diff(old: pl.DataFrame, new: pl.DataFrame, key: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(removed keys, added rows, changed rows: the new values) between two frames of one schema."""
    removed = old.select(key).join(new.select(key), on=key, how="anti")
    added = new.join(old.select(key), on=key, how="anti")
    before = old.select(*key, _row_text(old).alias("_before"))
    changed = (new.with_columns(_row_text(new).alias("_after")).join(before, on=key, how="inner")
               .filter(pl.col("_after") != pl.col("_before")).select(new.columns))
    return removed, added, changed


def _row_text(frame: pl.DataFrame) -> pl.Expr:
    """A row's values as one string (lists joined, nulls marked), to tell changed rows apart."""
    parts = []
    for name, dtype in frame.schema.items():
        column = pl.col(name).list.join("\x1d") if isinstance(dtype, pl.List) else pl.col(name).cast(pl.String)
        parts.append(column.fill_null("\x00"))
    return pl.concat_str(parts, separator="\x1f")


# --- the two ways of writing the stores -------------------------------------------------------------------------


def read_documents(store, doc_ids: list[str]) -> tuple[dict[str, dict[str, pl.DataFrame]], dict[str, str]]:
    """Each document's lexical tables; a damaged or vanished file is named (doc_id -> "path: problem") instead."""
    from lexgraph.errors import FileProblem

    read, damaged = {}, {}
    for doc_id in doc_ids:
        try:
            read[doc_id] = concat_tables([{stage: store.read(stage, doc_id) for stage in LEXICAL_STAGES}])
        except (FileProblem, FileNotFoundError) as error:
            damaged[doc_id] = str(error)
    return read, damaged


def _documents(counts: pl.DataFrame, signatures: dict[str, str], loaded: dict[str, str],
               statement_signatures: dict[str, str]) -> pl.DataFrame:
    docs = counts["doc_id"].to_list()
    return counts.with_columns(
        pl.Series("signature", [signatures[d] for d in docs], dtype=pl.String),
        pl.Series("loaded", [loaded.get(d, "") for d in docs], dtype=pl.String),
        pl.Series("statement_signature", [statement_signatures.get(d) for d in docs], dtype=pl.String),
    )


def _counts(graph, tables) -> dict[str, int]:
    return {table: graph.count(table) for table in tables}


def rebuild_lexical_graph(doc_ids: list[str], store, graph, vectors, embedder, result, run_id: str,
                          state_dir: Path | None) -> None:
    """Every table emptied and written again from every document's Parquet tables; the state saved afresh."""
    result.mode = "rebuild"
    signatures = {d: lexical_signature(store, d) for d in doc_ids}  # before reading: a later write is not missed
    result.missing = [d for d in doc_ids if signatures[d] is None]
    per_doc, result.damaged = read_documents(store, [d for d in doc_ids if signatures[d] is not None])
    result.documents = result.documents_read = list(per_doc)
    tables = concat_tables(list(per_doc.values()))
    del per_doc
    nodes, edges, _, merges = lexical_tables.lexical_graph_frames(tables)
    frames = global_frames(nodes, edges, merges)
    loaded = graph.source_versions()
    doc_edges = anchored_documents(nodes, edges, graph.chunks_of(None), set(loaded), frames)
    mark_writing(state_dir)
    graph.replace_lexical_graph(nodes, {**{rel: f.drop("doc_id") for rel, f in doc_edges.items()},
                                        **anchored_global(frames)})
    result.counts = _counts(graph, (*nodes, *edges))
    result.written = {table: {"added": n} for table, n in result.counts.items()}
    result.embedded["statements"], tokens, rows, statement_signatures = lexical_tables.update_statement_vectors(
        tables[STATEMENTS], vectors, embedder, run_id)
    result.statement_vectors = "scanned"
    result.embedded["entities"], entity_tokens, entity_rows = lexical_tables.replace_entity_vectors(
        nodes["Entity"], vectors, embedder, run_id)
    result.entity_vectors = "replaced"
    result.embedding_tokens += tokens + entity_tokens
    result.ledger_rows += rows + entity_rows
    counts = document_counts(result.documents, nodes, doc_edges)
    documents = _documents(counts, signatures, loaded, statement_signatures)
    save_state(state_dir, LexicalState(documents, keyed_rows(tables), frames))
    _finish(result, frames, statement_signatures)


def _finish(result, frames: dict, statement_signatures: dict[str, str]) -> None:
    from lexgraph.indexing.entity_resolution import KEPT_APART

    merges = frames["merges"]
    result.merges_frame = merges
    result.merges = merges.filter(~pl.col("reason").str.starts_with(KEPT_APART)).height  # a split folds nothing
    result.merged_surface_forms = int(merges["mention_count"].sum() or 0)
    result.digest = lexical_tables.lexical_digest(statement_signatures, frames)


@dataclass
class DocumentChanges:
    """Which documents a diff reads and rewrites, against the saved state."""

    current: dict[str, str]  # doc_id -> signature of its lexical tables (catalog documents that have them)
    loaded: dict[str, str]  # doc_id -> when its Source node was loaded
    read: dict[str, dict[str, pl.DataFrame]]  # the documents read: their lexical tables
    rewrite: list[str]  # documents whose own share of the graph is deleted (and written again when read)
    kept: set[str]  # damaged documents that keep their previous share


def classify_documents(state: LexicalState, doc_ids: list[str], store, graph, result) -> DocumentChanges:
    """Added, changed (signature), reloaded (Source load time) and removed documents; only the first three are
    read. A damaged document keeps its share while the graph still holds it; else it is left out."""
    signatures = {d: lexical_signature(store, d) for d in doc_ids}  # before reading: a later write is not missed
    current = {d: s for d, s in signatures.items() if s is not None}
    result.missing = sorted(d for d in doc_ids if signatures[d] is None)
    loaded = graph.source_versions()
    old = {row["doc_id"]: row for row in state.documents.iter_rows(named=True)}
    added = sorted(d for d in current if d not in old)
    changed = sorted(d for d in current if d in old and old[d]["signature"] != current[d])
    reloaded = sorted(d for d in current if d in old and old[d]["signature"] == current[d]
                      and old[d]["loaded"] != loaded.get(d, ""))
    removed = sorted(d for d in old if d not in current)
    read, result.damaged = read_documents(store, [*added, *changed, *reloaded])
    kept = {d for d in result.damaged if d in old and old[d]["loaded"] == loaded.get(d, "")}
    left_out = set(result.damaged) - kept
    result.changes = {"added": [d for d in added if d in read], "changed": [d for d in changed if d in read],
                      "reloaded": [d for d in reloaded if d in read],
                      "removed": removed + sorted(d for d in left_out if d in old), "resolved_again": []}
    result.documents_read = sorted(read)
    rewrite = sorted(set(read) | set(removed) | left_out)
    result.documents = sorted(set(read) | (set(old) - set(rewrite)))
    return DocumentChanges(current, loaded, read, rewrite, kept)


def resplit_documents(state: LexicalState, new_rows: dict[str, pl.DataFrame], rewrite: list[str]) -> list[str]:
    """Documents outside `rewrite` whose rows of a name resolve to another id after the change, because it splits
    the name by type, joins it again, or hands the name's own id to the other family. A split made or undone moves
    only the rows typed away from the family that keeps the id (and the rest of their chunks); a family that takes
    over the id moves every row of the name."""
    from lexgraph.indexing.entity_resolution import entity_senses, family_of
    from lexgraph.indexing.name_keys import entity_id_of_key

    old = state.rows[ENTITIES]
    keys = set(old.filter(within("doc_id", rewrite))[KEY].drop_nulls()) | set(new_rows[ENTITIES][KEY].drop_nulls())
    before = old.filter(within(KEY, list(keys)))
    after = pl.concat([before.filter(~within("doc_id", rewrite)),
                       new_rows[ENTITIES].filter(within(KEY, list(keys))).select(old.columns)])
    was, now = ({k: split.major for k, split in entity_senses(rows).items()} for rows in (before, after))
    changed = {key for key, _ in was.items() ^ now.items()}
    if not changed:
        return []
    others = ~within("doc_id", rewrite)
    taken = sorted(k for k in changed if k in was and k in now)  # the other family has the name's id now
    keeps = {k: was.get(k) or now[k] for k in changed if k not in taken}  # split made or undone
    docs = {doc for doc, key, kind in old.filter(others & within(KEY, list(keeps)))
            .select("doc_id", KEY, "entity_type").unique().iter_rows() if family_of(kind or "") not in ("", keeps[key])}
    if taken:
        ids = [entity_id_of_key(k) for k in taken]
        ends = lambda column, sep, values: (within(pl.col(column).str.split(sep).list.first(), values)  # noqa: E731
                                            | within(pl.col(column).str.split(sep).list.last(), values))
        docs |= set(old.filter(others & within(KEY, taken))["doc_id"])
        docs |= set(state.rows[FACTS].filter(others & ends(KEY, "\x1f", taken))["doc_id"])
        docs |= set(state.rows[RELATIONS].filter(others & ends(PAIR, "|", ids))["doc_id"])
    return sorted(docs)


def _senses(rows: dict[str, pl.DataFrame], relations: pl.DataFrame, entity_keys: set, fact_keys: set) -> dict:
    """The splits by type of the touched entity keys and of every name the touched facts and relations name:
    each from all documents' entity rows of that name (a fact resolves by rows other documents hold)."""
    from lexgraph.indexing.entity_resolution import entity_senses
    from lexgraph.indexing.name_keys import normalise_entity_name

    named = set(relations["source"].drop_nulls()) | set(relations["target"].drop_nulls())
    keys = set(entity_keys) | {normalise_entity_name(name) for name in named}
    for key in fact_keys:
        subject, _, obj = key.split("\x1f")
        keys |= {subject, obj}
    return entity_senses(rows[ENTITIES].filter(within(KEY, list(keys))))


def _variants(entity_keys: set, fact_keys: set, pairs: set) -> tuple[set, set, set]:
    """Every entity id, fact id and id pair the touched keys can have resolved to, before or now (a split
    gives a family an id of its own): what the splice replaces."""
    from lexgraph.indexing.entity_resolution import entity_id_variants, fact_id_variants
    from lexgraph.indexing.name_keys import entity_id_of_key, fact_id_of_key

    entity_ids = {v for key in entity_keys for v in entity_id_variants(entity_id_of_key(key))}
    fact_ids = {v for key in fact_keys for v in fact_id_variants(fact_id_of_key(key))}
    id_pairs = set()
    for pair in pairs:
        first, second = pair.split("|")
        id_pairs |= {"|".join(sorted((a, b))) for a in entity_id_variants(first) for b in entity_id_variants(second)}
    return entity_ids, fact_ids, id_pairs


def resolve_touched(state: LexicalState, new_rows: dict[str, pl.DataFrame],
                    rewrite: list[str]) -> tuple[dict, dict, dict]:
    """Every document's rows with the rewritten documents' replaced, and the global frames with the keys those
    documents' old and new rows touch resolved again (from all their rows). -> (rows, frames, the splits by
    type that resolution used, for the rewritten documents' own share)."""
    leaving = {t: state.rows[t].filter(within("doc_id", rewrite)) for t in ROW_TABLES}
    rows = {t: pl.concat([state.rows[t].filter(~within("doc_id", rewrite)), new_rows[t].select(state.rows[t].columns)],
                         how="vertical_relaxed") for t in ROW_TABLES}
    keys = lambda table, column: {k for t in (leaving, new_rows) for k in t[table][column].drop_nulls().to_list()}  # noqa: E731
    entity_keys, fact_keys, pairs = keys(ENTITIES, KEY), keys(FACTS, KEY), keys(RELATIONS, PAIR)
    tables = touched_tables(rows, entity_keys, fact_keys, pairs)
    senses = _senses(rows, tables[RELATIONS], entity_keys, fact_keys)
    nodes, edges, _, merges = lexical_tables.lexical_graph_frames(tables, senses=senses)
    frames = splice_frames(state.frames, global_frames(nodes, edges, merges), *_variants(entity_keys, fact_keys, pairs))
    return rows, frames, senses


def diff_lexical_graph(state: LexicalState, doc_ids: list[str], store, graph, vectors, embedder, result,
                       run_id: str, state_dir: Path | None) -> str:
    """Read the changed documents, resolve the keys they touch, write the differences. -> "" when done, else
    why the stores cannot be trusted (the caller rebuilds)."""
    result.mode = "diff"
    docs = classify_documents(state, doc_ids, store, graph, result)
    if rewrite_is_cheaper(len(docs.rewrite), state.documents.height):
        return f"{len(docs.rewrite)} of {state.documents.height} documents changed: a rebuild is cheaper"
    new_tables = concat_tables([docs.read[d] for d in sorted(docs.read)])
    new_rows = keyed_rows(new_tables)
    again = resplit_documents(state, new_rows, docs.rewrite)
    if again:  # read like a reloaded document: its share is written again with the names' new ids
        more, damaged = read_documents(store, again)
        if damaged:
            return f"{len(damaged)} document(s) naming an entity split or joined by type are unreadable"
        docs.read.update(more)
        docs.rewrite = sorted(set(docs.rewrite) | set(more))
        result.documents_read, result.changes["resolved_again"] = sorted(docs.read), sorted(more)
        if rewrite_is_cheaper(len(docs.rewrite), state.documents.height):
            return f"{len(docs.rewrite)} of {state.documents.height} documents to rewrite: a rebuild is cheaper"
        new_tables = concat_tables([docs.read[d] for d in sorted(docs.read)])
        new_rows = keyed_rows(new_tables)
    rows, frames, senses = resolve_touched(state, new_rows, docs.rewrite)
    # the read documents' own share, and what changed among facts, entities and their edges
    d_nodes, d_edges, _, _ = lexical_tables.lexical_graph_frames(new_tables, senses=senses)
    d_anchored = anchored_documents(d_nodes, d_edges, graph.chunks_of(sorted(docs.read)), set(docs.loaded), frames)
    node_diff = {t: frame_diff(state.frames[t], frames[t], ["id"]) for t in GLOBAL_NODES}
    old_edges, new_edges = anchored_global(state.frames), anchored_global(frames)
    edge_diff = {rel: frame_diff(old_edges[rel], new_edges[rel], ["from", "to"]) for rel in GLOBAL_RELS}

    mark_writing(state_dir)
    try:
        _write_diff(graph, docs.rewrite, node_diff, edge_diff, d_nodes, d_anchored)
    except RuntimeError as error:  # an edge to a node the graph does not hold: it is not what the state says
        return f"the diff could not be written ({str(error).splitlines()[0][:200]})"
    counts = document_counts(sorted(docs.read), d_nodes, d_anchored)
    statement_rows = {d: lexical_tables.statement_vector_rows(docs.read[d][STATEMENTS]) for d in docs.read}
    fresh = {d: sig for d in docs.read if (sig := lexical_tables.statement_signatures(statement_rows[d]).get(d))}
    documents = pl.concat([state.documents.filter(~within("doc_id", docs.rewrite)),
                           _documents(counts, docs.current, docs.loaded, fresh).select(state.documents.columns)],
                          how="vertical_relaxed").sort("doc_id")
    problem = _verify_counts(graph, documents, counts, frames, new_edges, sorted(docs.read), result)
    if problem:
        return problem
    result.written = _written(state.documents, docs.rewrite, counts, node_diff, edge_diff)
    now = _update_statement_vectors(state, docs, statement_rows, fresh, store, vectors, embedder, result, run_id)
    _update_entity_vectors(state, node_diff["Entity"], frames["Entity"], vectors, embedder, result, run_id)
    save_state(state_dir, LexicalState(documents, rows, frames))
    _finish(result, frames, now)
    return ""


def _verify_counts(graph, documents: pl.DataFrame, counts: pl.DataFrame, frames: dict, edges: dict,
                   read: list[str], result) -> str:
    """Kùzu's counts against the state's; EXTRACTED_FROM and BELONGS_TO for the documents just written."""
    expected = {t: int(documents[t].sum()) for t in (*DOC_NODES, *DOC_RELS) if t not in COUNTED_BY_DOCUMENT}
    expected.update({t: frames[t].height for t in GLOBAL_NODES})
    expected.update({rel: edges[rel].height for rel in GLOBAL_RELS})
    measured = _counts(graph, expected)
    for rel in COUNTED_BY_DOCUMENT:
        if graph.lexical_edges_of(rel, read) != int(counts[rel].sum()):
            return f"after the diff, the rewritten documents' {rel} edges are not what was written"
        measured[rel] = int(documents[rel].sum())  # the other documents' were counted when they were written
    wrong = {t: (measured[t], n) for t, n in expected.items() if measured[t] != n}
    if wrong:
        return "after the diff, Kùzu's counts disagree: " + ", ".join(f"{t} {m} not {n}" for t, (m, n) in wrong.items())
    result.counts = measured
    return ""


def _update_statement_vectors(state: LexicalState, docs: DocumentChanges, statement_rows: dict, fresh: dict,
                              store, vectors, embedder, result, run_id: str) -> dict[str, str]:
    """The saved signatures stand for the stored rows when the untouched documents' rows add up (a purge has
    already deleted a removed document's rows); else the whole table is scanned. -> doc_id -> signature."""
    from lexgraph.storage.vector_store import _in_list

    untouched = state.documents.filter(~within("doc_id", docs.rewrite))
    now = {**{d: s for d, s in zip(untouched["doc_id"], untouched["statement_signature"]) if s}, **fresh}
    touched_rows = vectors.count(lexical_tables.STATEMENT_VECTORS, _in_list("doc_id", docs.rewrite)) if docs.rewrite else 0
    if vectors.count(lexical_tables.STATEMENT_VECTORS) - touched_rows == int(untouched["Statement"].sum()):
        result.statement_vectors = "saved signatures"
        before = {d: s for d, s in zip(state.documents["doc_id"], state.documents["statement_signature"]) if s}
        before.update({d: "-" for d in docs.rewrite})  # rewritten: their rows are replaced
    else:
        result.statement_vectors = "scanned (the stored rows did not add up to the saved counts)"
        before = lexical_tables.stored_statement_signatures(vectors)
    before.update({d: now[d] for d in docs.kept if d in now})  # a damaged document's rows stay as they are

    def statements_of(doc_id: str) -> pl.DataFrame:
        if doc_id in statement_rows:
            return statement_rows[doc_id]
        return lexical_tables.statement_vector_rows(store.read(STATEMENTS, doc_id))

    result.embedded["statements"], tokens, rows = lexical_tables.write_statement_vectors(now, before, statements_of, vectors,
                                                                                  embedder, run_id)
    result.embedding_tokens += tokens
    result.ledger_rows += rows
    return now


def _update_entity_vectors(state: LexicalState, entity_diff: tuple, entities: pl.DataFrame, vectors, embedder, result,
                           run_id: str) -> None:
    """Only the entities whose row changed are written; the whole table when its rows do not add up."""
    gone, new, updated = entity_diff
    result.entity_changes = {kind: frame["id"].to_list() for kind, frame in (("gone", gone), ("new", new),
                                                                            ("updated", updated))}
    written = None
    if vectors.count(lexical_tables.ENTITY_VECTORS) == state.frames["Entity"].height:
        written = lexical_tables.upsert_entity_vectors(pl.concat([new, updated]), gone["id"].to_list(), entities.height,
                                                vectors, embedder, run_id)
    result.entity_vectors = "upserted" if written is not None else "replaced (the stored rows did not add up)"
    if written is None:
        written = lexical_tables.replace_entity_vectors(entities, vectors, embedder, run_id)
    result.embedded["entities"] = written[0]
    result.embedding_tokens += written[1]
    result.ledger_rows += written[2]


def _write_diff(graph, rewrite: list[str], node_diff: dict, edge_diff: dict, d_nodes: dict, d_anchored: dict) -> None:
    """Deletions first (documents' shares, nodes, edges), then updates, then new nodes, then new edges."""
    graph.delete_lexical_documents(rewrite)
    for table, (gone, _, _) in node_diff.items():
        graph.delete_lexical_nodes(table, gone["id"].to_list())
    for rel, (gone, _, updated) in edge_diff.items():
        graph.delete_lexical_edges(rel, pl.concat([gone, updated.select("from", "to")]))
    for table, (_, new, updated) in node_diff.items():
        graph.update_lexical_nodes(table, updated)
        graph.add_lexical_rows(table, new)
    for table in DOC_NODES:
        graph.add_lexical_rows(table, d_nodes[table])
    for rel, (_, new, updated) in edge_diff.items():
        graph.add_lexical_rows(rel, pl.concat([new, updated]))
    for rel, frame in d_anchored.items():
        graph.add_lexical_rows(rel, frame.drop("doc_id"))


def _written(before: pl.DataFrame, rewrite: list[str], counts: pl.DataFrame, node_diff: dict,
             edge_diff: dict) -> dict[str, dict[str, int]]:
    """Rows added, removed and updated per table: a rewritten document's share counts as removed and added."""
    had = before.filter(within("doc_id", rewrite))
    written = {t: {"added": int(counts[t].sum()), "removed": int(had[t].sum())} for t in (*DOC_NODES, *DOC_RELS)}
    for table, (gone, new, updated) in {**node_diff, **edge_diff}.items():
        written[table] = {"added": new.height, "removed": gone.height, "updated": updated.height}
    return written
