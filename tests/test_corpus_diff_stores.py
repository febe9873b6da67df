"""The corpus update writes diffs to Kùzu and LanceDB: documents added, changed, removed and reloaded one
at a time leave the same stores as a build from nothing, and the metadata counts what really changed."""
from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import polars as pl

from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.settings import Settings
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from orchestration.definitions import build_definitions
from orchestration.runner import ingest_folder

DOCS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n## Terms\n\n"
                "Delivery of two engines is due in May 2024 at Bergen harbour.\n",
    "beta.txt": "Bolt Engines is run by Dana Frost.\n\nIts plant in Kiel builds marine engines.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million to Alpha Shipping.\n",
    "delta.md": "# Delta\n\nDana Frost met the Bergen harbour master about berth fees.\n",
}


def snapshot(home: Path) -> dict:
    """Kùzu's SIMILAR, Keyword and KEYWORD_IN and LanceDB's keyword rows, keyed for comparison."""
    settings = Settings.from_env(home=home)
    graph = GraphStore(settings.graph_path)
    try:
        similar = graph.similarity_edges()
        keywords = graph.query("MATCH (k:Keyword) RETURN k.id")
        links = graph.query("MATCH (k:Keyword)-[r:KEYWORD_IN]->(c:Chunk) RETURN k.id, c.id, r.occurrences")
    finally:
        graph.close()
    lance = pl.from_arrow(VectorStore(settings.lance_uri).db.open_table("keywords").to_arrow())
    return {
        "similar": {(a, b, k): w for a, b, k, w in similar.iter_rows()},
        "keywords": set(keywords[keywords.columns[0]].to_list()) if keywords.height else set(),
        "links": [tuple(row) for row in links.iter_rows()],
        "lance": {kw: (n, tuple(v)) for kw, n, v in zip(lance["keyword"], lance["sentence_count"], lance["vector"])},
    }


def run_corpus(home: Path, inbox: Path, instance) -> dict:
    """The two corpus assets that write these stores, and their metadata."""
    from assets.skeleton import chunk_knn_graph, keyword_index

    defs = build_definitions(Settings.from_env(home=home, inbox=inbox))
    result = dg.materialize([chunk_knn_graph, keyword_index], instance=instance, resources=defs.resources)
    assert result.success
    metadata = {}
    for event in result.get_asset_materialization_events():
        metadata.update({k: v.value for k, v in event.materialization.metadata.items()})
    return metadata


def assert_metadata_is_true(before: dict, after: dict, meta: dict) -> None:
    old, new = before["similar"], after["similar"]
    assert meta["similar_edges_rewritten"] is False and meta["keywords_rewritten"] is False
    assert meta["similar_edges_added"] == len(new.keys() - old.keys())
    assert meta["similar_edges_removed"] == len(old.keys() - new.keys())
    assert meta["similar_edges_updated"] == sum(old[e] != new[e] for e in old.keys() & new.keys())
    assert meta["keywords_added"] == len(after["keywords"] - before["keywords"])
    assert meta["keywords_removed"] == len(before["keywords"] - after["keywords"])
    assert len(after["links"]) == len(set(after["links"]))  # no link written twice
    assert meta["keyword_links_written"] == len(set(after["links"]) - set(before["links"]))
    assert meta["keyword_links_deleted"] == len(set(before["links"]) - set(after["links"]))
    lance_old, lance_new = before["lance"], after["lance"]
    assert meta["keyword_vectors_written"] == sum(lance_old.get(k) != v for k, v in lance_new.items())
    assert meta["keyword_vectors_deleted"] == len(lance_old.keys() - lance_new.keys())


def assert_same_as_a_build_from_nothing(home: Path, inbox: Path, tmp_path: Path, instance) -> None:
    """The same extracts and vectors with the corpus state deleted: the corpus update builds it whole."""
    fresh = tmp_path / "fresh"
    shutil.copytree(home, fresh)
    files = CorpusFiles(Settings.from_env(home=fresh).index_dir)
    shutil.rmtree(files.root)
    graph = GraphStore(Settings.from_env(home=fresh).graph_path, writable=True)
    try:
        graph._recreate("SIMILAR")
        graph._recreate("KEYWORD_IN", "Keyword")
    finally:
        graph.close()
    VectorStore(Settings.from_env(home=fresh).lance_uri).db.drop_table("keywords")
    meta = run_corpus(fresh, inbox, instance)
    assert meta["rebuilt"] is True and meta["similar_edges_rewritten"] and meta["keywords_rewritten"]
    actual, clean = snapshot(home), snapshot(fresh)
    assert actual["similar"] == clean["similar"]
    assert actual["keywords"] == clean["keywords"]
    assert sorted(actual["links"]) == sorted(clean["links"])
    assert actual["lance"] == clean["lance"]


def test_one_document_at_a_time_writes_diffs_that_end_as_a_full_build(tmp_path, instance, monkeypatch):
    monkeypatch.setenv("LEXGRAPH_KNN_K", "2")  # fewer neighbours than chunks: adds displace edges
    inbox, home = tmp_path / "inbox", tmp_path / "home"
    inbox.mkdir()
    for name, text in DOCS.items():
        (inbox / name).write_text(text)
    ingest_folder(inbox, instance, home=str(home), progress=False, corpus=False)
    meta = run_corpus(home, inbox, instance)
    assert meta["rebuilt"] is True and meta["similar_edges_rewritten"] and meta["keywords_rewritten"]

    steps = [
        ("add", lambda: (inbox / "epsilon.md").write_text(
            "# Epsilon\n\nEpsilon Freight leased two vessels from Alpha Shipping in Bergen under contract C-7.\n")),
        ("change", lambda: (inbox / "gamma.md").write_text(
            "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 3 million to Bolt Engines in Kiel.\n")),
        ("remove", lambda: (inbox / "beta.txt").unlink()),
    ]
    for step, edit in steps:
        edit()
        ingest_folder(inbox, instance, home=str(home), progress=False, prune=True, corpus=False)
        before = snapshot(home)
        meta = run_corpus(home, inbox, instance)
        assert_metadata_is_true(before, snapshot(home), meta)
        assert meta["keyword_docs_read"] == (0 if step == "remove" else 1), step
        assert meta["words_read_chunks"] == (0 if step == "remove" else meta["semantic_update"]["added"]), step
        assert meta["ann_index"] == "exact"

    # A forced reload of an unchanged document deletes its chunks with their edges and links: found and
    # written again, without rewriting everything.
    defs = build_definitions(Settings.from_env(home=home, inbox=inbox))
    alpha = next(k for k in instance.get_dynamic_partitions("documents") if k.startswith("alpha"))
    defs.resolve_job_def("ingest_documents").execute_in_process(instance=instance, partition_key=alpha)
    before = snapshot(home)
    meta = run_corpus(home, inbox, instance)
    assert_metadata_is_true(before, snapshot(home), meta)
    assert meta["similar_edges_restored"] > 0 and meta["similar_edges_rewritten"] is False

    # Bad inputs. The graph holds an edge the saved set does not know (a write by another process, say),
    # and a document's keyword links are gone although its keyword files did not change.
    graph = GraphStore(Settings.from_env(home=home).graph_path, writable=True)
    try:
        chunk = graph.query("MATCH (c:Chunk) RETURN c.id AS id LIMIT 1")["id"][0]
        graph.add_similarity_edges(pl.DataFrame({"src": [chunk], "dst": [chunk], "kind": ["semantic"], "weight": [1.0]}))
        graph.delete_keyword_links([alpha])
    finally:
        graph.close()
    meta = run_corpus(home, inbox, instance)
    assert meta["similar_edges_mismatch"] is True and meta["similar_edges_rewritten"] is True
    assert meta["keywords_rewritten"] is False and meta["keyword_docs_restored"] == 1 and meta["keyword_docs_read"] == 1
    # The KNN state is gone while the graph has its edges, and the keyword index file is torn.
    files = CorpusFiles(Settings.from_env(home=home).index_dir)
    files.knn_state.unlink()
    files.keyword_index.write_bytes(b"PAR1 torn")
    meta = run_corpus(home, inbox, instance)
    assert meta["rebuilt"] is True and meta["similar_edges_rewritten"] is True and meta["keywords_rewritten"] is True

    assert_same_as_a_build_from_nothing(home, inbox, tmp_path, instance)


def test_every_document_changed_rewrites_the_keyword_graph_instead_of_diffing(tmp_path, instance, monkeypatch):
    """A copied index home (`cp -r` gives every stats file a new time) marks every document changed; deleting
    their links edge by edge in Kùzu ran for over 10 minutes at 100k chunks, so the stores are written whole."""
    import os

    from lexgraph.indexing import lexical_diff
    from lexgraph.indexing.pipeline import KEYWORD_STATS
    from lexgraph.storage.extract_store import ExtractStore

    monkeypatch.setattr(lexical_diff, "REBUILD_MIN_DOCUMENTS", 2)  # the corpus here is tiny
    inbox, home = tmp_path / "inbox", tmp_path / "home"
    inbox.mkdir()
    for name, text in DOCS.items():
        (inbox / name).write_text(text)
    ingest_folder(inbox, instance, home=str(home), progress=False, corpus=False)
    run_corpus(home, inbox, instance)
    before = snapshot(home)
    store = ExtractStore(Settings.from_env(home=home).extract_dir)
    for doc_id in store.doc_ids(KEYWORD_STATS):
        path = store.path(KEYWORD_STATS, doc_id)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    meta = run_corpus(home, inbox, instance)
    assert meta["keywords_rewritten"] is True and meta["keyword_docs_read"] == len(DOCS)
    after = snapshot(home)
    assert sorted(after.pop("links")) == sorted(before.pop("links")) and after == before
    # one document changed of four is still a diff
    (inbox / "delta.md").write_text("# Delta\n\nDana Frost met the Kiel harbour master about berth fees.\n")
    ingest_folder(inbox, instance, home=str(home), progress=False, corpus=False)
    meta = run_corpus(home, inbox, instance)
    assert meta["keywords_rewritten"] is False and meta["keyword_docs_read"] == 1
    assert_same_as_a_build_from_nothing(home, inbox, tmp_path, instance)
