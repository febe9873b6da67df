"""The Definitions load as `dagster dev` loads them, with the UI metadata the issue asks for."""
import dagster as dg
import pytest

from assets.catalog import owners
from lexgraph.settings import Settings
from orchestration.definitions import build_definitions

LEXICAL = {"chunk_extractions", "document_statements", "document_topics", "document_facts", "document_entities"}
PER_DOCUMENT = {"inbox", "source_document", "document_chunks", "chunk_vectors", "document_graph",
                "document_keywords"} | LEXICAL
CORPUS = {"chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "lexical_graph", "search_indexes",
          "graph_tables", "lance_compaction"}
# What each asset reads or writes, besides running Python.
KINDS = {
    "inbox": {"filesystem"},
    "source_document": {"python", "parquet"},
    "document_chunks": {"python", "parquet"},
    "chunk_vectors": {"python", "parquet", "lancedb"},
    "document_graph": {"python", "parquet", "kuzu", "lancedb"},
    "document_keywords": {"python", "parquet"},
    "chunk_knn_graph": {"python", "parquet", "kuzu", "lancedb"},
    "chunk_pagerank": {"python", "parquet"},
    "skeleton_selection": {"python", "parquet", "kuzu", "lancedb"},
    "keyword_index": {"python", "parquet", "kuzu", "lancedb"},
    "search_indexes": {"python", "lancedb"},
    "graph_tables": {"python", "parquet", "lancedb"},
    "lance_compaction": {"python", "lancedb"},
    "retrieval_benchmark": {"python", "parquet", "lancedb"},
    "query_log": {"python", "json"},
    "chunk_extractions": {"python", "parquet", "openai"},
    "document_statements": {"python", "parquet"},
    "document_topics": {"python", "parquet"},
    "document_facts": {"python", "parquet"},
    "document_entities": {"python", "parquet"},
    "lexical_graph": {"python", "parquet", "kuzu", "lancedb"},
}


def test_definitions_load_with_assets_checks_sensor_and_schedules():
    repo = build_definitions().get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == PER_DOCUMENT | CORPUS | {"retrieval_benchmark", "query_log"}
    checks = {c.name for c in repo.asset_graph.asset_check_keys}
    assert checks == {"every_source_is_stored", "no_empty_chunks", "chunks_within_embedder_limit",
                      "vectors_have_model_dimension", "every_chunk_has_a_source", "keywords_stored_for_every_document",
                      "every_chunk_has_a_neighbour", "pagerank_sums_to_one", "selection_has_beta_n_chunks",
                      "no_dangling_keyword_links", "every_chunk_has_an_extraction", "statements_point_at_own_chunks",
                      "lexical_nodes_are_anchored"}
    for check in repo.asset_graph.asset_check_keys:
        assert repo.asset_graph.get_check_spec(check).description, check
    assert {s.name for s in repo.sensor_defs} == {"inbox_sensor", "corpus_index_sensor", "reextraction_sensor"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_purge", "nightly_ingest"}
    for key in repo.asset_graph.get_all_asset_keys():
        node = repo.asset_graph.get(key)
        name = key.to_user_string()
        assert node.description and node.owners == owners(node.group_name), name
        assert set(node.kinds) == KINDS[name], name
        if name in PER_DOCUMENT:
            assert node.group_name == ("extraction" if name in LEXICAL else "per_document"), name
            assert node.partitions_def == dg.DynamicPartitionsDefinition(name="documents")
        else:  # corpus-wide assets are unpartitioned and never upstream of a partitioned one
            assert node.group_name == ("corpus" if name in CORPUS else "quality") and node.partitions_def is None
            assert all(repo.asset_graph.get(c).partitions_def is None for c in node.child_keys)
    assert repo.get_job("ingest_documents").executor_def.name == "in_process"
    for writer in ("document_graph", "chunk_knn_graph", "skeleton_selection", "keyword_index", "lexical_graph"):
        assert repo.asset_graph.get(dg.AssetKey(writer)).pools == {"kuzu_writer"}
    # the inbox is observed (sha256 data versions) upstream of the sources, in every ingestion run
    inbox = repo.asset_graph.get(dg.AssetKey("inbox"))
    assert inbox.is_observable and dg.AssetKey("source_document") in inbox.child_keys
    assert dg.AssetKey("inbox") in repo.get_job("ingest_documents").asset_layer.external_job_asset_keys | \
        repo.get_job("ingest_documents").asset_layer.executable_asset_keys


def test_lineage_reads_source_chunk_statement_topic_fact_entity():
    """The asset graph shows the lexical graph's lineage: Source → Chunk → Statement → Topic / Fact / Entity,
    then the corpus-wide load; the skeleton drives extraction only through its selection file (no edge)."""
    repo = build_definitions().get_repository_def()
    graph = repo.asset_graph

    def parents(name):
        return {k.to_user_string() for k in graph.get(dg.AssetKey(name)).parent_keys}

    assert parents("document_chunks") == {"source_document"}
    assert parents("chunk_extractions") == {"document_chunks"}
    assert parents("document_statements") == {"chunk_extractions"}
    assert parents("document_topics") == parents("document_facts") == parents("document_entities") == {
        "document_statements"}
    assert parents("lexical_graph") >= {"document_statements", "document_topics", "document_facts",
                                        "document_entities", "skeleton_selection"}
    assert "skeleton_selection" not in parents("chunk_extractions")  # would mark every partition stale
    ingest = repo.get_job("ingest_documents").asset_layer.executable_asset_keys
    assert {dg.AssetKey(name) for name in LEXICAL} <= ingest
    assert dg.AssetKey("lexical_graph") in repo.get_job("build_corpus_index").asset_layer.executable_asset_keys
    assert {k.to_user_string() for k in repo.get_job("extract_documents").asset_layer.executable_asset_keys} == LEXICAL


def _code_versions(settings):
    graph = build_definitions(settings).get_repository_def().asset_graph
    return {k.to_user_string(): graph.get(k).code_version for k in graph.materializable_asset_keys}


def test_code_versions_come_from_the_settings_not_the_run(tmp_path):
    settings = Settings.from_env(home=tmp_path)
    versions = _code_versions(settings)
    assert all(versions.values()) and versions == _code_versions(Settings.from_env(home=tmp_path / "elsewhere"))
    chunking = _code_versions(settings.with_(chunk_tokens=120))
    assert all(chunking[name] != versions[name] for name in versions)
    beta = _code_versions(settings.with_(beta=0.5))
    assert {name for name in versions if beta[name] != versions[name]} == {"skeleton_selection", "retrieval_benchmark"}
    knn = _code_versions(settings.with_(knn_k=3))
    assert {name for name in versions if knn[name] != versions[name]} == {
        "chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "retrieval_benchmark"}
    # the extractor's model and prompt version (entity types, PII masking) are part of the extraction assets'
    for change in ({"llm_base_url": "http://127.0.0.1:9/v1"}, {"entity_types": ("person", "other")},
                   {"pii_masking": "on", "llm_base_url": "http://127.0.0.1:9/v1"}):
        changed = _code_versions(settings.with_(**change))
        assert {name for name in versions if changed[name] != versions[name]} == LEXICAL | {"lexical_graph"}, change
    llm = settings.with_(llm_base_url="http://127.0.0.1:9/v1")
    other_model = _code_versions(llm.with_(llm_model="another-model"))
    assert {name for name in versions if other_model[name] != _code_versions(llm)[name]} == LEXICAL | {"lexical_graph"}


@pytest.mark.subprocess
def test_workspace_loads_as_dagster_dev_loads_it():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w",
                             "workspace.yaml"], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful for code location orchestration.definitions:defs" in result.stdout + result.stderr


def test_importing_the_definitions_reads_no_settings(monkeypatch, tmp_path):
    """--home must win over a bad LEXGRAPH_HOME: the module builds nothing from the environment on import."""
    import importlib

    import orchestration.definitions as module

    monkeypatch.setenv("LEXGRAPH_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("not a folder")
    importlib.reload(module)
    defs = module.build_definitions(Settings.from_env(home=tmp_path / "index"))
    assert defs.resources["index"].settings().home == tmp_path / "index"
