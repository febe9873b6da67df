"""The lexical graph as assets: chunk extractions → statements → topics / facts / entities → the graph load.

Per document (partitioned, batched like the ingestion assets): `chunk_extractions` extracts every chunk,
the skeleton ones with the LLM when one is configured (cached; the rest by the offline NLP extractor), and the
`lexical_tables` multi-asset flattens them into `document_statements`, `document_topics`,
`document_facts` and `document_entities`, so the lineage reads Source → Chunk → Statement → Topic /
Fact / Entity. Corpus-wide: `lexical_graph` loads all documents' tables, with entity and fact
resolution, into Kùzu and LanceDB, with no LLM call.

chunk_extractions reads the skeleton selection file at run time instead of depending on the
unpartitioned `skeleton_selection` asset: an unpartitioned parent marks every partition stale, so a
selection change would show the whole corpus as needing re-extraction (DESIGN §4). The selection diff
drives re-extraction instead (orchestration.sensors.reextraction_sensor, the CLI runner).
"""
import dagster as dg
import polars as pl

from assets.catalog import CORPUS, EXTRACTION, spec_kwargs, with_catalog
from assets.documents import (_report_failures, _status, batch_metadata, describe_partitions, document_chunks,
                              document_graph, stored_hashes, with_output)
from assets.partitions import GRAPH_WRITER_POOL, batched, documents, step_partition_keys
from assets.corpus_result import corpus_result
from assets.skeleton import skeleton_selection
from lexgraph.indexing import corpus_update, lexical, lexical_extraction, pipeline
from lexgraph.ids import content_hash
from resources import EmbedderResource, ExtractorResource, IndexResource, KuzuResource, LanceDBResource

GROUP = CORPUS
PREVIEW_STATEMENTS = 5
STATEMENTS, TOPICS, FACTS, ENTITIES = "document_statements", "document_topics", "document_facts", "document_entities"
# Which extract tables each asset of the multi-asset stands for.
TABLES = {STATEMENTS: (pipeline.STATEMENTS,), TOPICS: (pipeline.TOPICS,), FACTS: (pipeline.FACTS,),
          ENTITIES: (pipeline.ENTITIES, pipeline.RELATIONS)}


def lexical_data_version(context: dg.AssetExecutionContext, key: dg.AssetKey, hashes: dict[str, str | None],
                         result: pipeline.StageResult) -> dg.DataVersion:
    """Like assets.documents.data_version, for one asset of a (multi-)asset, from hashes of the documents'
    extracted content (times left out): re-extracting the same gives the same version, a re-extraction that
    changed a document (the LLM on newly selected chunks) gives a new one."""
    code = context.assets_def.code_versions_by_key.get(key) or ""
    lines = [key.to_user_string(), code] + [
        f"{doc}={hashes.get(doc) or '-'}:{_status(doc, result)}" for doc in sorted(step_partition_keys(context))]
    return dg.DataVersion(content_hash("\n".join(lines)))


def _ledger_totals(index: IndexResource, run_id: str) -> dict:
    """This run's model calls from the cost ledger (the one source of cost figures), its failed calls by reason
    and the chunks the open circuit breaker did not send."""
    ledger = index.ledger()
    frame = ledger.read(run_id=run_id)  # only the parts that may hold this run: the ledger grows with every run
    totals = ledger.totals(by=["stage"], run_id=run_id, frame=frame)
    failures = lexical_extraction.llm_failure_figures(frame, run_id)
    extraction = totals.filter(pl.col("stage") == lexical_extraction.EXTRACTION_STAGE)
    row = extraction.row(0, named=True) if extraction.height else {}
    hits = int(row.get("cache_hits", 0))
    return {"batch_llm_calls": int(row.get("calls", 0)) - hits, "batch_cache_hits": hits,
            **{k: dg.MetadataValue.json(v) if isinstance(v, dict) else v for k, v in failures.items()},
            "batch_llm_requests": int(row.get("requests", 0)),
            "batch_prompt_tokens": int(row.get("prompt_tokens", 0)),
            "batch_completion_tokens": int(row.get("completion_tokens", 0)),
            "batch_llm_seconds": round(float(row.get("seconds", 0.0)), 3)}


def extraction_provenance(store, stage: str, doc_id: str) -> dict:
    """What a document's rows of one extract table were made by, for its partition's metadata: `extractor`,
    `model` and `prompt_version` (each the distinct values, comma-joined: a document whose skeleton chunks went
    to the LLM has both extractors), and `provenance`, a table of rows per (extractor, model, prompt version)."""
    try:  # only the three columns: an extraction file also holds every chunk's JSON
        frame = pl.read_parquet(store.path(stage, doc_id), columns=["extractor", "model", "prompt_version"])
    except (Exception, pl.exceptions.PanicException):  # missing or damaged: its check and the run log say so
        return {}
    out: dict = {column: ", ".join(sorted({v for v in frame[column].to_list() if v})) or "none"
                 for column in ("extractor", "model", "prompt_version")}
    counts = (frame.group_by("extractor", "model", "prompt_version").len()
              .sort("len", "extractor", descending=[True, False]))
    out["provenance"] = dg.MetadataValue.md("\n".join(
        ["| extractor | model | prompt version | rows |", "|---|---|---|---|"]
        + [f"| {r['extractor']} | {r['model']} | {r['prompt_version']} | {r['len']} |"
           for r in counts.iter_rows(named=True)]))
    return out


def _extraction_problems(store, doc_ids: list[str]) -> dict[str, str]:
    problems = {}
    for doc_id in doc_ids:
        chunks = set(store.read(pipeline.CHUNKS, doc_id)["chunk_id"].to_list())
        rows = store.read(pipeline.EXTRACTIONS, doc_id)["chunk_id"].to_list()
        if set(rows) != chunks or len(rows) != len(chunks):
            problems[doc_id] = f"{len(rows)} extraction rows for {len(chunks)} chunks"
    return problems


@dg.asset(
    partitions_def=documents, backfill_policy=batched, kinds={"python", "parquet", "openai"},
    **spec_kwargs("chunk_extractions", EXTRACTION), deps=[document_chunks],
    description="One structured extraction per chunk (topics with standalone statements and their facts, entities "
    "with a mention line, relations). Chunks of the current skeleton selection go to the LLM extractor when "
    "LEXGRAPH_LLM_BASE_URL is set (cached by chunk content, model and prompt version; masked first when "
    "LEXGRAPH_PII_MASKING=on); every other chunk, and any chunk whose LLM call failed, gets the LLM-free "
    "offline extraction, with the failure recorded. Each row records extractor, model, prompt version and "
    "time; every model call and cache hit is a cost-ledger row. Stored as Parquet.",
    check_specs=[dg.AssetCheckSpec(
        "every_chunk_has_an_extraction", asset="chunk_extractions",
        description="Every chunk of this run's documents has exactly one extraction row (LLM, cached or offline).")],
)
def chunk_extractions(context: dg.AssetExecutionContext, index: IndexResource,
                      extractors: ExtractorResource) -> dg.MaterializeResult:
    store, files = index.extract_store(), index.corpus_files()
    ready = with_output(context, store, pipeline.CHUNKS)
    skeleton = lexical_extraction.read_skeleton(files.skeleton)
    llm, offline = extractors.llm(), extractors.offline()
    try:
        result = lexical_extraction.extract_documents(ready, store, skeleton, llm, offline, index.extraction_cache(),
                                           index.ledger(), context.run.run_id, masker=extractors.masker())
    finally:
        if llm is not None:
            llm.close()
    _report_failures(context, "chunk_extractions", result)
    extractor = llm or offline
    breaker = getattr(llm, "breaker", None)  # the LLM client's circuit breaker (lexgraph.extract.llm_client)
    breaker_state = {"llm_circuit_breaker": dg.MetadataValue.json(breaker.snapshot())} if breaker else {}
    if breaker is not None and breaker.opens:
        context.log.warning(f"LLM circuit breaker opened {breaker.opens} time(s) (last: {breaker.last_failure}): "
                            f"{breaker.refused} chunk(s) were not sent and kept their offline extraction; the next "
                            "run sends them again")
    extra = {}
    for doc_id, figures in result.figures.items():
        if figures.get("not_sent"):
            context.log.warning(f"{doc_id}: {figures['not_sent']}")
        if figures.get("llm_failures"):
            context.log.warning(f"{doc_id}: {figures['llm_failures']} chunk(s) kept their offline extraction "
                                "after the LLM failed (see the extractions' error column)")
        # what the stored rows were actually made by (an LLM run extracts only the skeleton chunks with it)
        extra[doc_id] = extraction_provenance(store, pipeline.EXTRACTIONS, doc_id)
    describe_partitions(context, result, pipeline.CHUNKS, extra, stored_hashes(store, step_partition_keys(context)))
    problems = _extraction_problems(store, result.done)
    return dg.MaterializeResult(
        # the run's extractors as configured; each partition's extractor / model / prompt_version say what its
        # rows were actually made by
        metadata=batch_metadata(context, result, batch_extractor=extractor.name, batch_model=extractor.model,
                                batch_prompt_version=extractor.prompt_version,
                                offline_prompt_version=offline.prompt_version,
                                skeleton_chunks_selected=len(skeleton), **_ledger_totals(index, context.run.run_id),
                                **breaker_state),
        data_version=lexical_data_version(context, context.asset_key,
                                          lexical.lexical_hashes(store, pipeline.EXTRACTIONS, step_partition_keys(context)),
                                          result),
        check_results=[dg.AssetCheckResult(check_name="every_chunk_has_an_extraction", passed=not problems,
                                           metadata={"documents_checked": len(result.done),
                                                     "problems": dg.MetadataValue.json(problems)})],
    )


def _statement_preview(frame: pl.DataFrame) -> str:
    lines = ["| topic | statement | extractor |", "|---|---|---|"]
    for row in frame.head(PREVIEW_STATEMENTS).iter_rows(named=True):
        text = row["text"][:160].replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {row['topic'].replace('|', '/')} | {text} | {row['extractor']} |")
    return "\n".join(lines)


def _statement_problems(store, doc_ids: list[str]) -> dict[str, str]:
    problems = {}
    for doc_id in doc_ids:
        chunks = set(store.read(pipeline.CHUNKS, doc_id)["chunk_id"].to_list())
        statements = store.read(pipeline.STATEMENTS, doc_id)
        facts = store.read(pipeline.FACTS, doc_id)
        if not set(statements["chunk_id"].to_list()) <= chunks:
            problems[doc_id] = "statements point at chunks that are not the document's"
        elif not set(facts["statement_id"].to_list()) <= set(statements["statement_id"].to_list()):
            problems[doc_id] = "facts point at statements that are not the document's"
    return problems


_SPEC = {"partitions_def": documents, "kinds": {"python", "parquet"}}


@dg.multi_asset(
    name="lexical_tables", partitions_def=documents, backfill_policy=batched,
    specs=[with_catalog(spec, EXTRACTION) for spec in (
        dg.AssetSpec(STATEMENTS, deps=[chunk_extractions], description="Each document's statements: standalone "
                     "claims from its chunks' extractions, one row per statement with a deterministic id, its chunk, "
                     "its topic and its provenance (extractor, model, prompt version, time); Parquet.", **_SPEC),
        dg.AssetSpec(TOPICS, deps=[STATEMENTS], description="Each document's topics (scoped to the one source) and "
                     "how many of its statements each groups; Parquet.", **_SPEC),
        dg.AssetSpec(FACTS, deps=[STATEMENTS], description="The (subject, predicate, object) facts each statement "
                     "asserts, with the global fact id that makes the same fact from two sources one Fact node; "
                     "Parquet.", **_SPEC),
        dg.AssetSpec(ENTITIES, deps=[STATEMENTS], description="Entities (name, type, description, and how each "
                     "appears in its chunk) and entity↔entity relations (predicate, description, strength) of each "
                     "document, before resolution across documents; Parquet.", **_SPEC),
    )],
    check_specs=[dg.AssetCheckSpec(
        "statements_point_at_own_chunks", asset=STATEMENTS,
        description="Every statement of this run's documents points at one of the document's own chunks, and every "
        "fact at one of its statements.")],
)
def lexical_tables(context: dg.AssetExecutionContext, index: IndexResource):
    store = index.extract_store()
    ready = with_output(context, store, pipeline.EXTRACTIONS)
    result = lexical.flatten_documents(ready, store)
    versions = stored_hashes(store, step_partition_keys(context))  # each document's source version
    for asset, stages in TABLES.items():
        key = dg.AssetKey(asset)
        for doc_id in step_partition_keys(context):
            status = _status(doc_id, result)
            metadata: dict = {"status": status, "doc_id": doc_id, "failed_documents": dg.MetadataValue.json({})}
            if status == "done":
                figures = result.figures[doc_id]
                metadata.update({"rows": figures[stages[0]], **{stage: figures[stage] for stage in stages},
                                 "dagster/partition_row_count": figures[stages[0]]})
                if versions.get(doc_id):
                    metadata["sha256"] = versions[doc_id]  # the source version these rows were extracted from
                if asset != TOPICS:  # topics carry no provenance columns; their statements do
                    metadata.update(extraction_provenance(store, stages[0], doc_id))
                if asset == STATEMENTS:
                    metadata["preview"] = dg.MetadataValue.md(_statement_preview(store.read(pipeline.STATEMENTS, doc_id)))
            else:
                metadata["problem"] = "not processed: no chunk_extractions output (see the upstream failure)"
            context.add_asset_metadata(metadata, asset_key=key, partition_key=doc_id)
        per_stage = {stage: lexical.lexical_hashes(store, stage, step_partition_keys(context)) for stage in stages}
        hashes = {doc: content_hash("|".join(per_stage[s][doc] or "-" for s in stages))
                  if any(per_stage[s][doc] for s in stages) else None for doc in step_partition_keys(context)}
        totals = {f"batch_{stage}": sum(result.figures[d][stage] for d in result.done) for stage in stages}
        yield dg.MaterializeResult(
            asset_key=key, metadata={"batch_partitions": len(step_partition_keys(context)),
                                     "batch_documents": len(result.done), **totals,
                                     "failed_documents": dg.MetadataValue.json({})},
            data_version=lexical_data_version(context, key, hashes, result))
    problems = _statement_problems(store, result.done)
    yield dg.AssetCheckResult(asset_key=dg.AssetKey(STATEMENTS), check_name="statements_point_at_own_chunks",
                              passed=not problems, metadata={"documents_checked": len(result.done),
                                                             "problems": dg.MetadataValue.json(problems)})


def _table(counts: dict[str, int]) -> str:
    return "\n".join(["| table | rows |", "|---|---|"] + [f"| {t} | {n} |" for t, n in counts.items()])


@dg.asset(
    kinds={"python", "parquet", "kuzu", "lancedb"}, **spec_kwargs("lexical_graph", GROUP),
    deps=[dg.AssetKey(STATEMENTS), dg.AssetKey(TOPICS), dg.AssetKey(FACTS), dg.AssetKey(ENTITIES), document_graph,
          skeleton_selection],
    pool=GRAPH_WRITER_POOL,
    description="The lexical graph of every indexed document, rebuilt from their Parquet tables without an LLM call: "
    "Statement (→ Chunk, → Topic), Topic (→ Source), Fact (SUPPORTS its statements; one node per fact across "
    "sources), Entity (one per resolved entity: case, whitespace, punctuation, leading articles and legal suffixes "
    "normalised; SUBJECT/OBJECT of facts, RELATED to entities, MENTIONED_IN chunks) in Kùzu, with provenance on "
    "Statement, Fact and Entity; statement and entity vectors in LanceDB (only new texts embedded, each call a "
    "ledger row); every entity merge and its reason in entity_merges.parquet. A removed document's statements go, "
    "and facts and entities only it supported go with them.",
    check_specs=[dg.AssetCheckSpec(
        "lexical_nodes_are_anchored", asset="lexical_graph",
        description="Every Statement has an EXTRACTED_FROM edge to a Chunk, every Fact SUPPORTS at least one "
        "Statement and every Entity is MENTIONED_IN at least one Chunk.")],
)
def lexical_graph(context: dg.AssetExecutionContext, index: IndexResource, lancedb: LanceDBResource,
                  kuzu: KuzuResource, embedder: EmbedderResource) -> dg.MaterializeResult:
    outcome, result = corpus_update.update_lexical_graph(
        index.corpus_files(), index.extract_store(), lancedb.get(), kuzu.writer, embedder.get(), index.ledger(),
        context.run.run_id, index.settings())
    totals = index.ledger().totals(by=["stage", "model"], run_id=context.run.run_id)
    return corpus_result(context, outcome, "lexical_nodes_are_anchored", graph=dg.MetadataValue.md(_table(result.counts)),
                         ledger_this_run=dg.MetadataValue.md(_ledger_markdown(totals)))


def _ledger_markdown(totals: pl.DataFrame) -> str:
    lines = ["| stage | model | calls | cache hits | prompt tokens | completion tokens |", "|---|---|---|---|---|---|"]
    for row in totals.iter_rows(named=True):
        lines.append(f"| {row['stage']} | {row['model']} | {row['calls']} | {row['cache_hits']} | "
                     f"{row['prompt_tokens']} | {row['completion_tokens']} |")
    return "\n".join(lines)


document_lexical_assets = [chunk_extractions, lexical_tables]
lexical_assets = [lexical_graph]
