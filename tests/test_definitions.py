"""The Definitions load as `dagster dev` loads them, with the UI metadata the issue asks for."""
import dagster as dg

from orchestration.definitions import defs


def test_definitions_load_with_assets_checks_sensor_and_schedules():
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    per_document = {"source_document", "document_chunks", "chunk_vectors", "document_graph", "document_keywords"}
    corpus = {"chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index"}
    assert keys == per_document | corpus | {"retrieval_benchmark"}
    checks = {c.name for c in repo.asset_graph.asset_check_keys}
    assert {"no_empty_chunks", "chunks_within_embedder_limit", "vectors_have_model_dimension",
            "every_chunk_has_a_source", "every_chunk_has_a_neighbour", "pagerank_sums_to_one",
            "selection_has_beta_n_chunks", "no_dangling_keyword_links"} <= checks
    assert {s.name for s in repo.sensor_defs} == {"inbox_sensor", "corpus_index_after_ingest"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_purge", "nightly_ingest"}
    for key in repo.asset_graph.get_all_asset_keys():
        node = repo.asset_graph.get(key)
        assert node.description and node.kinds
        if key.to_user_string() in per_document:
            assert node.group_name == "ingestion"
            assert node.partitions_def == dg.DynamicPartitionsDefinition(name="documents")
        else:  # corpus-wide assets are unpartitioned and never upstream of a partitioned one
            assert node.group_name in ("skeleton", "evaluation") and node.partitions_def is None
            assert all(repo.asset_graph.get(c).partitions_def is None for c in node.child_keys)
    assert repo.get_job("ingest_documents").executor_def.name == "in_process"
    for writer in ("document_graph", "chunk_knn_graph", "skeleton_selection", "keyword_index"):
        assert repo.asset_graph.get(dg.AssetKey(writer)).pools == {"kuzu_writer"}

