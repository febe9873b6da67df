"""What an auditor finds in the Dagster UI: every asset with a description, owners, kinds and one of the four
groups; the column schema of every table an asset writes, equal to the table a real ingestion wrote; and
each document's materialization history naming its source version (sha256) and the extractor, model and
prompt version of its extractions.

One ingestion of a small corpus through Dagster with the LLM path on (the local OpenAI-protocol test
server; β = 0.5, so a document's skeleton chunks go to the LLM and the rest are extracted by the offline NLP extractor)
serves every test of the module."""
import hashlib
import shutil

import dagster as dg
import polars as pl
import pytest

from assets.catalog import GROUPS, TABLES, Table, columns_of, owners
from lexgraph.indexing import lexical_extraction
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from orchestration.definitions import build_definitions
from orchestration.runner import ingest_folder
from tests.llm_server import LLMTestServer

FIXTURE_MARKS = {"ingested": ("ingest",)}  # marks by fixture (tests/conftest.py)

MODEL = "lexgraph-audit-test-llm"
DOCUMENTS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n## Terms\n\n"
                "Delivery is due in May 2024 at Bergen.\n",
    "beta.txt": "Bolt Engines is run by Dana Frost.\n\nIts plant is in Kiel.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n",
    "Søren notes: 2024.md": "# Notes\n\nSøren Åberg chairs the board of Alpha Shipping.\n",
}
EXTRACTION_ASSETS = ("chunk_extractions", "document_statements", "document_facts", "document_entities")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory, monkeypatch_module):
    root = tmp_path_factory.mktemp("catalog")
    inbox = root / "inbox"
    inbox.mkdir()
    for name, text in DOCUMENTS.items():
        (inbox / name).write_text(text, encoding="utf-8")
    monkeypatch_module.setenv("LEXGRAPH_LLM_BACKOFF", "0")
    with LLMTestServer(model=MODEL) as server, dg.DagsterInstance.ephemeral() as instance:
        settings = Settings.from_env(home=root / "index", inbox=inbox, llm_base_url=server.base_url,
                                     llm_model=MODEL, beta=0.5)
        report = ingest_folder(inbox, instance, settings=settings, progress=False)
        assert report.failed == {} and report.corpus_index_ok and server.calls > 0
        # one document leaves the inbox (its history must show the removal), and the corpus tables are
        # written again by an update, not only by the first build
        sources = VectorStore(settings.lance_uri).sources()
        gamma = sources.filter(pl.col("relative_path") == "gamma.md")["doc_id"][0]
        removed = hashlib.sha256((inbox / "gamma.md").read_bytes()).hexdigest()
        (inbox / "gamma.md").unlink()
        assert ingest_folder(inbox, instance, settings=settings, prune=True, progress=False).removed == 1
        yield settings, instance, inbox, (gamma, removed)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_asset_has_a_description_owners_kinds_and_one_of_four_groups():
    graph = build_definitions().get_repository_def().asset_graph
    groups = {}
    for key in graph.get_all_asset_keys():
        node, name = graph.get(key), key.to_user_string()
        assert node.description and len(node.description) > 40, name
        assert node.group_name in GROUPS, (name, node.group_name)
        assert node.owners and node.owners == owners(node.group_name), name
        assert node.kinds and "python" in node.kinds or name == "inbox", name
        groups.setdefault(node.group_name, set()).add(name)
    assert groups == {
        "per_document": {"inbox", "source_document", "document_chunks", "chunk_vectors", "document_graph",
                         "document_keywords"},
        "extraction": {"chunk_extractions", "document_statements", "document_topics", "document_facts",
                       "document_entities"},
        "corpus": {"chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "lexical_graph",
                   "search_indexes", "graph_tables", "lance_compaction"},
        "quality": {"retrieval_benchmark", "query_log"},
    }
    # every asset that writes a table shows its columns; those that write none (files, a report, a log) do not
    with_schema = {k.to_user_string() for k in graph.get_all_asset_keys()
                   if isinstance(graph.get(k).metadata.get("dagster/column_schema"), dg.TableSchema)}
    assert with_schema == set(TABLES)


def _written_columns(table: Table, settings: Settings, doc_id: str, sha256: str) -> tuple:
    """(name, type) pairs of the table as the ingestion wrote it."""
    if table.kind == "extract":
        key = sha256 if table.name == "source_texts" else doc_id
        return columns_of(pl.read_parquet_schema(ExtractStore(settings.extract_dir).path(table.name, key)))
    if table.kind == "corpus":
        path = getattr(CorpusFiles(settings.index_dir), table.name)
        return columns_of(pl.read_ipc_schema(path) if path.suffix == ".arrow" else pl.read_parquet_schema(path))
    if table.kind == "lancedb":
        return columns_of(VectorStore(settings.lance_uri).db.open_table(table.name).schema)
    graph = GraphStore(settings.graph_path)
    try:
        info = graph.query(f"CALL table_info('{table.name}') RETURN *")
    finally:
        graph.close()
    return tuple(zip(info["name"].to_list(), info["type"].to_list()))


def test_each_tables_declared_columns_are_the_columns_written(ingested):
    settings, _, inbox, _ = ingested
    graph = build_definitions(settings).get_repository_def().asset_graph
    catalog = VectorStore(settings.lance_uri).sources()
    doc_id = catalog.filter(pl.col("relative_path") == "alpha.md")["doc_id"][0]
    sha256 = hashlib.sha256((inbox / "alpha.md").read_bytes()).hexdigest()
    checked = 0
    for asset, tables in TABLES.items():
        node = graph.get(dg.AssetKey(asset))
        shown = node.metadata["dagster/column_schema"]
        assert [(c.name, c.type) for c in shown.columns] == list(tables[0].columns), asset
        for table in tables:
            if table is not tables[0]:
                extra = node.metadata[f"columns/{table.name}"].schema
                assert [(c.name, c.type) for c in extra.columns] == list(table.columns), (asset, table.name)
            written = _written_columns(table, settings, doc_id, sha256)
            assert dict(written) == dict(table.columns), (asset, table.name, written)
            checked += 1
    assert checked == sum(len(t) for t in TABLES.values()) >= 20
    # the provenance columns say what they are
    def notes(asset):
        return {c.name: c.description for c in graph.get(dg.AssetKey(asset)).metadata["dagster/column_schema"].columns}

    assert "prompt" in notes("document_statements")["prompt_version"]
    assert "sha256" in notes("document_chunks")["content_hash"]


def _latest(instance, asset: str, partition: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def test_each_documents_history_names_its_source_version_and_extraction_provenance(ingested):
    settings, instance, inbox, (gamma, removed) = ingested
    catalog = VectorStore(settings.lance_uri).sources()
    store = ExtractStore(settings.extract_dir)
    llm_prompt = lexical_extraction.llm_prompt_version(settings)
    extractors = {}
    for row in catalog.iter_rows(named=True):
        doc_id, sha256 = row["doc_id"], hashlib.sha256((inbox / row["relative_path"]).read_bytes()).hexdigest()
        for asset in ("source_document", "document_chunks", "chunk_vectors", "document_graph", "document_keywords",
                      "chunk_extractions", "document_statements", "document_topics", "document_facts",
                      "document_entities"):
            meta = _latest(instance, asset, doc_id)
            assert meta["status"] == "done" and meta["sha256"] == sha256, (asset, doc_id)
        for asset in EXTRACTION_ASSETS:
            meta = _latest(instance, asset, doc_id)
            stage = {"chunk_extractions": "extractions", "document_statements": "statements",
                     "document_facts": "facts", "document_entities": "entities"}[asset]
            rows = store.read(stage, doc_id)
            # what the partition says is what its stored rows were made by
            for column in ("extractor", "model", "prompt_version"):
                expected = sorted({v for v in rows[column].to_list() if v}) or ["none"]
                assert meta[column].split(", ") == expected, (asset, column, meta[column])
            assert "| extractor | model | prompt version | rows |" in meta["provenance"]
            if asset == "chunk_extractions":
                assert meta["dagster/partition_row_count"] == rows.height
        extracted = _latest(instance, "chunk_extractions", doc_id)
        extractors[doc_id] = extracted["extractor"]
        if "openai" in extracted["extractor"]:  # its skeleton chunks went to the LLM
            assert MODEL in extracted["model"].split(", ") and llm_prompt in extracted["prompt_version"].split(", ")
    # with β = 0.5 the LLM made some documents' rows and the offline NLP extractor others': both are named
    assert any("openai" in e for e in extractors.values()) and any("nlp" in e for e in extractors.values())
    # the removed document's history ends with its removal, naming the version that went
    assert gamma not in instance.get_dynamic_partitions("documents")
    for asset in ("source_document", "chunk_extractions", "document_statements"):
        [record] = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[gamma]), limit=1).records
        meta = {k: v.value for k, v in record.asset_observation.metadata.items()}
        assert meta["removed"] is True and meta["sha256"] == removed and "left the inbox" in meta["reason"]
