"""LanceDB compaction: fragmented tables are rewritten with the same rows, indexed ones are left alone, and
the corpus job does it last (real LanceDB, real Dagster)."""
from datetime import timedelta

import dagster as dg
import polars as pl
import pyarrow as pa

from lexgraph.storage import lance_maintenance
from lexgraph.storage.vector_store import VectorStore
from orchestration.runner import ingest_folder
from tests.helpers import stores

SCHEMA = pa.schema([("id", pa.string()), ("doc_id", pa.string()), ("value", pa.int64())])


def _fragmented(tmp_path, documents=40):
    store = VectorStore(tmp_path / "lance")
    table = store.db.create_table("rows", schema=SCHEMA)
    for d in range(documents):  # one write per document, as the ingestion does
        table.add(pa.table({"id": [f"{d}-{i}" for i in range(3)], "doc_id": [f"d{d}"] * 3, "value": [d, d, d]},
                           schema=SCHEMA))
    return store, table


def _rows(store, name="rows"):
    return pl.from_arrow(store.db.open_table(name).to_arrow()).sort("id")


def test_a_fragmented_table_is_compacted_with_the_same_rows_and_old_versions_pruned(tmp_path, monkeypatch):
    store, table = _fragmented(tmp_path)
    table.delete("doc_id IN ('d3', 'd7')")  # removed documents: their rows must stay gone
    before = _rows(store)
    monkeypatch.setattr(lance_maintenance, "KEEP_VERSIONS", timedelta(0))
    [report] = lance_maintenance.compact_tables(store)
    assert report["decision"] == "compacted"
    assert report["fragments_before"] >= 38 and report["fragments_after"] == 1
    assert report["versions_after"] < report["versions_before"]
    assert report["bytes_after"] < report["bytes_before"]
    assert _rows(store).equals(before) and before.height == 38 * 3
    # now current: a second pass rewrites nothing
    assert lance_maintenance.compact_tables(store)[0]["decision"] == "current"


def test_small_and_empty_tables_are_left_and_indexed_tables_are_not_touched(tmp_path):
    store, _ = _fragmented(tmp_path, documents=3)
    store.db.create_table("empty", schema=SCHEMA)
    indexed, _ = _fragmented(tmp_path / "other", documents=40)
    indexed.db.open_table("rows").create_scalar_index("id")
    decisions = {r["table"]: r["decision"] for r in lance_maintenance.compact_tables(store)}
    assert decisions == {"empty": "current", "rows": "current"}
    [report] = lance_maintenance.compact_tables(indexed)
    assert report["decision"] == "indexed: left to search_indexes"
    assert report["fragments_after"] == report["fragments_before"] >= 40


def test_the_corpus_job_compacts_last_and_queries_read_the_same(tiny_corpus, home, instance, monkeypatch):
    monkeypatch.setattr(lance_maintenance, "SMALL_FRAGMENTS", 2)  # the tiny corpus has four documents
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert report.corpus_index_ok is not False, report.corpus_error
    steps = sorted(instance.get_run_step_stats(report.corpus_run), key=lambda s: s.end_time or 0)
    assert steps[-1].step_key == "lance_compaction"
    metadata = instance.fetch_materializations(dg.AssetKey("lance_compaction"), limit=1).records[0] \
        .asset_materialization.metadata
    compacted = metadata["compacted"].value
    assert "statements" in compacted and metadata["failed"].value == []
    vectors, _ = stores(home)
    fragments = vectors.db.open_table("statements").stats()["fragment_stats"]["num_fragments"]
    assert fragments == 1
    # a document added after compaction is written and found as before
    (tiny_corpus / "delta.md").write_text("# Delta\n\nDelta Tankers chartered the vessel Nordlys Spirit.\n")
    assert ingest_folder(tiny_corpus, instance, home=str(home), progress=False).corpus_index_ok is not False
    docs = set(vectors.db.open_table("statements").to_arrow().column("doc_id").to_pylist())
    assert len(docs) == 5


def test_a_table_that_cannot_be_compacted_is_reported_and_the_others_still_are(tmp_path):
    store, _ = _fragmented(tmp_path)
    damaged = store.db.create_table("damaged", schema=SCHEMA)
    for d in range(40):
        damaged.add(pa.table({"id": [str(d)], "doc_id": [f"d{d}"], "value": [d]}, schema=SCHEMA))
    data_file = sorted((tmp_path / "lance" / "damaged.lance" / "data").iterdir())[3]
    data_file.unlink()  # a data file lost behind LanceDB's back
    before = _rows(store)
    reports = {r["table"]: r for r in lance_maintenance.compact_tables(store)}
    assert reports["damaged"]["decision"].startswith("failed: ") and "Not found" in reports["damaged"]["decision"]
    assert reports["rows"]["decision"] == "compacted" and _rows(store).equals(before)


def test_many_versions_too_young_to_prune_leave_a_table_alone_until_they_are_old_enough(tmp_path, monkeypatch):
    store = VectorStore(tmp_path / "lance")
    table = store.db.create_table("rows", schema=SCHEMA)
    table.add(pa.table({"id": ["a"], "doc_id": ["d"], "value": [0]}, schema=SCHEMA))
    for value in range(1, 12):  # one fragment, many versions: each update writes a version
        table.update(where="id = 'a'", values={"value": value})
    monkeypatch.setattr(lance_maintenance, "VERSIONS", 10)
    [young] = lance_maintenance.compact_tables(store)
    # rewriting it would prune nothing (every version is younger than KEEP_VERSIONS): not done on every run
    assert young["decision"] == "current" and young["versions_before"] >= 12 and young["fragments_before"] == 1
    monkeypatch.setattr(lance_maintenance, "KEEP_VERSIONS", timedelta(0))
    [old] = lance_maintenance.compact_tables(store)
    assert old["decision"] == "compacted" and old["versions_after"] < old["versions_before"]
    assert _rows(store)["value"].to_list() == [11]
