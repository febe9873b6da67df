"""KET-RAG corpus assets: per-document keywords, then corpus-wide KNN graph → PageRank → β-skeleton
and the keyword index. The corpus assets update incrementally from their saved state.

Each corpus asset records, as its last action, the catalog digest it was built from
(CorpusFiles.record_built), which the corpus sensor and `lexgraph ingest` compare with the current
catalog; an empty catalog (every document purged) clears the corpus state instead of failing.
"""
import dagster as dg
import numpy as np
import polars as pl

from assets.catalog import CORPUS, PER_DOCUMENT, spec_kwargs
from assets.documents import (batch_metadata, data_version, describe_partitions, document_chunks, document_graph,
                              stored_hashes, with_output)
from assets.partitions import GRAPH_WRITER_POOL, batched, documents, step_partition_keys
from lexgraph.indexing import corpus_keywords, corpus_skeleton, corpus_state, knn_state, knn_update
from lexgraph.indexing import corpus_prefetch, pipeline
from lexgraph.indexing.skeleton import skeleton_size
from lexgraph.extract.keywords import chunk_keyword_pairs_query
from lexgraph.ids import content_hash
from resources import EmbedderResource, IndexResource, KuzuResource, LanceDBResource

GROUP = CORPUS


def _keyword_problems(store, doc_ids: list[str]) -> dict[str, str]:
    """doc_id -> what is wrong with its stored keywords: missing files, no keyword rows although its
    chunks have words, occurrences pointing at other documents' chunks, or stats that disagree."""
    problems: dict[str, str] = {}
    for doc_id in doc_ids:
        missing = [s for s in (pipeline.KEYWORDS, pipeline.KEYWORD_STATS) if not store.exists(s, doc_id)]
        if missing:
            problems[doc_id] = f"no {' or '.join(missing)} output"
            continue
        chunks = store.read(pipeline.CHUNKS, doc_id)
        # distinct pairs, not every occurrence: a 50 MB document has millions of keyword rows
        pairs = store.read(pipeline.KEYWORDS, doc_id, query=chunk_keyword_pairs_query)
        stats = store.read(pipeline.KEYWORD_STATS, doc_id)
        has_words = chunks.height and chunks["text"].str.contains(r"[^\W\d_]{2,}").any()
        if has_words and pairs.height == 0:
            problems[doc_id] = "its chunks have words but it has no keyword rows"
        elif pairs.join(chunks.select("chunk_id"), on="chunk_id", how="anti").height:
            problems[doc_id] = "keyword rows point at chunks that are not the document's"
        elif set(pairs["keyword"].unique().to_list()) != set(stats["keyword"].to_list()):
            problems[doc_id] = "keyword stats do not match the keyword rows"
    return problems


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "parquet"},
    **spec_kwargs("document_keywords", PER_DOCUMENT), deps=[document_chunks],
    description="LLM-free keywords of each chunk (content words and proper-noun phrases) with the sums of "
    "their sentences' embeddings, the document's share of KET-RAG's keyword vectors; stored as Parquet.",
    check_specs=[dg.AssetCheckSpec(
        "keywords_stored_for_every_document", asset="document_keywords",
        description="Every document of this run has keyword rows (when its chunks have words) and keyword "
        "stats stored; the rows point only at the document's own chunks and agree with the stats.")],
)
def document_keywords(context: dg.AssetExecutionContext, index: IndexResource,
                      embedder: EmbedderResource) -> dg.MaterializeResult:
    store = index.extract_store()
    ready = with_output(context, store, pipeline.CHUNKS)
    result = pipeline.extract_document_keywords(ready, store, embedder.get(), ledger=index.ledger(),
                                                run_id=context.run.run_id)
    hashes = stored_hashes(store, step_partition_keys(context))
    describe_partitions(context, result, pipeline.CHUNKS, hashes=hashes)
    problems = _keyword_problems(store, ready)
    return dg.MaterializeResult(
        metadata=batch_metadata(context, result, batch_embedding_tokens=result.tokens),
        data_version=data_version(context, hashes, result),
        check_results=[dg.AssetCheckResult(check_name="keywords_stored_for_every_document", passed=not problems,
                                           metadata={"documents_checked": len(ready),
                                                     "problems": dg.MetadataValue.json(problems)})],
    )


def _corpus_version(context: dg.AssetExecutionContext, digest: str) -> dg.DataVersion:
    """A corpus asset's data version: its code version and the catalog it was built from, so rebuilding
    from the same catalog with the same code changes nothing downstream."""
    code = context.assets_def.code_versions_by_key.get(context.asset_key) or ""
    return dg.DataVersion(content_hash(f"{context.asset_key.to_user_string()}\n{code}\n{digest}"))


def _built_from(files: corpus_state.CorpusFiles, step: str) -> str:
    digest = files.built_digests().get(step)
    if digest is None:
        raise dg.Failure(f"{step} has not been built yet; run the build_corpus_index job")
    return digest


@dg.asset(
    kinds={"python", "lancedb", "parquet", "kuzu"}, **spec_kwargs("chunk_knn_graph", GROUP),
    deps=[document_graph, document_keywords], pool=GRAPH_WRITER_POOL,
    description="Chunk KNN graph of KET-RAG's two kinds: K nearest by embedding cosine and K nearest by shared "
    "distinct content words; undirected SIMILAR edges in Kùzu, state as Parquet. Reads the vectors and the "
    "catalog from LanceDB. Updated from the saved graph: new chunks are searched, removed ones dropped, "
    "and the lists they touch refreshed. An empty catalog leaves no edges.",
    check_specs=[dg.AssetCheckSpec(
        "every_chunk_has_a_neighbour", asset="chunk_knn_graph",
        description="Every indexed chunk has at least one SIMILAR edge, so PageRank reaches it.")],
)
def chunk_knn_graph(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                    kuzu: KuzuResource) -> dg.MaterializeResult:
    store, files = index.extract_store(), index.corpus_files()
    store_vectors = lancedb.get()
    indexed = store_vectors.indexed_hashes()  # the catalog this build is made from
    digest = corpus_state.catalog_digest(indexed)
    # what `lexgraph ingest` read ahead while the documents ran, where it still holds; the rest read now
    inputs = corpus_prefetch.knn_inputs(files, store_vectors, indexed)
    chunks, vectors = inputs.chunks, inputs.vectors
    settings = index.settings()
    mode = knn_update.knn_mode(settings.knn_mode, chunks.height)
    # words are read only for chunks the saved state does not hold; saved while the graph is written
    result = knn_update.update_knn(files, chunks, vectors, lambda wanted: knn_update.chunk_words(store, wanted),
                           k=settings.knn_k, mode=mode, loaded=inputs.loaded, save=False)
    with kuzu.writer() as graph:
        written = knn_update.write_similarity_edges(files, graph, result)
    isolated = result.isolated
    files.record_built("chunk_knn_graph", digest, index.settings())
    return dg.MaterializeResult(
        metadata={
            "catalog_documents": len(indexed), "catalog_digest": digest,
            "chunks": chunks.height, "edges": result.edge_rows.height, "k": settings.knn_k, "mode": mode,
            "edges_by_kind": dg.MetadataValue.json(result.edge_rows.counts_by_kind()),
            "rebuilt": result.rebuilt, "rebuild_reason": result.rebuild_reason, "ann_index": result.ann_index,
            "words_read_chunks": result.words_read, "read_ahead": inputs.read_ahead,
            **written,
            "semantic_update": dg.MetadataValue.json(result.semantic.to_dict() if result.semantic else None),
            "lexical_update": dg.MetadataValue.json(result.lexical.to_dict() if result.lexical else None),
        },
        data_version=_corpus_version(context, digest),
        check_results=[dg.AssetCheckResult(check_name="every_chunk_has_a_neighbour", passed=isolated == 0,
                                           metadata={"isolated_chunks": isolated})],
    )


def _histogram(values: np.ndarray, bins: int = 12) -> str:
    """PageRank distribution as a Markdown bar chart (log-spaced bins: the scores are skewed)."""
    low, high = max(values.min(), 1e-12), max(values.max(), 1e-12)
    edges = np.geomspace(low, high * (1 + 1e-9), bins + 1) if high > low else np.array([low, low * 1.01])
    counts, _ = np.histogram(values, bins=edges)
    peak = max(counts.max(), 1)
    lines = ["| PageRank from | to | chunks | |", "|---|---|---|---|"]
    for start, end, count in zip(edges[:-1], edges[1:], counts):
        lines.append(f"| {start:.2e} | {end:.2e} | {count} | {'█' * int(round(30 * count / peak))} |")
    return "\n".join(lines)


@dg.asset(
    kinds={"python", "parquet"}, **spec_kwargs("chunk_pagerank", GROUP), deps=[chunk_knn_graph],
    description="Weighted PageRank over the chunk KNN graph (both kinds of edge), read from and written to "
    "the corpus Parquet state; the stores receive the scores with the skeleton selection.",
    check_specs=[dg.AssetCheckSpec(
        "pagerank_sums_to_one", asset="chunk_pagerank",
        description="The stored PageRank scores are a probability distribution over the KNN graph's chunks: "
        "one score per chunk, none negative, summing to 1 (an empty corpus has none).")],
)
def chunk_pagerank(context: dg.AssetExecutionContext, index: IndexResource) -> dg.MaterializeResult:
    files = index.corpus_files()
    digest = _built_from(files, "chunk_knn_graph")
    edges = knn_state.read_edges(files)
    if edges is None:
        raise dg.Failure("the KNN graph's saved edges are missing or of another save than its chunks; "
                         "run chunk_knn_graph again")
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    ranks = corpus_skeleton.compute_pagerank(files, chunks, edges)
    stored = pl.read_parquet(files.pagerank)
    total = float(stored["pagerank"].sum())
    ok = stored.height == chunks.height and (stored.height == 0 or (abs(total - 1) < 1e-6
                                                                    and float(stored["pagerank"].min()) >= 0))
    values = ranks["pagerank"].to_numpy()
    metadata = {"chunks": ranks.height, "catalog_digest": digest}
    if len(values):
        metadata.update({"pagerank_max": float(values.max()), "pagerank_min": float(values.min()),
                         "pagerank_median": float(np.median(values)),
                         "distribution": dg.MetadataValue.md(_histogram(values))})
    files.record_built("chunk_pagerank", digest, index.settings())
    return dg.MaterializeResult(
        metadata=metadata, data_version=_corpus_version(context, digest),
        check_results=[dg.AssetCheckResult(check_name="pagerank_sums_to_one", passed=ok,
                                           metadata={"sum": total, "scored_chunks": stored.height,
                                                     "graph_chunks": chunks.height})],
    )


@dg.asset(
    kinds={"python", "parquet", "kuzu", "lancedb"}, **spec_kwargs("skeleton_selection", GROUP), deps=[chunk_pagerank],
    pool=GRAPH_WRITER_POOL,
    description="The β-skeleton: the top ⌊β·n⌋ chunks by PageRank, the only ones later sent to LLM extraction. "
    "Kept as Parquet; PageRank and membership are written onto the Kùzu Chunk nodes and LanceDB chunk rows. "
    "Publishes the diff against the previous selection (newly selected / deselected chunks and their "
    "documents) so re-extraction touches only what changed.",
    check_specs=[dg.AssetCheckSpec(
        "selection_has_beta_n_chunks", asset="skeleton_selection",
        description="The stored selection has exactly ⌊β·n⌋ selected chunks out of the n ranked ones.")],
)
def skeleton_selection(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                       kuzu: KuzuResource) -> dg.MaterializeResult:
    files = index.corpus_files()
    digest = _built_from(files, "chunk_pagerank")
    ranks = pl.read_parquet(files.pagerank)
    beta = index.settings().beta
    result = corpus_skeleton.select(files, ranks, beta)
    if result.selection.height:
        with kuzu.writer() as graph:
            graph.set_chunk_scores(result.selection)
    lancedb.get().set_chunk_scores(result.selection)  # an empty catalog empties the table too
    stored = pl.read_parquet(files.skeleton)
    selected, expected = int(stored["selected"].sum()), skeleton_size(ranks.height, beta)
    diff = result.diff.to_dict()
    coverage = "\n".join(["| document | chunks | selected | share |", "|---|---|---|---|"] + [
        f"| {r['doc_id']} | {r['chunks']} | {r['selected']} | {r['share']:.0%} |"
        for r in result.coverage.sort("share").head(40).iter_rows(named=True)])
    files.record_built("skeleton_selection", digest, index.settings())
    return dg.MaterializeResult(
        metadata={"beta": beta, "chunks": ranks.height, "selected": selected, "catalog_digest": digest,
                  "newly_selected": diff["newly_selected_count"], "deselected": diff["deselected_count"],
                  "documents_to_reextract": dg.MetadataValue.json(diff["documents"]),
                  "diff_path": dg.MetadataValue.path(str(files.skeleton_diff)),
                  "coverage_lowest_40": dg.MetadataValue.md(coverage)},
        data_version=_corpus_version(context, digest),
        check_results=[dg.AssetCheckResult(check_name="selection_has_beta_n_chunks",
                                           passed=selected == expected and stored.height == ranks.height,
                                           metadata={"selected": selected, "expected": expected})],
    )


@dg.asset(
    kinds={"python", "parquet", "kuzu", "lancedb"}, **spec_kwargs("keyword_index", GROUP),
    deps=[document_keywords, document_graph], pool=GRAPH_WRITER_POOL,
    description="The LLM-free keyword↔chunk bipartite graph over all chunks: Keyword nodes and KEYWORD_IN edges "
    "in Kùzu, keyword vectors (mean embedding of the sentences a keyword occurs in) in LanceDB, sums kept as "
    "Parquet. Sums are updated per document: added documents add theirs, removed ones subtract. An empty "
    "catalog leaves no keywords.",
    check_specs=[dg.AssetCheckSpec(
        "no_dangling_keyword_links", asset="keyword_index",
        description="Every Keyword node links to at least one Chunk (KEYWORD_IN); none is left from a "
        "removed document.")],
)
def keyword_index(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                  kuzu: KuzuResource, embedder: EmbedderResource) -> dg.MaterializeResult:
    store, files, vectors = index.extract_store(), index.corpus_files(), lancedb.get()
    indexed = vectors.indexed_hashes()  # the catalog this build is made from
    digest = corpus_state.catalog_digest(indexed)
    doc_ids = sorted(indexed)
    result = corpus_keywords.update_keyword_index(files, store, doc_ids, embedder.get().dimension)
    with kuzu.writer() as graph:
        written = corpus_keywords.write_keyword_index(files, store, graph, vectors, result)
        dangling = graph.query("MATCH (k:Keyword) WHERE NOT EXISTS { MATCH (k)-[:KEYWORD_IN]->(:Chunk) } "
                               "RETURN count(k) AS n")["n"][0]
    files.record_built("keyword_index", digest, index.settings())
    return dg.MaterializeResult(
        metadata={"keywords": result.keyword_count, "keyword_chunk_links": sum(result.link_counts.values()),
                  **written,
                  "catalog_documents": len(indexed), "catalog_digest": digest,
                  "documents_added": len(result.added), "documents_removed": len(result.removed),
                  "documents_updated": len(result.updated),
                  "lance_table": dg.MetadataValue.path(vectors.table_uri("keywords"))},
        data_version=_corpus_version(context, digest),
        check_results=[dg.AssetCheckResult(check_name="no_dangling_keyword_links", passed=int(dangling) == 0,
                                           metadata={"keywords_without_chunks": int(dangling)})],
    )


corpus_assets = [chunk_knn_graph, chunk_pagerank, skeleton_selection, keyword_index]
