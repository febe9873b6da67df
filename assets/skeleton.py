"""KET-RAG corpus assets: per-document keywords, then corpus-wide KNN graph → PageRank → β-skeleton
and the keyword index. The corpus assets update incrementally from their saved state."""
import dagster as dg
import numpy as np
import polars as pl

from assets.documents import GROUP as INGESTION, document_chunks, document_graph
from lexgraph.build import corpus_index as ci
from lexgraph.build import pipeline
from lexgraph.extract.keywords import keyword_vectors
from orchestration.partitions import GRAPH_WRITER_POOL, batched, documents
from resources import EmbedderResource, IndexResource, KuzuResource, LanceDBResource

GROUP = "skeleton"


@dg.asset(
    partitions_def=documents, backfill_policy=batched, group_name=INGESTION, kinds={"python", "parquet"},
    deps=[document_chunks],
    description="LLM-free keywords of each chunk (content words and proper-noun phrases) with the sums of "
    "their sentences' embeddings, the document's share of KET-RAG's keyword vectors.",
)
def document_keywords(context: dg.AssetExecutionContext, index: IndexResource,
                      embedder: EmbedderResource) -> dg.MaterializeResult:
    store = index.extract_store()
    ready = [k for k in context.partition_keys if store.exists(pipeline.CHUNKS, k)]
    result = pipeline.extract_document_keywords(ready, store, embedder.get())
    return dg.MaterializeResult(metadata={"documents": len(result.done), "keyword_occurrences": result.rows,
                                          "embedding_tokens": result.tokens})


@dg.asset(
    group_name=GROUP, kinds={"python", "kuzu"}, deps=[document_graph, document_keywords], pool=GRAPH_WRITER_POOL,
    description="Chunk KNN graph of KET-RAG's two kinds: K nearest by embedding cosine and K nearest by shared "
    "distinct content words; undirected SIMILAR edges in Kùzu. Updated from the saved graph: new chunks "
    "are searched, removed ones dropped, and the lists they touch refreshed.",
    check_specs=[dg.AssetCheckSpec("every_chunk_has_a_neighbour", asset="chunk_knn_graph")],
)
def chunk_knn_graph(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                    kuzu: KuzuResource) -> dg.MaterializeResult:
    store, files = index.extract_store(), index.corpus_files()
    store_vectors = lancedb.get()
    chunks, vectors = store_vectors.chunk_vectors()
    if chunks.height == 0:
        raise dg.Failure("no chunks are indexed yet; ingest documents first")
    loaded = chunks["doc_id"].is_in(store_vectors.sources()["doc_id"].to_list())
    chunks, vectors = chunks.filter(loaded), vectors[loaded.to_numpy()]  # only documents whose graph load finished
    if chunks.height == 0:
        raise dg.Failure("no chunks are indexed yet; ingest documents first")
    words = ci.chunk_words(store, chunks["chunk_id"])
    settings = index.settings()
    mode = ci.knn_mode(settings.knn_mode, chunks.height)
    result = ci.update_knn(files, chunks, vectors, words, k=settings.knn_k, mode=mode)
    with kuzu.writer() as graph:
        graph.replace_similarity_edges(result.edges)
    linked = set(result.edges["src"].to_list()) | set(result.edges["dst"].to_list())
    isolated = chunks.height - len(linked & set(chunks["chunk_id"].to_list()))
    counts = result.edges.group_by("kind").len()
    return dg.MaterializeResult(
        metadata={
            "chunks": chunks.height, "edges": result.edges.height, "k": settings.knn_k, "mode": mode,
            "edges_by_kind": dg.MetadataValue.json(dict(zip(counts["kind"], counts["len"]))),
            "rebuilt": result.rebuilt,
            "semantic_update": dg.MetadataValue.json(result.semantic.to_dict() if result.semantic else None),
            "lexical_update": dg.MetadataValue.json(result.lexical.to_dict() if result.lexical else None),
        },
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
    group_name=GROUP, kinds={"python", "kuzu", "lancedb"}, deps=[chunk_knn_graph],
    description="Weighted PageRank over the chunk KNN graph (both kinds of edge).",
    check_specs=[dg.AssetCheckSpec("pagerank_sums_to_one", asset="chunk_pagerank")],
)
def chunk_pagerank(index: IndexResource, lancedb: LanceDBResource) -> dg.MaterializeResult:
    files = index.corpus_files()
    edges = pl.read_parquet(files.edges)
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    ranks = ci.compute_pagerank(files, chunks, edges)
    values = ranks["pagerank"].to_numpy()
    total = float(values.sum())
    return dg.MaterializeResult(
        metadata={"chunks": ranks.height, "pagerank_max": float(values.max()), "pagerank_min": float(values.min()),
                  "pagerank_median": float(np.median(values)), "distribution": dg.MetadataValue.md(_histogram(values))},
        check_results=[dg.AssetCheckResult(check_name="pagerank_sums_to_one", passed=abs(total - 1) < 1e-6,
                                           metadata={"sum": total})],
    )


@dg.asset(
    group_name=GROUP, kinds={"python", "kuzu", "lancedb"}, deps=[chunk_pagerank], pool=GRAPH_WRITER_POOL,
    description="The β-skeleton: the top ⌊β·n⌋ chunks by PageRank, the only ones later sent to LLM extraction. "
    "Publishes the diff against the previous selection (newly selected / deselected chunks and their "
    "documents) so re-extraction touches only what changed.",
    check_specs=[dg.AssetCheckSpec("selection_has_beta_n_chunks", asset="skeleton_selection")],
)
def skeleton_selection(index: IndexResource, lancedb: LanceDBResource, kuzu: KuzuResource) -> dg.MaterializeResult:
    files = index.corpus_files()
    ranks = pl.read_parquet(files.pagerank)
    beta = index.settings().beta
    result = ci.select(files, ranks, beta)
    with kuzu.writer() as graph:
        graph.set_chunk_scores(result.selection)
    lancedb.get().set_chunk_scores(result.selection)
    selected = int(result.selection["selected"].sum())
    diff = result.diff.to_dict()
    coverage = "\n".join(["| document | chunks | selected | share |", "|---|---|---|---|"] + [
        f"| {r['doc_id']} | {r['chunks']} | {r['selected']} | {r['share']:.0%} |"
        for r in result.coverage.sort("share").head(40).iter_rows(named=True)])
    return dg.MaterializeResult(
        metadata={"beta": beta, "chunks": ranks.height, "selected": selected,
                  "newly_selected": diff["newly_selected_count"], "deselected": diff["deselected_count"],
                  "documents_to_reextract": dg.MetadataValue.json(diff["documents"]),
                  "diff_path": dg.MetadataValue.path(str(files.skeleton_diff)),
                  "coverage_lowest_40": dg.MetadataValue.md(coverage)},
        check_results=[dg.AssetCheckResult(check_name="selection_has_beta_n_chunks", passed=selected == result.size,
                                           metadata={"selected": selected, "expected": result.size})],
    )


@dg.asset(
    group_name=GROUP, kinds={"python", "kuzu", "lancedb"}, deps=[document_keywords, document_graph],
    pool=GRAPH_WRITER_POOL,
    description="The LLM-free keyword↔chunk bipartite graph over all chunks: Keyword nodes and KEYWORD_IN edges "
    "in Kùzu, keyword vectors (mean embedding of the sentences a keyword occurs in) in LanceDB. Sums are "
    "updated per document: added documents add theirs, removed ones subtract.",
    check_specs=[dg.AssetCheckSpec("no_dangling_keyword_links", asset="keyword_index")],
)
def keyword_index(index: IndexResource, lancedb: LanceDBResource, kuzu: KuzuResource,
                  embedder: EmbedderResource) -> dg.MaterializeResult:
    store, files, vectors = index.extract_store(), index.corpus_files(), lancedb.get()
    doc_ids = vectors.sources()["doc_id"].to_list()
    result = ci.update_keyword_index(files, store, doc_ids, embedder.get().dimension)
    links = ci.keyword_chunk_links(store, doc_ids)
    with kuzu.writer() as graph:
        graph.replace_keywords(result.index["keyword"], links)
        dangling = graph.query("MATCH (k:Keyword) WHERE NOT EXISTS { MATCH (k)-[:KEYWORD_IN]->(:Chunk) } "
                               "RETURN count(k) AS n")["n"][0]
    vectors.replace_keywords(keyword_vectors(result.index))
    return dg.MaterializeResult(
        metadata={"keywords": result.index.height, "keyword_chunk_links": links.height,
                  "documents_added": len(result.added), "documents_removed": len(result.removed),
                  "documents_updated": len(result.updated),
                  "lance_table": dg.MetadataValue.path(vectors.table_uri("keywords"))},
        check_results=[dg.AssetCheckResult(check_name="no_dangling_keyword_links", passed=int(dangling) == 0,
                                           metadata={"keywords_without_chunks": int(dangling)})],
    )


corpus_assets = [chunk_knn_graph, chunk_pagerank, skeleton_selection, keyword_index]
