"""The Definitions load as `dagster dev` loads them, with the UI metadata the issue asks for."""
import dagster as dg

from orchestration.definitions import defs


def test_definitions_load_with_assets_checks_sensor_and_schedules():
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"source_document", "document_chunks", "chunk_vectors", "document_graph"}
    checks = {c.name for c in repo.asset_graph.asset_check_keys}
    assert {"no_empty_chunks", "chunks_within_embedder_limit", "vectors_have_model_dimension",
            "every_chunk_has_a_source"} <= checks
    assert {s.name for s in repo.sensor_defs} == {"inbox_sensor"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_purge", "nightly_ingest"}
    for key in repo.asset_graph.get_all_asset_keys():
        node = repo.asset_graph.get(key)
        assert node.description and node.group_name == "ingestion" and node.kinds
        assert node.partitions_def == dg.DynamicPartitionsDefinition(name="documents")
    graph_node = repo.asset_graph.get(dg.AssetKey("document_graph"))
    assert graph_node.pools == {"kuzu_writer"}


def test_engine_does_not_import_dagster():
    import pathlib
    import re

    engine = pathlib.Path(__file__).resolve().parent.parent / "lexgraph"
    offenders = [p.name for p in engine.glob("*.py")
                 if re.search(r"^\s*(import dagster|from dagster)", p.read_text(), re.M)]
    assert offenders == []
