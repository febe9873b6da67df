"""The corpus steps as engine functions, each with its crash-safety commit.

Each function brings one corpus step up to the catalog and, as its last action, records the catalog digest
and settings it was built from (:meth:`CorpusFiles.record_built`): a crash before that leaves the step out of
step, so the next `lexgraph ingest` or corpus sensor tick runs it again. The Dagster assets (assets/skeleton.py,
assets/lexical.py, assets/search_indexes.py) call these and only turn the :class:`StepOutcome` into
metadata and check results; benchmarks call them without Dagster.

`open_writer` opens the graph's single writer (a context manager yielding a GraphStore); a step holds it
only while it writes the graph.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from lexgraph.atomic_json import write_json
from lexgraph.indexing import corpus_keywords, corpus_prefetch, corpus_skeleton, knn_state, knn_update, lexical
from lexgraph.indexing.corpus_state import LEXICAL_GRAPH, SEARCH_INDEXES, CorpusFiles, catalog_digest
from lexgraph.indexing.skeleton import skeleton_size
from lexgraph.storage import lance_indexes

OpenWriter = Callable[[], AbstractContextManager]


class StepNotBuilt(RuntimeError):
    """A corpus step run before the step it reads was built."""


@dataclass
class StepOutcome:
    """What one corpus step did: the catalog digest it was built from, its figures (numbers and short
    strings), details (JSON-able), Markdown tables and paths for the UI, and its check's measurements."""

    digest: str
    figures: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    check: dict = field(default_factory=dict)
    passed: bool = True
    version_key: str = ""  # what, beside the digest, the step's data version depends on
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def built_from(files: CorpusFiles, step: str) -> str:
    """The catalog digest `step` was last built from; StepNotBuilt when it never was."""
    digest = files.built_digests().get(step)
    if digest is None:
        raise StepNotBuilt(f"{step} has not been built yet; run the build_corpus_index job")
    return digest


def update_knn_graph(files: CorpusFiles, store, vectors, open_writer: OpenWriter, settings) -> StepOutcome:
    """chunk_knn_graph: the catalog's chunks into the saved KNN graphs of both kinds, and the graph's SIMILAR
    edges brought to them. Check: every chunk has a neighbour."""
    indexed = vectors.indexed_hashes()  # the catalog this build is made from
    digest = catalog_digest(indexed)
    # what `lexgraph ingest` read ahead while the documents ran, where it still holds; the rest read now
    inputs = corpus_prefetch.knn_inputs(files, vectors, indexed)
    mode = knn_update.knn_mode(settings.knn_mode, inputs.chunks.height)
    # words are read only for chunks the saved state does not hold; saved while the graph is written
    result = knn_update.update_knn(files, inputs.chunks, inputs.vectors,
                                   lambda wanted: knn_update.chunk_words(store, wanted),
                                   k=settings.knn_k, mode=mode, loaded=inputs.loaded, save=False)
    with open_writer() as graph:
        written = knn_update.write_similarity_edges(files, graph, result)
    files.record_built("chunk_knn_graph", digest, settings)
    return StepOutcome(
        digest,
        figures={"catalog_documents": len(indexed), "catalog_digest": digest, "chunks": inputs.chunks.height,
                 "edges": result.edge_rows.height, "k": settings.knn_k, "mode": mode, "rebuilt": result.rebuilt,
                 "rebuild_reason": result.rebuild_reason, "ann_index": result.ann_index,
                 "words_read_chunks": result.words_read, "read_ahead": inputs.read_ahead, **written},
        details={"edges_by_kind": result.edge_rows.counts_by_kind(),
                 "semantic_update": result.semantic.to_dict() if result.semantic else None,
                 "lexical_update": result.lexical.to_dict() if result.lexical else None},
        check={"isolated_chunks": result.isolated}, passed=result.isolated == 0)


def pagerank_histogram(values: np.ndarray, bins: int = 12) -> str:
    """PageRank distribution as a Markdown bar chart (log-spaced bins: the scores are skewed)."""
    low, high = max(values.min(), 1e-12), max(values.max(), 1e-12)
    edges = np.geomspace(low, high * (1 + 1e-9), bins + 1) if high > low else np.array([low, low * 1.01])
    counts, _ = np.histogram(values, bins=edges)
    peak = max(counts.max(), 1)
    lines = ["| PageRank from | to | chunks | |", "|---|---|---|---|"]
    for start, end, count in zip(edges[:-1], edges[1:], counts):
        lines.append(f"| {start:.2e} | {end:.2e} | {count} | {'█' * int(round(30 * count / peak))} |")
    return "\n".join(lines)


def rank_chunks(files: CorpusFiles, settings) -> StepOutcome:
    """chunk_pagerank: weighted PageRank over the saved KNN edges. Check: the stored scores are a
    probability distribution over the graph's chunks."""
    digest = built_from(files, "chunk_knn_graph")
    edges = knn_state.read_edges(files)
    if edges is None:
        raise StepNotBuilt("the KNN graph's saved edges are missing or of another save than its chunks; "
                           "run chunk_knn_graph again")
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    ranks = corpus_skeleton.compute_pagerank(files, chunks, edges)
    stored = pl.read_parquet(files.pagerank)
    total = float(stored["pagerank"].sum())
    ok = stored.height == chunks.height and (stored.height == 0 or (abs(total - 1) < 1e-6
                                                                    and float(stored["pagerank"].min()) >= 0))
    values = ranks["pagerank"].to_numpy()
    outcome = StepOutcome(digest, figures={"chunks": ranks.height, "catalog_digest": digest},
                          check={"sum": total, "scored_chunks": stored.height, "graph_chunks": chunks.height},
                          passed=ok)
    if len(values):
        outcome.figures.update({"pagerank_max": float(values.max()), "pagerank_min": float(values.min()),
                                "pagerank_median": float(np.median(values))})
        outcome.tables["distribution"] = pagerank_histogram(values)
    files.record_built("chunk_pagerank", digest, settings)
    return outcome


def select_skeleton(files: CorpusFiles, vectors, open_writer: OpenWriter, settings) -> StepOutcome:
    """skeleton_selection: the top ⌊β·n⌋ chunks by PageRank, written onto the graph's and LanceDB's chunks,
    with the diff against the previous selection. Check: exactly ⌊β·n⌋ selected."""
    digest = built_from(files, "chunk_pagerank")
    ranks = pl.read_parquet(files.pagerank)
    beta = settings.beta
    result = corpus_skeleton.select(files, ranks, beta)
    if result.selection.height:
        with open_writer() as graph:
            graph.set_chunk_scores(result.selection)
    vectors.set_chunk_scores(result.selection)  # an empty catalog empties the table too
    stored = pl.read_parquet(files.skeleton)
    selected, expected = int(stored["selected"].sum()), skeleton_size(ranks.height, beta)
    diff = result.diff.to_dict()
    coverage = "\n".join(["| document | chunks | selected | share |", "|---|---|---|---|"] + [
        f"| {r['doc_id']} | {r['chunks']} | {r['selected']} | {r['share']:.0%} |"
        for r in result.coverage.sort("share").head(40).iter_rows(named=True)])
    files.record_built("skeleton_selection", digest, settings)
    return StepOutcome(
        digest,
        figures={"beta": beta, "chunks": ranks.height, "selected": selected, "catalog_digest": digest,
                 "newly_selected": diff["newly_selected_count"], "deselected": diff["deselected_count"]},
        details={"documents_to_reextract": diff["documents"]}, tables={"coverage_lowest_40": coverage},
        paths={"diff_path": str(files.skeleton_diff)}, check={"selected": selected, "expected": expected},
        passed=selected == expected and stored.height == ranks.height)


def update_keyword_index(files: CorpusFiles, store, vectors, open_writer: OpenWriter, dimension: int,
                         settings) -> StepOutcome:
    """keyword_index: the keyword↔chunk graph and keyword vectors, from each document's sums. Check: no
    Keyword node is left without a chunk."""
    indexed = vectors.indexed_hashes()  # the catalog this build is made from
    digest = catalog_digest(indexed)
    result = corpus_keywords.update_keyword_index(files, store, sorted(indexed), dimension)
    with open_writer() as graph:
        written = corpus_keywords.write_keyword_index(files, store, graph, vectors, result)
        dangling = graph.keywords_without_chunks()
    files.record_built("keyword_index", digest, settings)
    return StepOutcome(
        digest,
        figures={"keywords": result.keyword_count, "keyword_chunk_links": sum(result.link_counts.values()),
                 **written, "catalog_documents": len(indexed), "catalog_digest": digest,
                 "documents_added": len(result.added), "documents_removed": len(result.removed),
                 "documents_updated": len(result.updated)},
        paths={"lance_table": vectors.table_uri("keywords")},
        check={"keywords_without_chunks": dangling}, passed=dangling == 0)


def update_search_indexes(files: CorpusFiles, store, vectors, settings) -> StepOutcome:
    """search_indexes: LanceDB's own indexes over the chunk table, from LEXGRAPH_LANCE_THRESHOLD chunks on
    (lexgraph.storage.lance_indexes); below it, only the record that none is needed."""
    indexed = vectors.indexed_hashes()  # the catalog this update is made from
    digest = catalog_digest(indexed)
    chunks = vectors.count("chunks")
    figures = {"chunks": chunks, "threshold": settings.lance_threshold, "query_backend": settings.query_backend,
               "catalog_digest": digest}
    if chunks == 0 or not settings.uses_lance(chunks):
        files.record_built(SEARCH_INDEXES, digest, settings)
        return StepOutcome(digest, figures={**figures, "decision": "below threshold: none"})
    links = lance_indexes.DocumentLinks(indexed, lambda docs: corpus_keywords.keyword_chunk_links(store, docs))
    report = lance_indexes.refresh(vectors, files.root, links)
    files.record_built(SEARCH_INDEXES, digest, settings)
    return StepOutcome(
        digest, figures={**figures, "decision": report["decision"], "seconds": report["seconds"],
                         "unindexed_rows": report["unindexed_rows"]},
        details={"build_seconds": report["build_seconds"], "keyword_links": report["keyword_links"]},
        paths={"state": str(lance_indexes.state_path(files.root))})


def update_lexical_graph(files: CorpusFiles, store, vectors, open_writer: OpenWriter, embedder, ledger,
                         run_id: str, settings) -> tuple[StepOutcome, lexical.LexicalGraphResult]:
    """lexical_graph: every indexed document's lexical tables into the graph and LanceDB (no LLM call).
    Check: every Statement, Fact and Entity is anchored to a chunk or statement."""
    indexed = vectors.indexed_hashes()  # the catalog this build is made from
    digest = catalog_digest(indexed)
    inputs = files.lexical_inputs_digest(indexed)  # before reading: a write during the build is not missed
    with open_writer() as graph:
        result = lexical.build_lexical_graph(sorted(indexed), store, graph, vectors, embedder, ledger, run_id,
                                             merges_path=files.entity_merges, state_dir=files.lexical_state)
        unanchored = graph.unanchored_lexical_nodes()
    warnings, errors = [], []
    if result.missing:
        warnings.append(f"{len(result.missing)} indexed document(s) have no lexical tables yet (not extracted): "
                        + ", ".join(result.missing[:10]))
    if result.damaged:  # those documents keep what they had (or stay out); every run names the files
        errors.append("damaged lexical tables, not read: " + "; ".join(result.damaged.values()))
    # what graph_tables needs to follow by difference: the documents this build rewrote, from which inputs to which
    write_json(files.lexical_changes, {"from": files.recorded_lexical_inputs(), "to": inputs, "mode": result.mode,
                                       "documents": sorted({d for docs in result.changes.values() for d in docs}),
                                       "entities": result.entity_changes})
    files.record_lexical_inputs(inputs)
    files.record_built(LEXICAL_GRAPH, digest, settings)
    outcome = StepOutcome(
        digest,
        figures={"catalog_documents": len(indexed), "catalog_digest": digest, "documents": len(result.documents),
                 **{t.lower(): n for t, n in result.counts.items() if t in ("Statement", "Topic", "Fact", "Entity")},
                 **result.figures(), "entity_merges": result.merges,
                 "merged_surface_form_mentions": result.merged_surface_forms,
                 "batch_embedding_tokens": result.embedding_tokens},
        details={"documents_without_extractions": result.missing, "written": result.written,
                 "document_changes": result.changes, "damaged_lexical_tables": result.damaged,
                 "newly_embedded": result.embedded},
        paths={"merges_path": str(files.entity_merges)},
        check=unanchored, passed=not any(unanchored.values()), version_key=f"{digest}|{result.digest}",
        warnings=warnings, errors=errors)
    return outcome, result
