"""Per-document ingestion assets: inbox (observed) → source → chunks → chunk vectors → graph load.

Each asset processes every partition key of its run in one step (runs are batched over
partition ranges) by calling the lexgraph stage functions. A document that fails is named in the
log and metadata and leaves its previously indexed data untouched; the others go on.

What the UI shows per partition: a batched run produces one materialization event per partition,
and each carries its own document's figures (rows, tokens, source path, sha256, a preview of its
own chunks) through `add_asset_metadata(..., partition_key=...)`; figures of the run as a whole
are labelled `batch_*`. Data versions come from content hashes (the inbox's data version of a
partition is its file's sha256), so a byte-identical re-run changes no data version.
"""

import re
from datetime import datetime

import dagster as dg
import polars as pl
# Converts the observable source asset into an AssetsDefinition, the only form that takes owners.
from dagster._core.definitions.external_asset import create_external_asset_from_source_asset

from assets.catalog import PER_DOCUMENT, owners, spec_kwargs
from assets.partitions import GRAPH_WRITER_POOL, batched, documents, step_partition_keys
from lexgraph.indexing import pipeline
from lexgraph.ids import content_hash, file_hash
from resources import EmbedderResource, IndexResource, InboxResource, KuzuResource, LanceDBResource

GROUP = PER_DOCUMENT
OWNERS = owners(PER_DOCUMENT)
SHA256 = re.compile(r"[0-9a-f]{64}")
PREVIEW_CHUNKS = 3


# --- the inbox, observed ------------------------------------------------------------------------


def _observed_keys(context: dg.OpExecutionContext) -> list[str]:
    if context.has_partition_key or context.has_partition_key_range:
        return list(step_partition_keys(context))
    return context.instance.get_dynamic_partitions(documents.name)  # "Observe" from the UI: every document


@dg.observable_source_asset(
    name="inbox", partitions_def=documents, group_name=GROUP,
    description="The files in the inbox folder, one partition per file. Its data version is the file's sha256, "
    "so the UI shows which documents changed since they were ingested (their source_document is then "
    "unsynced) and a byte-identical file changes nothing. Observed at the start of every ingestion run.",
)
def _inbox_source(context: dg.OpExecutionContext, inbox: InboxResource) -> dg.DataVersionsByPartition:
    files = inbox.files()
    versions = {key: dg.DataVersion(file_hash(files[key])) for key in _observed_keys(context)
                if key in files and files[key].exists()}
    return dg.DataVersionsByPartition(versions)


# Observed in the same batched runs as the documents, so it shares their backfill policy.
inbox = create_external_asset_from_source_asset(_inbox_source).map_asset_specs(
    lambda spec: spec.replace_attributes(owners=OWNERS, kinds={"filesystem"})).with_attributes(backfill_policy=batched)


# --- shared helpers -----------------------------------------------------------------------------

def _report_failures(context: dg.AssetExecutionContext, stage: str, result: pipeline.StageResult) -> None:
    """A one-document run fails visibly; in a batch the failure is logged and the rest proceed."""
    for message in result.failed.values():
        context.log.error(f"{stage}: {message}")
    if result.failed and not result.done:
        raise dg.Failure(description="; ".join(result.failed.values()),
                         metadata={"failed_documents": dg.MetadataValue.json(result.failed)})


def with_output(context: dg.AssetExecutionContext, store, stage: str) -> list[str]:
    """Partition keys whose upstream stage has output; missing ones were reported upstream."""
    ready = [key for key in step_partition_keys(context) if store.exists(stage, key)]
    for key in set(step_partition_keys(context)) - set(ready):
        context.log.warning(f"{key}: skipped, no {stage} output (see the upstream failure)")
    return ready


def stored_hashes(store, keys) -> dict[str, str | None]:
    """doc_id -> content hash of the stored source (what the index holds for it), None when there is none."""
    hashes: dict[str, str | None] = {}
    for key in keys:
        path = store.path(pipeline.SOURCES, key)
        try:
            hashes[key] = pl.read_parquet(path, columns=["content_hash"])["content_hash"][0] if path.exists() else None
        except Exception:  # a damaged file: no hash, and the data version says so
            hashes[key] = None
    return hashes


def _status(key: str, result: pipeline.StageResult) -> str:
    return "done" if key in result.figures or key in result.done else "failed" if key in result.failed else "skipped"


def data_version(context: dg.AssetExecutionContext, hashes: dict[str, str | None],
                 result: pipeline.StageResult) -> dg.DataVersion:
    """One data version per run (Dagster gives every partition of a batched materialization the same one),
    made of the asset's code version and each document's content hash and outcome. So re-running the same
    documents at the same content gives the same version, and a changed document gives a new one."""
    code = context.assets_def.code_versions_by_key.get(context.asset_key) or ""
    lines = [context.asset_key.to_user_string(), code] + [
        f"{key}={hashes.get(key) or '-'}:{_status(key, result)}" for key in sorted(step_partition_keys(context))]
    return dg.DataVersion(content_hash("\n".join(lines)))


def describe_partitions(context: dg.AssetExecutionContext, result: pipeline.StageResult, upstream: str,
                        extra: dict[str, dict] | None = None, hashes: dict[str, str | None] | None = None) -> None:
    """Attach each document's own figures to its partition's materialization. `failed_documents` is
    overridden per partition too, so a partition only names its own problem. hashes (doc_id -> content hash
    of the stored source, see stored_hashes): a done partition shows the source version it was made from
    as `sha256`, so every per-document asset's history names the version of each materialization."""
    extra, hashes = extra or {}, hashes or {}
    for key in step_partition_keys(context):
        status = _status(key, result)
        metadata: dict = {"status": status, "doc_id": key}
        if status == "done":
            metadata.update(result.figures.get(key, {}))
            metadata.update(extra.get(key, {}))
            if hashes.get(key):
                metadata.setdefault("sha256", hashes[key])
            if isinstance(metadata.get("rows"), int):
                metadata["dagster/partition_row_count"] = metadata["rows"]
            metadata["failed_documents"] = dg.MetadataValue.json({})
        elif status == "failed":
            metadata["problem"] = result.failed[key]
            metadata["failed_documents"] = dg.MetadataValue.json({key: result.failed[key]})
        else:
            metadata["problem"] = f"not processed: no {upstream} output (see the upstream failure)"
            metadata["failed_documents"] = dg.MetadataValue.json({})
        context.add_asset_metadata(metadata, partition_key=key)


def batch_metadata(context: dg.AssetExecutionContext, result: pipeline.StageResult, **extra) -> dict:
    """Figures of the run as a whole; every key says it is the batch's."""
    return {"batch_partitions": len(step_partition_keys(context)), "batch_documents": len(result.done),
            "batch_rows": result.rows, "batch_failed_documents": dg.MetadataValue.json(result.failed),
            "failed_documents": dg.MetadataValue.json(result.failed), **extra}


# --- the assets ---------------------------------------------------------------------------------

def _source_problems(store, doc_ids: list[str]) -> dict[str, str]:
    """doc_id -> what is wrong with its stored source (missing, empty text, no sha256)."""
    problems: dict[str, str] = {}
    for doc_id in doc_ids:
        path = store.path(pipeline.SOURCES, doc_id)
        if not path.exists():
            problems[doc_id] = "no stored source"
            continue
        try:
            row = pl.read_parquet(path, columns=["text", "content_hash"]).row(0, named=True)
        except Exception as error:
            problems[doc_id] = f"unreadable stored source ({error})"
            continue
        if not (row["text"] or "").strip():
            problems[doc_id] = "stored source has no text"
        elif not SHA256.fullmatch(row["content_hash"] or ""):
            problems[doc_id] = f"stored source has no sha256 (content_hash={row['content_hash']!r})"
    return problems


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "parquet"},
    **spec_kwargs("source_document", GROUP), deps=[inbox],
    description="A document from the inbox read, validated (UTF-8 text, not empty, not binary), "
    "normalised (NFC, Unix newlines; HTML to text) and content-hashed; stored as Parquet.",
    check_specs=[dg.AssetCheckSpec(
        "every_source_is_stored", asset="source_document",
        description="Every document this run read has a stored source with non-empty text and a sha256 "
        "content hash (64 hex digits) of its file's bytes.")],
)
def source_document(context: dg.AssetExecutionContext, index: IndexResource, inbox: InboxResource) -> dg.MaterializeResult:
    files = inbox.files()
    paths = {key: files.get(key) for key in step_partition_keys(context)}
    settings = index.settings()
    store = index.extract_store()
    result = pipeline.load_sources(paths, inbox.root(), store, settings.index_version)
    _report_failures(context, "source_document", result)
    extra = {}
    for key, figures in result.figures.items():
        own = {"source_path": dg.MetadataValue.path(figures["source_path"]),
               "sha256": figures["sha256"], "size_bytes": figures["size_bytes"]}
        try:
            own["modified_at"] = dg.MetadataValue.timestamp(datetime.fromisoformat(figures["modified_at"]))
        except (KeyError, TypeError, ValueError):
            pass
        extra[key] = own
    hashes = stored_hashes(store, step_partition_keys(context))
    describe_partitions(context, result, "inbox file", extra, hashes)
    problems = _source_problems(store, result.done)
    return dg.MaterializeResult(
        metadata=batch_metadata(context, result, index_version=settings.index_version),
        data_version=data_version(context, hashes, result),
        check_results=[dg.AssetCheckResult(check_name="every_source_is_stored", passed=not problems,
                                           metadata={"documents_checked": len(result.done),
                                                     "problems": dg.MetadataValue.json(problems)})],
    )


def _chunk_checks(frame: pl.DataFrame, limit: int) -> list[dg.AssetCheckResult]:
    empty = frame.filter(pl.col("text").str.strip_chars() == "").height if frame.height else 0
    over = frame.filter(pl.col("token_count") > limit).height if frame.height else 0
    return [
        dg.AssetCheckResult(check_name="no_empty_chunks", passed=empty == 0, metadata={"empty_chunks": empty}),
        dg.AssetCheckResult(check_name="chunks_within_embedder_limit", passed=over == 0,
                            metadata={"over_limit": over, "limit_tokens": limit}),
    ]


def _preview(frame: pl.DataFrame, rows: int = PREVIEW_CHUNKS) -> str:
    lines = ["| chunk | heading | chars | tokens | text |", "|---|---|---|---|---|"]
    for row in frame.head(rows).iter_rows(named=True):
        text = row["text"][:160].replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {row['order']} | {row['heading_path'] or '—'} | {row['char_start']}–{row['char_end']} "
                     f"| {row['token_count']} | {text} |")
    return "\n".join(lines)


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "parquet"},
    **spec_kwargs("document_chunks", GROUP), deps=[source_document],
    description="Heading-aware chunks sized for the embedder (never truncated), with character offsets "
    "into the source, heading path and order; stored as Parquet.",
    check_specs=[
        dg.AssetCheckSpec("no_empty_chunks", asset="document_chunks",
                          description="No chunk of this run's documents is empty or whitespace only."),
        dg.AssetCheckSpec("chunks_within_embedder_limit", asset="document_chunks",
                          description="No chunk has more word pieces than the embedding model accepts, so "
                          "nothing is silently truncated when embedded."),
    ],
)
def document_chunks(context: dg.AssetExecutionContext, index: IndexResource, embedder: EmbedderResource) -> dg.MaterializeResult:
    store = index.extract_store()
    model = embedder.get()
    result = pipeline.chunk_documents(with_output(context, store, pipeline.SOURCES), store, model,
                                      index.settings().chunk_tokens)
    _report_failures(context, "document_chunks", result)
    frames = {d: store.read(pipeline.CHUNKS, d) for d in result.done}
    extra = {}
    for doc_id, own in frames.items():
        extra[doc_id] = {
            "tokens_max": int(own["token_count"].max() or 0),
            "source_path": dg.MetadataValue.path(own["source_path"][0]) if own.height else "",
            "sha256": own["content_hash"][0] if own.height else "",
            "preview": dg.MetadataValue.md(_preview(own)),
        }
    hashes = stored_hashes(store, step_partition_keys(context))
    describe_partitions(context, result, pipeline.SOURCES, extra, hashes)
    frame = pl.concat(list(frames.values()), how="diagonal_relaxed") if frames else \
        pl.DataFrame(schema=pipeline.CHUNK_COLUMNS)
    tokens = frame["token_count"]
    return dg.MaterializeResult(
        metadata=batch_metadata(context, result, batch_tokens=int(tokens.sum() or 0),
                                batch_tokens_mean=float(tokens.mean() or 0.0), batch_tokens_max=int(tokens.max() or 0)),
        data_version=data_version(context, hashes, result),
        check_results=_chunk_checks(frame, model.max_tokens),
    )


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "lancedb", "parquet"},
    **spec_kwargs("chunk_vectors", GROUP), deps=[document_chunks],
    description="Chunk embeddings (all-MiniLM-L6-v2 by default), batched across the run's documents, "
    "written to the LanceDB chunks table (replacing the document's previous rows) and kept as Parquet.",
    check_specs=[dg.AssetCheckSpec(
        "vectors_have_model_dimension", asset="chunk_vectors",
        description="Every chunk of this run's documents has exactly one vector row in LanceDB, and the vectors "
        "have the embedding model's dimension (a model change without a new index version would mix them).")],
)
def chunk_vectors(context: dg.AssetExecutionContext, index: IndexResource, embedder: EmbedderResource,
                  lancedb: LanceDBResource) -> dg.MaterializeResult:
    store, vectors, model = index.extract_store(), lancedb.get(), embedder.get()
    ready = with_output(context, store, pipeline.CHUNKS)
    result = pipeline.embed_documents(ready, store, model, vectors, ledger=index.ledger(), run_id=context.run.run_id)
    hashes = stored_hashes(store, step_partition_keys(context))
    describe_partitions(context, result, pipeline.CHUNKS,
                        {d: {"model": model.model_name, "dimension": model.dimension} for d in result.done}, hashes)
    stored = vectors.vector_dimension()
    expected = sum(result.figures[d]["rows"] for d in result.done)
    in_run = "doc_id IN (" + ", ".join("'" + d.replace("'", "''") + "'" for d in result.done) + ")"
    rows = vectors.count("chunks", in_run) if result.done else 0
    check = dg.AssetCheckResult(check_name="vectors_have_model_dimension",
                                passed=stored in (None, model.dimension) and rows == expected,
                                metadata={"model_dimension": model.dimension, "stored_dimension": stored or 0,
                                          "chunks": expected, "vector_rows": rows})
    return dg.MaterializeResult(
        metadata=batch_metadata(context, result, batch_embedding_tokens=result.tokens, model=model.model_name,
                                lance_table=dg.MetadataValue.path(vectors.table_uri("chunks"))),
        data_version=data_version(context, hashes, result),
        check_results=[check],
    )


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "parquet", "kuzu", "lancedb"},
    **spec_kwargs("document_graph", GROUP), deps=[chunk_vectors], pool=GRAPH_WRITER_POOL,
    description="Source and Chunk nodes with chunk→source (PART_OF) and chunk→next (NEXT) edges in the "
    "embedded Kùzu graph; the document is then marked indexed in the LanceDB catalog.",
    check_specs=[dg.AssetCheckSpec(
        "every_chunk_has_a_source", asset="document_graph",
        description="Every Chunk node of this run's documents has a PART_OF edge to its Source node.")],
)
def document_graph(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                   kuzu: KuzuResource) -> dg.MaterializeResult:
    store = index.extract_store()
    ready = with_output(context, store, pipeline.VECTORS)
    with kuzu.writer() as graph:
        result = pipeline.load_graph(ready, store, graph, lancedb.get())
        if result.done:
            index.corpus_files().forget_built()
        orphans = graph.chunks_without_source(ready)
    hashes = stored_hashes(store, step_partition_keys(context))
    describe_partitions(context, result, pipeline.VECTORS, hashes=hashes)
    return dg.MaterializeResult(
        metadata=batch_metadata(context, result, graph_path=dg.MetadataValue.path(kuzu.graph_path())),
        data_version=data_version(context, hashes, result),
        check_results=[dg.AssetCheckResult(check_name="every_chunk_has_a_source", passed=int(orphans) == 0,
                                           metadata={"chunks_without_source": int(orphans)})],
    )


document_assets = [source_document, document_chunks, chunk_vectors, document_graph]
