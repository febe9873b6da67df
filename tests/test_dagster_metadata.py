"""What the Dagster UI shows is true per document: own figures on each partition, content-hash data
versions (an identical re-run leaves everything in sync), checks that can fail, removals in history."""
import hashlib

import dagster as dg
import polars as pl
import pytest
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from lexgraph.indexing import corpus_keywords, corpus_skeleton
from lexgraph.indexing import lexical, lexical_extraction, lexical_tables
from lexgraph.indexing import pipeline
from lexgraph.settings import Settings
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from orchestration.definitions import build_definitions
from orchestration.runner import ingest_folder
from tests.helpers import stores

PER_DOCUMENT = ("source_document", "document_chunks", "chunk_vectors", "document_graph", "document_keywords",
                "chunk_extractions", "document_statements", "document_topics", "document_facts", "document_entities")
CORPUS = ("chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "lexical_graph")
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def _latest(instance, asset, partition=None):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1).records
    return records[0].asset_materialization if records else None


def _meta(materialization):
    return {k: v.value for k, v in materialization.metadata.items()}


def _data_versions(instance, keys):
    versions = {(a, k): _latest(instance, a, k).tags["dagster/data_version"] for a in PER_DOCUMENT for k in keys}
    versions.update({(a, None): _latest(instance, a).tags["dagster/data_version"] for a in CORPUS})
    return versions


def _statuses(instance, defs, keys):
    resolver = CachingStaleStatusResolver(instance, defs.get_repository_def().asset_graph,
                                          LoadingContextForTest(instance))
    statuses = {(a, k): resolver.get_status(dg.AssetKey(a), k) for a in PER_DOCUMENT for k in keys}
    statuses.update({(a, None): resolver.get_status(dg.AssetKey(a)) for a in CORPUS})
    return statuses, resolver


def _shown(text):
    """How a chunk's opening appears in the preview table."""
    return text[:40].replace("\n", " ").replace("|", "\\|")


def _whole_range(keys):
    return {RANGE_START: keys[0], RANGE_END: keys[-1]}


def test_each_partition_describes_its_own_document(tiny_corpus, home, instance):
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    assert len(report.runs) == 1  # one batched run for the four documents
    vectors, _ = stores(home)
    chunks = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().select(["doc_id", "text", "token_count"]))
    catalog = vectors.sources()
    paths = dict(zip(catalog["doc_id"], catalog["relative_path"]))
    assert len(paths) == 4
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    graph = defs.get_repository_def().asset_graph
    for doc_id, relative in paths.items():
        raw = (tiny_corpus / relative).read_bytes()
        own = chunks.filter(pl.col("doc_id") == doc_id)
        others = chunks.filter(pl.col("doc_id") != doc_id)
        for asset in PER_DOCUMENT:
            materialization = _latest(instance, asset, doc_id)
            meta = _meta(materialization)
            assert meta["doc_id"] == doc_id and meta["status"] == "done", (asset, meta)
            assert meta["batch_documents"] == 4 and meta["failed_documents"] == {}
            # the code version is the asset's own (settings, chunker, model), not the run id
            assert materialization.tags["dagster/code_version"] == graph.get(dg.AssetKey(asset)).code_version
        source = _meta(_latest(instance, "source_document", doc_id))
        assert source["sha256"] == hashlib.sha256(raw).hexdigest()
        assert source["source_path"] == relative and source["size_bytes"] == len(raw)
        assert source["modified_at"] == pytest.approx((tiny_corpus / relative).stat().st_mtime, abs=1)
        for asset in ("document_chunks", "chunk_vectors", "document_graph"):
            assert _meta(_latest(instance, asset, doc_id))["rows"] == own.height, asset
        chunked = _meta(_latest(instance, "document_chunks", doc_id))
        assert chunked["tokens"] == own["token_count"].sum() and chunked["sha256"] == source["sha256"]
        assert _shown(own["text"][0]) in chunked["preview"]
        assert not any(_shown(text) in chunked["preview"] for text in others["text"])
        keywords = _meta(_latest(instance, "document_keywords", doc_id))
        stored = pl.read_parquet(Settings.from_env(home=home).extract_dir / "keywords" / f"{doc_id}.parquet")
        assert keywords["rows"] == stored.height
    assert _meta(_latest(instance, "document_chunks", next(iter(paths))))["batch_rows"] == chunks.height
    # the inbox partition's data version is the file's sha256
    inbox = {r.asset_observation.partition: r.asset_observation.tags["dagster/data_version"]
             for r in instance.fetch_observations(dg.AssetKey("inbox"), limit=100).records}
    assert inbox == {d: hashlib.sha256((tiny_corpus / p).read_bytes()).hexdigest() for d, p in paths.items()}


def test_identical_rerun_keeps_data_versions_and_only_a_changed_file_is_unsynced(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    keys = instance.get_dynamic_partitions("documents")
    first = _data_versions(instance, keys)
    statuses, _ = _statuses(instance, defs, keys)
    assert set(statuses.values()) == {StaleStatus.FRESH}

    # Materialize everything again, byte-identical files: no data version moves, nothing is unsynced.
    again = defs.resolve_job_def("ingest_documents").execute_in_process(instance=instance, tags=_whole_range(keys))
    corpus = defs.resolve_job_def("build_corpus_index").execute_in_process(instance=instance)
    assert again.success and corpus.success
    assert _data_versions(instance, keys) == first
    statuses, _ = _statuses(instance, defs, keys)
    assert set(statuses.values()) == {StaleStatus.FRESH}, {k: v for k, v in statuses.items() if v != StaleStatus.FRESH}

    # One file changes and the inbox is observed: only that document's source is unsynced, and why.
    (tiny_corpus / "beta.txt").write_text("Bolt Engines is now run by Lee Park.\n")
    observed = defs.resolve_job_def("ingest_documents").execute_in_process(
        instance=instance, tags=_whole_range(keys), asset_selection=[dg.AssetKey("inbox")])
    assert observed.success
    statuses, resolver = _statuses(instance, defs, keys)
    stale = {k for k, v in statuses.items() if v != StaleStatus.FRESH}
    beta = next(k for k in keys if k.startswith("beta.txt-"))
    assert stale == {("source_document", beta)}
    [cause] = resolver.get_stale_causes(dg.AssetKey("source_document"), beta)
    assert (cause.dependency_asset_key, cause.dependency_partition_key) == (dg.AssetKey("inbox"), beta)
    assert cause.reason == "has a new dependency data version"

    # Ingesting it brings everything back in sync; only the changed document's data versions moved.
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    statuses, _ = _statuses(instance, defs, keys)
    assert set(statuses.values()) == {StaleStatus.FRESH}
    moved = {k for k, v in _data_versions(instance, keys).items() if first[k] != v}
    assert {k for k in moved if k[1] is not None} == {(a, beta) for a in PER_DOCUMENT}


def _check_results(result) -> dict[str, bool]:
    return {e.event_specific_data.check_name: e.event_specific_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def test_per_document_checks_fail_on_bad_output(tiny_corpus, home, instance, monkeypatch):
    """Each per-document check fails when its asset's stored output is wrong (one fault per check)."""
    ok = ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    assert ok.failed == {}
    checks = {}
    for run_id in ok.runs:
        for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            checks[record.dagster_event.event_specific_data.check_name] = record.dagster_event.event_specific_data.passed
    assert len(checks) == 8 and all(checks.values()), checks

    save_source, chunk_frame = pipeline.save_source, pipeline.chunk_frame

    def no_hash(document, store, version):  # alpha's source is stored without its sha256
        from dataclasses import replace
        save_source(replace(document, content_hash="") if document.relative_path == "alpha.md" else document,
                    store, version)

    def bad_chunks(source, counter, max_tokens):  # beta gets an empty chunk and an oversized one
        frame = chunk_frame(source, counter, max_tokens)
        if source["relative_path"] != "beta.txt":
            return frame
        extra = frame.head(1).with_columns(pl.lit("").alias("text"), pl.lit(99).alias("order"),
                                           pl.col("chunk_id") + "-empty")
        big = frame.head(1).with_columns(pl.lit(10_000).cast(pl.Int32).alias("token_count"), pl.lit(98).alias("order"),
                                         pl.col("chunk_id") + "-big")
        return pl.concat([frame, extra.cast(frame.schema), big.cast(frame.schema)])

    replace_chunks = VectorStore.replace_chunks

    def drop_a_vector(self, doc_ids, chunks, matrix):
        return replace_chunks(self, doc_ids, chunks.head(chunks.height - 1), matrix[:-1])

    replace_documents = GraphStore.replace_documents

    def orphan_a_chunk(self, sources, chunks):
        replace_documents(self, sources, chunks)
        self.conn.execute("MATCH (c:Chunk)-[r:PART_OF]->() WHERE c.id = $id DELETE r", {"id": chunks["chunk_id"][0]})

    extract = pipeline.extract_document_keywords

    def lose_stats(doc_ids, store, embedder, progress=None, **ledger):
        result = extract(doc_ids, store, embedder, progress, **ledger)
        store.path(pipeline.KEYWORD_STATS, result.done[0]).unlink()
        return result

    monkeypatch.setattr(pipeline, "save_source", no_hash)
    monkeypatch.setattr(pipeline, "chunk_frame", bad_chunks)
    monkeypatch.setattr(VectorStore, "replace_chunks", drop_a_vector)
    monkeypatch.setattr(GraphStore, "replace_documents", orphan_a_chunk)
    monkeypatch.setattr(pipeline, "extract_document_keywords", lose_stats)

    extract_chunks, flatten = lexical_extraction.extract_documents, lexical.flatten_documents

    def lose_an_extraction(doc_ids, store, *args, **kwargs):  # gamma's first chunk gets no extraction row
        result = extract_chunks(doc_ids, store, *args, **kwargs)
        gamma = next(d for d in result.done if d.startswith("gamma.md-"))
        store.write(pipeline.EXTRACTIONS, gamma, store.read(pipeline.EXTRACTIONS, gamma).slice(1))
        return result

    def foreign_statement(doc_ids, store, progress=None):  # alpha gets a statement of another document's chunk
        result = flatten(doc_ids, store, progress)
        alpha = next(d for d in result.done if d.startswith("alpha.md-"))
        statements = store.read(pipeline.STATEMENTS, alpha)
        store.write(pipeline.STATEMENTS, alpha, pl.concat([statements, statements.head(1).with_columns(
            pl.lit("someone-else-c00000-00000000").alias("chunk_id"))]))
        return result

    monkeypatch.setattr(lexical_extraction, "extract_documents", lose_an_extraction)
    monkeypatch.setattr(lexical, "flatten_documents", foreign_statement)
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    keys = instance.get_dynamic_partitions("documents")
    result = defs.resolve_job_def("ingest_documents").execute_in_process(instance=instance, tags=_whole_range(keys))
    assert result.success
    assert _check_results(result) == {
        "every_source_is_stored": False, "no_empty_chunks": False, "chunks_within_embedder_limit": False,
        "vectors_have_model_dimension": False, "every_chunk_has_a_source": False,
        "keywords_stored_for_every_document": False, "every_chunk_has_an_extraction": False,
        "statements_point_at_own_chunks": False}


def test_corpus_checks_fail_on_bad_output(tmp_path, home, instance, monkeypatch):
    """A one-chunk corpus has a chunk without neighbours; the other corpus checks fail on a fault each."""
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "solo.md").write_text("# Solo\n\nAlpha Shipping signed contract C-1 with Bolt Engines in Bergen.\n")
    ingest_folder(folder, instance, home=str(home), progress=False, corpus=False)
    compute_pagerank, select = corpus_skeleton.compute_pagerank, corpus_skeleton.select

    def unnormalised(files, chunks, edges):
        ranks = compute_pagerank(files, chunks, edges).with_columns(pl.col("pagerank") * 2)
        files.write(files.pagerank, ranks)
        return ranks

    def select_all(files, ranks, beta):
        result = select(files, ranks, beta)
        files.write(files.skeleton, result.selection.with_columns(pl.lit(True).alias("selected")))
        return result

    monkeypatch.setattr(corpus_skeleton, "compute_pagerank", unnormalised)
    monkeypatch.setattr(corpus_skeleton, "select", select_all)
    monkeypatch.setattr(corpus_keywords, "keyword_chunk_links", lambda store, doc_ids: pl.DataFrame(
        schema={"keyword": pl.String, "chunk_id": pl.String, "sentence_count": pl.Int32}))
    graph_frames = lexical_tables.lexical_graph_frames

    def unmentioned_entity(tables):  # an Entity node that no chunk mentions
        nodes, edges, entities, merges = graph_frames(tables)
        extra = nodes["Entity"].head(1).with_columns(pl.lit("ent-nowhere").alias("id"), pl.lit("Nowhere").alias("name"))
        nodes["Entity"] = pl.concat([nodes["Entity"], extra])
        return nodes, edges, entities, merges

    monkeypatch.setattr(lexical_tables, "lexical_graph_frames", unmentioned_entity)
    defs = build_definitions(Settings.from_env(home=home, inbox=folder))
    result = defs.resolve_job_def("build_corpus_index").execute_in_process(instance=instance)
    assert result.success
    assert _check_results(result) == {"every_chunk_has_a_neighbour": False, "pagerank_sums_to_one": False,
                                      "selection_has_beta_n_chunks": False, "no_dangling_keyword_links": False,
                                      "lexical_nodes_are_anchored": False}


def test_purge_leaves_a_removal_event_in_each_assets_history(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    gamma = next(k for k in instance.get_dynamic_partitions("documents") if k.startswith("gamma.md-"))
    removed_version = hashlib.sha256((tiny_corpus / "gamma.md").read_bytes()).hexdigest()
    (tiny_corpus / "gamma.md").unlink()
    report = ingest_folder(tiny_corpus, instance, home=str(home), prune=True, progress=False, corpus=False)
    assert report.removed == 1
    for asset in ("inbox", *PER_DOCUMENT):
        records = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[gamma]), limit=1).records
        assert records, asset
        meta = {k: v.value for k, v in records[0].asset_observation.metadata.items()}
        assert meta["removed"] is True and meta["doc_id"] == gamma
        assert meta["sha256"] == removed_version  # which version of the document went
        assert meta["reason"] == f"file left the inbox ({tiny_corpus / 'gamma.md'})"


def test_the_keyword_check_names_each_fault_of_a_documents_keyword_rows(tmp_path):
    """document_keywords' check reads the distinct (chunk, keyword) pairs of each keyword file: each fault
    below makes it fail with its own message, and the same files without the fault pass."""
    from assets.skeleton import _keyword_problems
    from lexgraph.storage.extract_store import ExtractStore

    store = ExtractStore(tmp_path)
    chunks = pl.DataFrame({"chunk_id": ["d-c0", "d-c1"], "text": ["Oslo is cold.", "Bergen is wet."]})
    rows = pl.DataFrame({"keyword": ["oslo", "oslo", "bergen"], "chunk_id": ["d-c0", "d-c0", "d-c1"],
                         "sentence_id": [0, 0, 1], "char_start": [0, 0, 0], "char_end": [13, 13, 14]},
                        schema_overrides={"sentence_id": pl.Int32, "char_start": pl.Int32, "char_end": pl.Int32})
    stats = pl.DataFrame({"keyword": ["bergen", "oslo"]})

    def problem(keyword_rows, keyword_stats):
        store.write(pipeline.CHUNKS, "d", chunks)
        store.write(pipeline.KEYWORDS, "d", keyword_rows)
        store.write(pipeline.KEYWORD_STATS, "d", keyword_stats)
        return _keyword_problems(store, ["d"]).get("d")

    assert problem(rows, stats) is None
    assert problem(rows.head(0), stats.head(0)) == "its chunks have words but it has no keyword rows"
    foreign = rows.with_columns(pl.when(pl.col("keyword") == "bergen").then(pl.lit("other-c9"))
                                .otherwise(pl.col("chunk_id")).alias("chunk_id"))
    assert problem(foreign, stats) == "keyword rows point at chunks that are not the document's"
    assert problem(rows, stats.head(1)) == "keyword stats do not match the keyword rows"
