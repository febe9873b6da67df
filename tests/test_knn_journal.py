"""The HNSW index of a KNN save kept as a journal (the vectors added since the last whole index file): its
replay is the index a whole save would hold, a journal torn, foreign or without its base file is refused
and rebuilt with the reason said, and a save killed after its journal leaves the previous save in use."""
from __future__ import annotations

import shutil

import faiss
import numpy as np
import polars as pl
import pytest

from lexgraph.indexing import knn_state, knn_update
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_update import update_knn
from lexgraph.indexing.knn import semantic_knn
from tests.helpers import clustered_corpus

BASE = 700  # chunks of the first save; a journal holds at most BASE // ANN_JOURNAL_SHARE vectors


def corpus(n: int, seed: int = 3) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    return clustered_corpus(n, seed, doc_size=2, vocabulary=60)


def update(files: CorpusFiles, n: int, data, drop: tuple[str, ...] = ()) -> knn_update.KnnResult:
    chunks, vectors, words = data
    keep = ~chunks["doc_id"].is_in(list(drop)).to_numpy() & (np.arange(len(vectors)) < n)
    return update_knn(files, chunks.filter(pl.Series(keep)), vectors[keep], words, k=5, mode="approx")


def index_bytes(index) -> bytes:
    return faiss.serialize_index(index).tobytes()


def saved_index(files: CorpusFiles, generation: str):
    saved, reason = knn_state.load_knn(files)
    assert saved is not None and saved.generation == generation, reason
    ann, problem, base = knn_state.load_ann(files, saved, np.ones(saved.corpus.height, dtype=bool))
    assert problem is None, problem
    return ann, base


def test_a_journal_replays_to_the_index_a_whole_save_holds(tmp_path):
    data = corpus(BASE + 10)
    files = CorpusFiles(tmp_path)
    first = update(files, BASE, data)
    base_file = files.ann_index(first.generation)
    assert base_file.exists()
    # the graph the next add works on, kept in memory: restored from the whole file, then the two chunks added
    (index, faiss_ids), _ = saved_index(files, first.generation)
    saved, _ = knn_state.load_knn(files)
    chunks, vectors, _ = data
    in_memory = semantic_knn(chunks["chunk_id"].to_list()[:BASE], vectors[:BASE], k=5, mode="approx",
                             state=saved.lists["semantic"], ann_index=(index, faiss_ids))
    in_memory.add(chunks["chunk_id"].to_list()[BASE:BASE + 2], vectors[BASE:BASE + 2])

    second = update(files, BASE + 2, data)  # 2 new vectors: within the journal's share, no whole file written
    assert second.ann_index == "loaded"
    assert files.ann_journal(second.generation).exists() and not files.ann_index(second.generation).exists()
    assert sorted(p.name for p in tmp_path.glob("corpus/knn_hnsw*")) == sorted(
        [base_file.name, files.ann_journal(second.generation).name])
    (replayed, replayed_ids), base = saved_index(files, second.generation)
    assert base == knn_state.AnnBase(first.generation, BASE, (2,))
    assert index_bytes(replayed) == index_bytes(in_memory.ann_index()[0])
    assert np.array_equal(replayed_ids, in_memory.ann_index()[1])

    # a second journal extends the first (same base); removals only mark vectors dead
    third = update(files, BASE + 5, data, drop=("d000",))
    assert third.ann_index == "loaded" and third.semantic.removed == 2 and third.semantic.added == 3
    (_, _), base = saved_index(files, third.generation)
    assert base == knn_state.AnnBase(first.generation, BASE, (2, 3))
    assert sorted(p.name for p in tmp_path.glob("corpus/knn_hnsw*")) == sorted(
        [base_file.name, files.ann_journal(third.generation).name])
    # more than the journal's share since the whole file: written whole again, the base and journal deleted
    fourth = update(files, BASE + 10, data, drop=("d000",))
    assert fourth.ann_index == "loaded"
    assert [p.name for p in tmp_path.glob("corpus/knn_hnsw*")] == [files.ann_index(fourth.generation).name]
    # the same lists, after all that, as the same updates on a graph that never left memory
    in_memory.remove(["c0000", "c0001"])
    in_memory.add(chunks["chunk_id"].to_list()[BASE + 2:BASE + 10], vectors[BASE + 2:BASE + 10])
    assert fourth.edges.filter(pl.col("kind") == "semantic").sort("src", "dst").equals(
        in_memory.edges().sort("src", "dst"))


@pytest.mark.parametrize("damage", ["truncated", "other_save", "base_missing", "missing"])
def test_a_torn_or_foreign_journal_is_rebuilt_and_says_why(tmp_path, damage):
    data = corpus(BASE + 10, seed=4)
    files = CorpusFiles(tmp_path)
    first = update(files, BASE, data)
    older = update(files, BASE + 2, data)
    kept_old = tmp_path / "older.parquet"
    shutil.copy(files.ann_journal(older.generation), kept_old)
    latest = update(files, BASE + 4, data)
    journal = files.ann_journal(latest.generation)
    assert journal.exists()
    if damage == "truncated":
        journal.write_bytes(journal.read_bytes()[: journal.stat().st_size // 2])
    elif damage == "other_save":  # the previous save's journal under the current name
        shutil.copy(kept_old, journal)
    elif damage == "base_missing":
        files.ann_index(first.generation).unlink()
    else:
        journal.unlink()
    result = update(files, BASE + 6, data)
    expected = {"truncated": "unreadable", "other_save": "refused: a journal of another save",
                "base_missing": f"refused: its base index {files.ann_index(first.generation).name} is missing",
                "missing": "no saved index"}[damage]
    assert result.ann_index.startswith("rebuilt") and expected in result.ann_index, result.ann_index
    assert not result.rebuilt  # only the HNSW index: the lists were used
    clean = update(CorpusFiles(tmp_path / "clean"), BASE + 6, data)
    assert result.edges.filter(pl.col("kind") == "lexical").sort("src", "dst").equals(
        clean.edges.filter(pl.col("kind") == "lexical").sort("src", "dst"))
    # the rebuilt index was saved whole and the next process loads it (and saves an empty journal onto it)
    assert [p.name for p in tmp_path.glob("corpus/knn_hnsw*")] == [files.ann_index(result.generation).name]
    again = update(files, BASE + 6, data)
    assert again.ann_index == "loaded" and again.semantic.added == 0
    assert sorted(p.name for p in tmp_path.glob("corpus/knn_hnsw*")) == sorted(
        [files.ann_index(result.generation).name, files.ann_journal(again.generation).name])


def test_a_save_killed_after_its_journal_leaves_the_previous_save_in_use(tmp_path):
    data = corpus(BASE + 10, seed=6)
    files = CorpusFiles(tmp_path)
    update(files, BASE, data)
    previous = update(files, BASE + 2, data)  # a journal save
    before = {p.name: p.read_bytes() for p in files.root.glob("knn_*")}
    killed = update(files, BASE + 4, data)
    # as if killed right after the new journal was written: the other files are the previous save's
    for path in files.root.glob("knn_*"):
        if path.name not in before and path.name != files.ann_journal(killed.generation).name:
            path.unlink()
    for name, content in before.items():
        (files.root / name).write_bytes(content)
    result = update(files, BASE + 4, data)
    assert not result.rebuilt and result.ann_index == "loaded" and result.previous_generation == previous.generation
    assert result.semantic.added == 2
    assert result.edges.sort("src", "dst", "kind").equals(killed.edges.sort("src", "dst", "kind"))
    assert not files.ann_journal(killed.generation).exists()  # the orphan is deleted with the older saves


def _rewritten(path, table_of) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table_of(pq.read_table(path)), path)


@pytest.mark.parametrize("damage", ["no_base", "base_total", "dimension", "batches_down", "batch_gap"])
def test_a_journal_that_does_not_fit_its_base_is_refused_with_the_reason(tmp_path, damage):
    import pyarrow as pa

    data = corpus(BASE + 10, seed=7)
    files = CorpusFiles(tmp_path)
    update(files, BASE, data)
    update(files, BASE + 2, data)
    latest = update(files, BASE + 5, data)  # a journal of two batches (2 and 3 vectors)
    journal = files.ann_journal(latest.generation)
    listed = lambda t: t.schema.metadata  # noqa: E731
    if damage == "no_base":
        _rewritten(journal, lambda t: t.replace_schema_metadata(
            {k: v for k, v in listed(t).items() if k not in (knn_state.ANN_BASE, knn_state.ANN_BASE_TOTAL)}))
    elif damage == "base_total":
        _rewritten(journal, lambda t: t.replace_schema_metadata({**listed(t), knn_state.ANN_BASE_TOTAL: str(BASE + 1).encode()}))
    elif damage == "dimension":
        def narrower(t):
            flat = t.column("vector").combine_chunks().values.to_numpy().reshape(t.num_rows, -1)[:, :-1]
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
            return t.set_column(1, "vector", vectors).replace_schema_metadata(listed(t))
        _rewritten(journal, narrower)
    else:
        batches = {"batches_down": [1, 1, 0, 0, 0], "batch_gap": [0, 0, 2, 2, 2]}[damage]
        _rewritten(journal, lambda t: t.set_column(0, "batch", pa.array(batches, pa.int32())).replace_schema_metadata(
            listed(t)))
    result = update(files, BASE + 6, data)
    expected = {"no_base": "a journal without its base",
                "base_total": f"its base index holds {BASE} vectors, not {BASE + 1}",
                "dimension": "its vectors are not of the index's dimension",
                "batches_down": "its batches are out of order", "batch_gap": "its batches are out of order"}[damage]
    assert result.ann_index.startswith("rebuilt") and f"refused: {expected}" in result.ann_index, result.ann_index
    assert not result.rebuilt  # only the HNSW index was rebuilt: the lists were used


def test_a_journal_is_not_written_for_batches_the_index_does_not_hold(tmp_path):
    files = CorpusFiles(tmp_path)
    index = faiss.IndexHNSWFlat(4, 8)
    index.add(np.eye(4, dtype=np.float32))
    with pytest.raises(RuntimeError, match="the index holds 1 vectors beyond its base, its batches 2"):
        knn_state._write_journal(files, "g", index, knn_state.AnnBase("base", 3, (2,)))
    assert not files.ann_journal("g").exists()
