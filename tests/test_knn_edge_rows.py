"""The KNN state's edges file holds positions into the save's chunks, not chunk ids: it reads back as the
edges the update made, an edges file written before (chunk ids) still reads, and one that cannot be trusted
(of another save, or naming rows beyond the chunks) is refused rather than read as other chunks' edges."""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lexgraph.indexing import corpus_skeleton, corpus_state, knn_state, knn_update
from lexgraph.indexing.knn_edges import EdgeRows
from lexgraph.indexing.pagerank import pagerank, pagerank_of_positions
from tests.test_knn_persist import corpus, sorted_edges


def _saved(tmp_path, n: int = 120, mode: str = "exact") -> tuple[corpus_state.CorpusFiles, knn_update.KnnResult]:
    chunks, vectors, words = corpus(n, seed=3)
    files = corpus_state.CorpusFiles(tmp_path)
    return files, knn_update.update_knn(files, chunks, vectors, words, k=4, mode=mode)


def _rewrite(path, table, **metadata: bytes) -> None:
    """The file again with this table and its key-value metadata changed by `metadata` (bytes keys)."""
    listed = {k: v for k, v in (pq.read_metadata(path).metadata or {}).items() if k != b"ARROW:schema"}
    listed.update({k.encode(): v for k, v in metadata.items()})
    pq.write_table(table.replace_schema_metadata(listed), path)


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_the_saved_positions_read_back_as_the_edges_of_the_update(tmp_path, mode):
    files, result = _saved(tmp_path, mode=mode)
    assert pq.read_schema(files.edges).field("src").type == pa.int32()  # no chunk id per edge
    read = knn_state.read_edges(files)
    assert read.height == result.edge_rows.height > 0
    assert sorted_edges(read.frame()).equals(sorted_edges(result.edges))
    assert read.counts_by_kind() == {kind: int(n) for kind, n in
                                     result.edges.group_by("kind").len().iter_rows()}


def test_an_edges_file_of_chunk_ids_written_before_positions_reads_as_the_same_edges(tmp_path):
    files, result = _saved(tmp_path)
    generation = pq.read_metadata(files.edges).metadata[knn_state.KNN_GENERATION].decode()
    # as the code before wrote it: polars, the generation in the file's key-value metadata only
    result.edges.write_parquet(files.edges, compression="lz4", statistics=False,
                               metadata={knn_state.KNN_GENERATION.decode(): generation})
    read = knn_state.read_edges(files)
    assert sorted_edges(read.frame()).equals(sorted_edges(result.edges))
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    assert np.allclose(corpus_skeleton.compute_pagerank(files, chunks, read)["pagerank"].to_numpy(),
                       corpus_skeleton.compute_pagerank(files, chunks, result.edge_rows)["pagerank"].to_numpy())


def test_an_edges_file_of_another_save_is_not_read(tmp_path):
    files, _ = _saved(tmp_path)
    _rewrite(files.edges, pq.read_table(files.edges), **{knn_state.KNN_GENERATION.decode(): b"another"})
    assert knn_state.read_edges(files) is None
    files.edges.unlink()
    assert knn_state.read_edges(files) is None


def test_edges_naming_rows_beyond_the_saved_chunks_are_refused(tmp_path):
    files, _ = _saved(tmp_path)
    table = pq.read_table(files.edges)
    _rewrite(files.edges, table.set_column(0, "src", pa.array(np.full(table.num_rows, 10_000, dtype=np.int32))))
    with pytest.raises(ValueError, match="beyond the 120 chunks"):
        knn_state.read_edges(files)
    _rewrite(files.edges, table, **{knn_state.EDGE_KINDS_KEY.decode(): b"semantic,other"})
    with pytest.raises(ValueError, match="edge kinds"):
        knn_state.read_edges(files)


def test_pagerank_of_positions_is_pagerank_of_the_ids_they_stand_for():
    rng = np.random.default_rng(4)
    ids = np.array([f"n{i:03d}" for i in range(50)])
    rows, cols = rng.integers(0, 50, 300), rng.integers(0, 50, 300)
    weights = rng.random(300)
    assert np.array_equal(pagerank_of_positions(50, rows, cols, weights), pagerank(ids, ids[rows], ids[cols], weights))
    with pytest.raises(ValueError, match="positions of the 50 nodes"):
        pagerank_of_positions(50, np.array([0, 50]), np.array([1, 2]))


def test_pagerank_refuses_edges_of_other_chunks_and_edges_of_two_lists_do_not_join(tmp_path):
    files, result = _saved(tmp_path)
    chunks = pl.read_parquet(files.knn_corpus, columns=["chunk_id", "doc_id"])
    with pytest.raises(ValueError, match="not of these chunks"):
        corpus_skeleton.compute_pagerank(files, chunks.head(119), result.edge_rows)
    with pytest.raises(ValueError, match="not of these chunks"):
        corpus_skeleton.compute_pagerank(files, chunks.with_columns(pl.col("chunk_id").str.replace("^", "x")), result.edge_rows)
    rows = result.edge_rows
    other = EdgeRows(rows.chunk_ids[::-1].copy(), rows.src, rows.dst, rows.kind, rows.weight)
    with pytest.raises(ValueError, match="different chunk lists"):
        EdgeRows.concat([rows, other])


def test_chunk_pagerank_fails_with_the_reason_when_the_saved_edges_are_of_another_save(tiny_corpus, home, instance):
    import dagster as dg

    from assets.skeleton import chunk_pagerank
    from orchestration.definitions import build_definitions
    from orchestration.runner import ingest_folder
    from lexgraph.settings import Settings

    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    files = corpus_state.CorpusFiles(Settings.from_env(home=home).index_dir)
    _rewrite(files.edges, pq.read_table(files.edges), **{knn_state.KNN_GENERATION.decode(): b"another"})
    defs = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus))
    result = dg.materialize([chunk_pagerank], instance=instance, resources=defs.resources, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "saved edges are missing or of another save" in str(failure.step_failure_data.error.message)


def test_the_edges_touching_some_chunks_are_those_of_the_named_frame(tmp_path):
    _, result = _saved(tmp_path)
    named = result.edges
    picked = [named["src"][0], named["dst"][7], "no-such-chunk", named["src"][0]]
    expected = named.filter(pl.col("src").is_in(picked) | pl.col("dst").is_in(picked))
    assert 0 < expected.height < named.height
    assert sorted_edges(result.edge_rows.touching(picked).frame()).equals(sorted_edges(expected))
    assert result.edge_rows.touching(["no-such-chunk"]).height == 0
    assert result.edge_rows.touching([]).height == 0
