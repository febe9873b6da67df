"""The chunk KNN graph's inputs read ahead while an ingest's documents run (lexgraph.indexing.corpus_prefetch):
used only while they are still true, and an update that used them ends as a build from nothing."""
from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pytest

from lexgraph.indexing import corpus_prefetch
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_state import load_knn
from lexgraph.settings import Settings
from lexgraph.storage.vector_store import VectorStore
from orchestration.runner import ingest_folder
from tests.test_corpus_diff_stores import DOCS, assert_same_as_a_build_from_nothing

FIXTURE_MARKS = {"built": ("ingest",)}  # marks by fixture (tests/conftest.py)


def _knn_metadata(instance) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey("chunk_knn_graph"))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """DOCS ingested with their corpus index: a saved KNN state to read ahead."""
    root = tmp_path_factory.mktemp("prefetch")
    inbox, home = root / "inbox", root / "home"
    inbox.mkdir()
    for name, text in DOCS.items():
        (inbox / name).write_text(text)
    with dg.DagsterInstance.ephemeral() as instance:
        report = ingest_folder(inbox, instance, home=str(home), progress=False)
    assert report.corpus_index_ok and not report.failed
    return root


@pytest.fixture
def index(built, tmp_path):
    """A copy of the built index: its files, its vector store and its catalog."""
    shutil.copytree(built, tmp_path / "copy")
    home = tmp_path / "copy" / "home"
    settings = Settings.from_env(home=home)
    store = VectorStore(settings.lance_uri)
    yield CorpusFiles(settings.index_dir), store, store.indexed_hashes()
    corpus_prefetch.discard(CorpusFiles(settings.index_dir))


def _by_chunk(chunks: pl.DataFrame, vectors: np.ndarray) -> dict[str, tuple]:
    assert chunks.height == len(vectors)
    return {c: tuple(v) for c, v in zip(chunks["chunk_id"], vectors)}


def _re_embed(store: VectorStore, doc_id: str) -> dict[str, tuple]:
    """Write a document's chunk rows again with other unit vectors (as another model would), -> the new ones."""
    quoted = doc_id.replace("'", "''")
    rows = pl.from_arrow(store.db.open_table("chunks").search().where(f"doc_id = '{quoted}'").limit(None).to_arrow())
    moved = np.roll(np.stack(rows["vector"].to_numpy()), 1, axis=1).astype(np.float32)
    store.delete_rows("chunks", "doc_id", [doc_id])
    store.add_rows("chunks", rows.with_columns(pl.Series("vector", moved, dtype=rows["vector"].dtype)))
    return {c: tuple(v) for c, v in zip(rows["chunk_id"], moved)}


def test_an_ingest_reads_ahead_and_its_update_ends_as_a_build_from_nothing(built, tmp_path, monkeypatch):
    monkeypatch.setenv("LEXGRAPH_KNN_K", "2")  # fewer neighbours than chunks: the add displaces edges
    shutil.copytree(built, tmp_path / "copy")
    inbox, home = tmp_path / "copy" / "inbox", tmp_path / "copy" / "home"
    with dg.DagsterInstance.ephemeral() as instance:
        ingest_folder(inbox, instance, home=str(home), progress=False)  # k=2: rebuilt, nothing read ahead
        assert _knn_metadata(instance)["read_ahead"] == "none"
        (inbox / "epsilon.md").write_text("# Epsilon\n\nEpsilon Freight leased two vessels from Alpha Shipping "
                                          "in Bergen under contract C-7.\n")
        (inbox / "gamma.md").write_text("# Gamma\n\nThe arbitration over contract C-1 awarded EUR 3 million to "
                                        "Bolt Engines in Kiel.\n")
        report = ingest_folder(inbox, instance, home=str(home), progress=False)
        assert report.new == 1 and report.changed == 1 and report.corpus_index_ok
        meta = _knn_metadata(instance)
        # alpha, beta and delta untouched: theirs came from the read ahead, gamma's and epsilon's were read now
        assert meta["read_ahead"] == "saved state used; vectors of 3 of 5 documents used"
        assert meta["rebuilt"] is False and meta["semantic_update"]["added"] == 2
        assert not corpus_prefetch._reads  # dropped when the ingest ended
        assert_same_as_a_build_from_nothing(home, inbox, tmp_path, instance)


def test_what_changed_after_the_read_began_is_read_again(index):
    files, store, catalog = index
    alpha, beta = sorted(catalog)[:2]
    assert corpus_prefetch.start(files, store, catalog, touched={beta})
    corpus_prefetch._reads[corpus_prefetch._key(files)].done.wait()
    new_alpha, new_beta = _re_embed(store, alpha), _re_embed(store, beta)
    # alpha's content hash moved since the read began; beta was the ingest's own document
    now = {**catalog, alpha: "changed"}
    inputs = corpus_prefetch.knn_inputs(files, store, now)
    assert inputs.read_ahead == f"saved state used; vectors of {len(catalog) - 2} of {len(catalog)} documents used"
    vectors = _by_chunk(inputs.chunks, inputs.vectors)
    assert vectors == _by_chunk(*corpus_prefetch.catalog_chunks(store, now))
    assert all(vectors[c] == v for c, v in {**new_alpha, **new_beta}.items())
    assert inputs.loaded[0].generation == load_knn(files)[0].generation


def test_a_state_file_replaced_after_the_read_is_read_again(index):
    files, store, catalog = index
    assert corpus_prefetch.start(files, store, catalog, touched=set())
    corpus_prefetch._reads[corpus_prefetch._key(files)].done.wait()
    copy = files.knn_state.with_suffix(".copy")
    shutil.copy(files.knn_state, copy)
    copy.replace(files.knn_state)  # the same bytes in a new file, as every save writes one
    inputs = corpus_prefetch.knn_inputs(files, store, catalog)
    assert inputs.read_ahead == (f"saved state read again (its files changed); vectors of {len(catalog)} of "
                                 f"{len(catalog)} documents used")
    assert inputs.loaded[0].generation == load_knn(files)[0].generation
    assert _by_chunk(inputs.chunks, inputs.vectors) == _by_chunk(*corpus_prefetch.catalog_chunks(store, catalog))


def test_a_damaged_state_read_ahead_is_refused_as_a_read_now_refuses_it(index):
    files, store, catalog = index
    files.knn_state.write_bytes(files.knn_state.read_bytes()[:100])  # truncated
    assert corpus_prefetch.start(files, store, catalog, touched=set())
    inputs = corpus_prefetch.knn_inputs(files, store, catalog)
    saved, reason = inputs.loaded
    assert saved is None and (saved, reason) == load_knn(files) and "knn_state.parquet" in reason
    assert _by_chunk(inputs.chunks, inputs.vectors) == _by_chunk(*corpus_prefetch.catalog_chunks(store, catalog))


def test_no_read_ahead_without_a_saved_state_or_an_untouched_document(index):
    files, store, catalog = index
    assert not corpus_prefetch.start(files, store, catalog, touched=set(catalog))  # every document is the ingest's
    inputs = corpus_prefetch.knn_inputs(files, store, catalog)
    assert inputs.read_ahead == "none"
    shutil.rmtree(files.root)
    assert not corpus_prefetch.start(files, store, catalog, touched=set())
    with corpus_prefetch.reading_ahead(files, store, catalog, set()):
        assert not corpus_prefetch._reads
