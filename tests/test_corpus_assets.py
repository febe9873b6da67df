"""Corpus-wide KET-RAG assets through Dagster: incremental add and remove, β settings, lineage."""
import json

import dagster as dg
import polars as pl
import pytest

from lexgraph.indexing.corpus_state import CORPUS_STEPS, RELOADED, CorpusFiles, catalog_digest
from lexgraph.indexing.knn_state import read_edges
from lexgraph.settings import Settings
from orchestration.definitions import build_definitions
from orchestration.runner import ingest_folder
from tests.helpers import graph_counts, materialized_partitions, stores

GRAPH_TABLES = ("Chunk", "SIMILAR", "Keyword", "KEYWORD_IN")


def _corpus_metadata(instance, asset):
    record = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records[0]
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


def _dangling(home):
    from lexgraph.storage.graph_store import GraphStore

    graph = GraphStore(Settings.from_env(home=home).graph_path)
    try:
        no_chunk_keywords = graph.query("MATCH (k:Keyword) WHERE NOT EXISTS { MATCH (k)-[:KEYWORD_IN]->(:Chunk) } "
                                        "RETURN count(k) AS n")["n"][0]
        lonely = graph.query("MATCH (c:Chunk) WHERE NOT EXISTS { MATCH (c)-[:SIMILAR]-(:Chunk) } "
                             "RETURN count(c) AS n")["n"][0]
        return int(no_chunk_keywords), int(lonely)
    finally:
        graph.close()


def test_skeleton_builds_and_updates_incrementally(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    vectors, _ = stores(home)
    n = vectors.count("chunks")
    selection = pl.read_parquet(files.skeleton)
    assert selection["selected"].sum() == int(0.8 * n)
    assert abs(pl.read_parquet(files.pagerank)["pagerank"].sum() - 1) < 1e-9
    knn_meta = _corpus_metadata(instance, "chunk_knn_graph")
    assert knn_meta["rebuilt"] is True
    assert _dangling(home) == (0, 0)
    # every corpus step recorded the catalog it was built from
    digest = catalog_digest(vectors.indexed_hashes())
    assert files.built_digests() == dict.fromkeys(CORPUS_STEPS, digest) and files.stale_steps(vectors.indexed_hashes(), Settings.from_env(home=home)) == []
    assert knn_meta["catalog_digest"] == digest == _corpus_metadata(instance, "skeleton_selection")["catalog_digest"]
    lance_chunks = pl.from_arrow(vectors.db.open_table("chunk_scores").to_arrow())
    assert lance_chunks["in_skeleton"].sum() == int(0.8 * n) and lance_chunks["pagerank"].min() > 0
    assert lance_chunks.height == n and "pagerank" not in vectors.db.open_table("chunks").schema.names

    # Adding a document: no other document's per-document assets run again.
    before = {a: materialized_partitions(instance, a) for a in ("source_document", "document_chunks",
                                                                  "chunk_vectors", "document_keywords")}
    (tiny_corpus / "epsilon.md").write_text("# Epsilon\n\nEpsilon Freight leased two vessels from Alpha Shipping "
                                            "in Bergen under contract C-7.\n")
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    for asset, keys in before.items():
        added = materialized_partitions(instance, asset)[len(keys):]
        assert len(added) == 1 and added[0].startswith("epsilon.md-"), (asset, added)
    knn_meta = _corpus_metadata(instance, "chunk_knn_graph")
    assert knn_meta["rebuilt"] is False
    assert knn_meta["semantic_update"]["added"] == 1 and knn_meta["semantic_update"]["removed"] == 0
    diff = json.loads(files.skeleton_diff.read_text())
    assert set(diff) >= {"newly_selected", "deselected", "documents", "beta"}
    assert all(d in vectors.sources()["doc_id"].to_list() for d in diff["documents"])
    assert pl.read_parquet(files.skeleton)["selected"].sum() == int(0.8 * (n + 1))
    keyword_meta = _corpus_metadata(instance, "keyword_index")
    assert (keyword_meta["documents_added"], keyword_meta["documents_removed"]) == (1, 0)
    assert files.stale_steps(vectors.indexed_hashes(), Settings.from_env(home=home)) == []


def test_pagerank_and_skeleton_inherit_the_catalog_the_knn_graph_was_built_from(tiny_corpus, home, instance):
    """A corpus step that reads the KNN state records the catalog that state was built from, not the current
    one: a document indexed meanwhile leaves the corpus out of step, so it is updated again."""
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    built = files.built_digests()["chunk_knn_graph"]
    (tiny_corpus / "epsilon.md").write_text("# Epsilon\n\nEpsilon Freight leased two vessels in Bergen.\n")
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    from assets.skeleton import chunk_pagerank, skeleton_selection

    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    assert dg.materialize([chunk_pagerank, skeleton_selection], instance=instance, resources=defs.resources).success
    # the new document's graph load marked the KNN record out of step; PageRank and skeleton inherit it
    assert files.built_digests()["chunk_knn_graph"] == RELOADED + built
    assert files.built_digests()["skeleton_selection"] == RELOADED + built
    assert set(files.stale_steps(stores(home)[0].indexed_hashes(), Settings.from_env(home=home))) == set(CORPUS_STEPS)


def test_removing_a_document_leaves_no_dangling_edges_or_keywords(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    keywords_before = set(pl.read_ipc(files.keyword_index)["keyword"].to_list())
    assert "kiel" in keywords_before  # only beta.txt mentions Kiel
    (tiny_corpus / "beta.txt").unlink()
    ingest_folder(tiny_corpus, instance, home=str(home), prune=True, progress=False)
    keywords_after = set(pl.read_ipc(files.keyword_index)["keyword"].to_list())
    assert "kiel" not in keywords_after and "alpha shipping" in keywords_after
    edges = read_edges(files).frame()
    chunk_ids = set(stores(home)[0].chunk_vectors()[0]["chunk_id"].to_list())
    assert set(edges["src"]) | set(edges["dst"]) <= chunk_ids
    assert _dangling(home) == (0, 0)
    assert _corpus_metadata(instance, "keyword_index")["documents_removed"] == 1
    assert _corpus_metadata(instance, "chunk_knn_graph")["semantic_update"]["removed"] >= 1


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_beta_extremes(tiny_corpus, home, instance, beta):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False, corpus=False)
    from assets.skeleton import corpus_assets
    from resources import IndexResource

    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    resources = {**defs.resources, "index": IndexResource.from_settings(Settings.from_env(home=home, beta=beta))}
    result = dg.materialize(corpus_assets, instance=instance, resources=resources)
    assert result.success
    n = stores(home)[0].count("chunks")
    selection = pl.read_parquet(CorpusFiles(Settings.from_env(home=home).index_dir).skeleton)
    assert selection["selected"].sum() == (0 if beta == 0 else n)
    checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert len(checks) == 4 and all(c.passed for c in checks)


def test_changing_beta_or_k_makes_the_corpus_steps_that_use_them_out_of_step(tiny_corpus, home, instance, monkeypatch):
    """The catalog alone does not show a settings change: each step also records the settings it was built
    with, so the next `lexgraph ingest` rebuilds the skeleton at the new β, and the KNN graph at the new k."""
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    catalog = stores(home)[0].indexed_hashes()
    n = stores(home)[0].count("chunks")
    monkeypatch.setenv("LEXGRAPH_BETA", "0.5")
    assert files.stale_steps(catalog, Settings.from_env(home=home)) == ["skeleton_selection"]
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert report.corpus_index_ok and report.new == report.changed == 0
    assert pl.read_parquet(files.skeleton)["selected"].sum() == int(0.5 * n)
    assert _corpus_metadata(instance, "skeleton_selection")["beta"] == 0.5
    assert files.stale_steps(catalog, Settings.from_env(home=home)) == []

    monkeypatch.setenv("LEXGRAPH_KNN_K", "2")
    assert files.stale_steps(catalog, Settings.from_env(home=home)) == ["chunk_knn_graph", "chunk_pagerank",
                                                                         "skeleton_selection"]
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert _corpus_metadata(instance, "chunk_knn_graph")["k"] == 2
    assert files.stale_steps(catalog, Settings.from_env(home=home)) == []
