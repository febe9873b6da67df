"""KET-RAG corpus assets: per-document keywords, then corpus-wide KNN graph → PageRank → β-skeleton
and the keyword index. The corpus assets update incrementally from their saved state.

The corpus steps themselves, each with its crash-safety commit, are engine functions
(lexgraph.indexing.corpus_update); these assets call them and show what they did. An empty catalog
(every document purged) clears the corpus state instead of failing.
"""
import dagster as dg

from assets.catalog import CORPUS, PER_DOCUMENT, spec_kwargs
from assets.corpus_result import corpus_result, run_step
from assets.documents import (batch_metadata, data_version, describe_partitions, document_chunks, document_graph,
                              stored_hashes, with_output)
from assets.partitions import GRAPH_WRITER_POOL, batched, documents, step_partition_keys
from lexgraph.indexing import corpus_update, pipeline
from lexgraph.extract.keywords import chunk_keyword_pairs_query
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
    outcome = corpus_update.update_knn_graph(index.corpus_files(), index.extract_store(), lancedb.get(), kuzu.writer,
                                             index.settings())
    return corpus_result(context, outcome, "every_chunk_has_a_neighbour")


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
    outcome = run_step(corpus_update.rank_chunks, index.corpus_files(), index.settings())
    return corpus_result(context, outcome, "pagerank_sums_to_one")


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
    outcome = run_step(corpus_update.select_skeleton, index.corpus_files(), lancedb.get(), kuzu.writer,
                        index.settings())
    return corpus_result(context, outcome, "selection_has_beta_n_chunks")


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
    outcome = corpus_update.update_keyword_index(index.corpus_files(), index.extract_store(), lancedb.get(),
                                                 kuzu.writer, embedder.get().dimension, index.settings())
    return corpus_result(context, outcome, "no_dangling_keyword_links")


corpus_assets = [chunk_knn_graph, chunk_pagerank, skeleton_selection, keyword_index]
