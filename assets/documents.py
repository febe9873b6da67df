"""Per-document ingestion assets: source → chunks → chunk vectors → graph load.

Each asset processes every partition key of its run in one step (runs are batched over
partition ranges) by calling the lexgraph stage functions. A document that fails is named in the
log and metadata and leaves its previously indexed data untouched; the others go on.
"""

import dagster as dg
import polars as pl

from lexgraph.build import pipeline
from orchestration.partitions import GRAPH_WRITER_POOL, batched, documents
from resources import EmbedderResource, IndexResource, InboxResource, KuzuResource, LanceDBResource

GROUP = "ingestion"


def _report_failures(context: dg.AssetExecutionContext, stage: str, result: pipeline.StageResult) -> None:
    """A one-document run fails visibly; in a batch the failure is logged and the rest proceed."""
    for message in result.failed.values():
        context.log.error(f"{stage}: {message}")
    if result.failed and not result.done:
        raise dg.Failure(description="; ".join(result.failed.values()),
                         metadata={"failed_documents": dg.MetadataValue.json(result.failed)})


def _with_output(context: dg.AssetExecutionContext, store, stage: str) -> list[str]:
    """Partition keys whose upstream stage has output; missing ones were reported upstream."""
    ready = [key for key in context.partition_keys if store.exists(stage, key)]
    for key in set(context.partition_keys) - set(ready):
        context.log.warning(f"{key}: skipped, no {stage} output (see the upstream failure)")
    return ready


def _metadata(result: pipeline.StageResult, **extra) -> dict:
    return {"documents": len(result.done), "rows": result.rows,
            "failed_documents": dg.MetadataValue.json(result.failed), **extra}


@dg.asset(
    partitions_def=documents, backfill_policy=batched, group_name=GROUP, kinds={"python", "parquet"},
    description="A document from the inbox read, validated (UTF-8 text, not empty, not binary), "
    "normalised (NFC, Unix newlines; HTML to text) and content-hashed.",
)
def source_document(context: dg.AssetExecutionContext, index: IndexResource, inbox: InboxResource) -> dg.MaterializeResult:
    files = inbox.files()
    paths = {key: files.get(key) for key in context.partition_keys}
    settings = index.settings()
    result = pipeline.load_sources(paths, inbox.root(), index.extract_store(), settings.index_version)
    _report_failures(context, "source_document", result)
    return dg.MaterializeResult(metadata=_metadata(result, index_version=settings.index_version))


def _chunk_checks(frame: pl.DataFrame, limit: int) -> list[dg.AssetCheckResult]:
    empty = frame.filter(pl.col("text").str.strip_chars() == "").height if frame.height else 0
    over = frame.filter(pl.col("token_count") > limit).height if frame.height else 0
    return [
        dg.AssetCheckResult(check_name="no_empty_chunks", passed=empty == 0, metadata={"empty_chunks": empty}),
        dg.AssetCheckResult(check_name="chunks_within_embedder_limit", passed=over == 0,
                            metadata={"over_limit": over, "limit_tokens": limit}),
    ]


def _preview(frame: pl.DataFrame, rows: int = 3) -> str:
    lines = ["| chunk | heading | chars | tokens | text |", "|---|---|---|---|---|"]
    for row in frame.head(rows).iter_rows(named=True):
        text = row["text"][:160].replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {row['order']} | {row['heading_path'] or '—'} | {row['char_start']}–{row['char_end']} "
                     f"| {row['token_count']} | {text} |")
    return "\n".join(lines)


@dg.asset(
    partitions_def=documents, backfill_policy=batched, group_name=GROUP, kinds={"python", "parquet"},
    deps=[source_document],
    description="Heading-aware chunks sized for the embedder (never truncated), with character offsets "
    "into the source, heading path and order.",
    check_specs=[dg.AssetCheckSpec("no_empty_chunks", asset="document_chunks"),
                 dg.AssetCheckSpec("chunks_within_embedder_limit", asset="document_chunks")],
)
def document_chunks(context: dg.AssetExecutionContext, index: IndexResource, embedder: EmbedderResource) -> dg.MaterializeResult:
    store = index.extract_store()
    model = embedder.get()
    result = pipeline.chunk_documents(_with_output(context, store, pipeline.SOURCES), store, model,
                                      index.settings().chunk_tokens)
    _report_failures(context, "document_chunks", result)
    frame = pl.concat([store.read(pipeline.CHUNKS, d) for d in result.done]) if result.done else \
        pl.DataFrame(schema=pipeline.CHUNK_COLUMNS)
    tokens = frame["token_count"]
    return dg.MaterializeResult(
        metadata=_metadata(
            result,
            tokens_total=int(tokens.sum() or 0),
            tokens_mean=float(tokens.mean() or 0.0),
            tokens_max=int(tokens.max() or 0),
            preview=dg.MetadataValue.md(_preview(frame)),
        ),
        check_results=_chunk_checks(frame, model.max_tokens),
    )


@dg.asset(
    partitions_def=documents, backfill_policy=batched, group_name=GROUP, kinds={"lancedb"},
    deps=[document_chunks],
    description="Chunk embeddings (all-MiniLM-L6-v2 by default), batched across the run's documents "
    "and written to the LanceDB chunks table, replacing the document's previous rows.",
    check_specs=[dg.AssetCheckSpec("vectors_have_model_dimension", asset="chunk_vectors")],
)
def chunk_vectors(context: dg.AssetExecutionContext, index: IndexResource, embedder: EmbedderResource,
                  lancedb: LanceDBResource) -> dg.MaterializeResult:
    store, vectors, model = index.extract_store(), lancedb.get(), embedder.get()
    ready = _with_output(context, store, pipeline.CHUNKS)
    result = pipeline.embed_documents(ready, store, model, vectors)
    stored = vectors.vector_dimension()
    check = dg.AssetCheckResult(check_name="vectors_have_model_dimension", passed=stored in (None, model.dimension),
                                metadata={"model_dimension": model.dimension, "stored_dimension": stored or 0})
    return dg.MaterializeResult(
        metadata=_metadata(result, embedding_tokens=result.tokens, model=model.model_name,
                           lance_table=dg.MetadataValue.path(vectors.table_uri("chunks"))),
        check_results=[check],
    )


@dg.asset(
    partitions_def=documents, backfill_policy=batched, group_name=GROUP, kinds={"kuzu"},
    deps=[chunk_vectors], pool=GRAPH_WRITER_POOL,
    description="Source and Chunk nodes with chunk→source (PART_OF) and chunk→next (NEXT) edges in the "
    "embedded Kùzu graph; the document is then marked indexed in the catalog.",
    check_specs=[dg.AssetCheckSpec("every_chunk_has_a_source", asset="document_graph")],
)
def document_graph(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                   kuzu: KuzuResource) -> dg.MaterializeResult:
    store = index.extract_store()
    ready = _with_output(context, store, pipeline.VECTORS)
    with kuzu.writer() as graph:
        result = pipeline.load_graph(ready, store, graph, lancedb.get())
        orphans = graph.query(
            "MATCH (c:Chunk) WHERE c.doc_id IN $ids AND NOT EXISTS { MATCH (c)-[:PART_OF]->(:Source) } "
            "RETURN count(c) AS n", {"ids": ready}
        )["n"][0] if ready else 0
    return dg.MaterializeResult(
        metadata=_metadata(result, graph_path=dg.MetadataValue.path(kuzu.graph_path())),
        check_results=[dg.AssetCheckResult(check_name="every_chunk_has_a_source", passed=int(orphans) == 0,
                                           metadata={"chunks_without_source": int(orphans)})],
    )


document_assets = [source_document, document_chunks, chunk_vectors, document_graph]
