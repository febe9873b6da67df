"""The keyword index saved as a base file plus a delta of replaced, added and removed rows: an update
touches only its documents' keywords, and every sequence of updates, crashes and damaged files ends
in the index a clean build gives."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from lexgraph.indexing import corpus_keywords
from lexgraph.indexing.corpus_keywords import update_keyword_index, write_keyword_index
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.extract import keywords as kw
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from tests.helpers import add_keyword_stats, crash_keyword_update, load_chunk_nodes
from tests.conftest import GRAPH_SUFFIX

DIM = 8
WORDS = [f"word{i}" for i in range(40)]


def _write_doc(store: ExtractStore, doc: str, seed: int) -> None:
    """Keyword rows and stats of one synthetic document (a few of WORDS, in two chunks)."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(WORDS), size=int(rng.integers(3, 9)), replace=False)
    rows = [{"keyword": WORDS[w], "chunk_id": f"{doc}-c{j % 2}", "sentence_id": j % 3, "char_start": 0,
             "char_end": 5} for j, w in enumerate(picked)]
    occurrences = pl.DataFrame(rows, schema=kw.OCCURRENCE_SCHEMA)
    store.write("keywords", doc, occurrences)
    store.write("keyword_stats", doc, kw.keyword_stats(occurrences, rng.normal(size=(3, DIM))))


def _store(root: Path, docs: int) -> ExtractStore:
    store = ExtractStore(root / "extract")
    for d in range(docs):
        _write_doc(store, f"doc{d}", d)
    return store


def _clean(root: Path, store: ExtractStore, doc_ids: list[str]) -> pl.DataFrame:
    return update_keyword_index(CorpusFiles(root), store, doc_ids, DIM).index


@pytest.fixture
def deltas(monkeypatch):
    """Deltas for any base size, folded only past half the base."""
    monkeypatch.setattr(corpus_keywords, "KEYWORD_DELTA_MIN_BASE", 0)
    monkeypatch.setattr(corpus_keywords, "KEYWORD_DELTA_SHARE", 0.5)


def _delta(files: CorpusFiles) -> Path:
    return files.root / "keyword_index.delta.arrow"


def _metadata(path: Path) -> dict:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).schema.metadata or {}


def test_one_document_added_writes_a_delta_and_leaves_the_base_alone(tmp_path, deltas):
    store = _store(tmp_path, 6)
    files = CorpusFiles(tmp_path / "index")
    update_keyword_index(files, store, [f"doc{d}" for d in range(5)], DIM)
    assert files.keyword_index.exists() and not _delta(files).exists()  # the first build is a base
    base_bytes = files.keyword_index.read_bytes()
    result = update_keyword_index(files, store, [f"doc{d}" for d in range(6)], DIM)
    assert result.added == ["doc5"] and _delta(files).exists()
    assert files.keyword_index.read_bytes() == base_bytes
    assert _metadata(_delta(files))[corpus_keywords.KEYWORD_DELTA_OF] == _metadata(files.keyword_index)[corpus_keywords.KEYWORD_BASE]
    clean = _clean(tmp_path / "clean", store, [f"doc{d}" for d in range(6)])
    assert result.index.equals(clean) and result.keyword_count == clean.height
    again = update_keyword_index(files, store, [f"doc{d}" for d in range(6)], DIM)  # read back: base + delta
    assert (again.added, again.updated, again.removed, again.rebuild_reason) == ([], [], [], None)
    assert again.index.equals(clean) and again.previous_generation == result.generation


def test_any_sequence_of_updates_equals_a_clean_build(tmp_path, deltas):
    """Adds, changes and removals through deltas and folds: each step's index, its count, the keywords
    that appeared, went or moved are those of comparing whole indexes."""
    store = _store(tmp_path, 8)
    files = CorpusFiles(tmp_path / "index")
    rng = np.random.default_rng(11)
    present: list[str] = []
    previous = kw.empty_keyword_index(DIM)
    folds = deltas_seen = 0
    for step in range(30):
        doc = f"doc{int(rng.integers(0, 8))}"
        if doc in present and rng.random() < 0.4:
            present.remove(doc)
        elif doc in present:
            _write_doc(store, doc, 100 + step)  # changed
        else:
            present.append(doc)
        result = update_keyword_index(files, store, sorted(present), DIM)
        clean = _clean(tmp_path / f"clean{step}", store, sorted(present))
        assert result.index.equals(clean), step
        assert result.keyword_count == clean.height and result.previous_keyword_count == previous.height
        before, after = set(previous["keyword"]), set(clean["keyword"])
        assert (result.keywords_appeared, result.keywords_gone) == (sorted(after - before), sorted(before - after))
        moved = clean.join(previous, on="keyword", how="left", suffix="_b").filter(
            pl.col("sentence_count_b").is_null() | (pl.col("sentence_count") != pl.col("sentence_count_b"))
            | (pl.col("vector_sum") != pl.col("vector_sum_b")))
        assert result.touched == sorted(moved["keyword"].to_list()), step
        assert result.touched_rows.equals(clean.filter(pl.col("keyword").is_in(result.touched))), step
        deltas_seen += _delta(files).exists()
        folds += not _delta(files).exists()
        previous = clean
    assert deltas_seen and folds  # both paths were taken


@pytest.mark.subprocess
def test_update_killed_before_its_delta_is_written_is_redone_exactly_once(tmp_path, deltas):
    store = _store(tmp_path, 7)
    files = CorpusFiles(tmp_path / "index")
    update_keyword_index(files, store, [f"doc{d}" for d in range(5)], DIM)
    update_keyword_index(files, store, [f"doc{d}" for d in range(6)], DIM)  # a delta
    assert _delta(files).exists()
    _write_doc(store, "doc1", 99)
    final = ["doc0", "doc1", "doc2", "doc4", "doc5", "doc6"]  # doc1 changed, doc3 gone, doc6 new
    crashed = crash_keyword_update(tmp_path, final, setup="corpus_keywords.KEYWORD_DELTA_MIN_BASE = 0; corpus_keywords.KEYWORD_DELTA_SHARE = 0.5")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    result = update_keyword_index(files, store, final, DIM)
    assert (result.added, result.updated, result.removed) == (["doc6"], ["doc1"], ["doc3"])
    assert result.index.equals(_clean(tmp_path / "clean", store, final))
    again = update_keyword_index(files, store, final, DIM)
    assert (again.added, again.updated, again.removed) == ([], [], [])
    assert sorted(p.name.split(".")[0] for p in files.keyword_contrib.iterdir()) == final


def test_a_delta_left_by_a_fold_killed_before_deleting_it_is_ignored(tmp_path, deltas, monkeypatch):
    """A fold writes the new base, then deletes the delta: a delta naming the base before is stale."""
    store = _store(tmp_path, 7)
    files = CorpusFiles(tmp_path / "index")
    update_keyword_index(files, store, [f"doc{d}" for d in range(5)], DIM)
    update_keyword_index(files, store, [f"doc{d}" for d in range(6)], DIM)
    stale = _delta(files).read_bytes()
    monkeypatch.setattr(corpus_keywords, "KEYWORD_DELTA_SHARE", 0.0)  # the next update folds
    folded = update_keyword_index(files, store, [f"doc{d}" for d in range(7)], DIM)
    assert folded.added == ["doc6"] and not _delta(files).exists()
    _delta(files).write_bytes(stale)  # as if killed between the base's replace and the delta's unlink
    result = update_keyword_index(files, store, [f"doc{d}" for d in range(7)], DIM)
    assert (result.added, result.updated, result.removed, result.rebuild_reason) == ([], [], [], None)
    assert result.index.equals(_clean(tmp_path / "clean", store, [f"doc{d}" for d in range(7)]))


@pytest.mark.parametrize("damage", ["torn", "truncated", "other_width", "duplicate", "no_list"])
def test_a_damaged_delta_is_rebuilt_with_a_reason(tmp_path, deltas, damage):
    store = _store(tmp_path, 6)
    files = CorpusFiles(tmp_path / "index")
    docs = [f"doc{d}" for d in range(6)]
    update_keyword_index(files, store, docs[:5], DIM)
    update_keyword_index(files, store, docs, DIM)
    path = _delta(files)
    base_id = _metadata(files.keyword_index)[corpus_keywords.KEYWORD_BASE].decode()
    listed = {corpus_keywords.KEYWORD_CONTRIBUTIONS: _metadata(path)[corpus_keywords.KEYWORD_CONTRIBUTIONS],
              corpus_keywords.KEYWORD_LINKS: _metadata(path)[corpus_keywords.KEYWORD_LINKS], corpus_keywords.KEYWORD_DELTA_OF: base_id.encode()}
    if damage == "torn":
        path.write_bytes(b"ARROW1 torn")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "other_width":
        rows = kw._stats_frame(np.array(["word0"]), np.ones((1, DIM + 1)), np.array([1]))
        corpus_keywords._arrow_write(path, rows, listed)
    elif damage == "duplicate":
        rows = pl.read_ipc(path)
        corpus_keywords._arrow_write(path, pl.concat([rows, rows]), listed)
    else:
        corpus_keywords._arrow_write(path, pl.read_ipc(path), {corpus_keywords.KEYWORD_DELTA_OF: base_id.encode()})
    result = update_keyword_index(files, store, docs, DIM)
    assert result.rebuild_reason is not None and "delta" in result.rebuild_reason
    assert result.added == docs and result.previous_generation is None
    assert result.index.equals(_clean(tmp_path / "clean", store, docs))
    assert not path.exists()  # the rebuild is a new base


def test_a_delta_without_its_base_is_rebuilt_with_a_reason(tmp_path, deltas):
    store = _store(tmp_path, 6)
    files = CorpusFiles(tmp_path / "index")
    docs = [f"doc{d}" for d in range(6)]
    update_keyword_index(files, store, docs[:5], DIM)
    update_keyword_index(files, store, docs, DIM)
    files.keyword_index.unlink()
    result = update_keyword_index(files, store, docs, DIM)
    assert result.rebuild_reason is not None and "missing" in result.rebuild_reason and result.added == docs
    assert result.index.equals(_clean(tmp_path / "clean", store, docs)) and not _delta(files).exists()


def test_a_base_replaced_by_another_is_not_extended_by_the_old_delta(tmp_path, deltas):
    """A base from elsewhere (a restored backup, say) with the delta of the base before: the delta names
    another base, so the restored base is read with its own list and the update catches up from it."""
    store = _store(tmp_path, 7)
    files = CorpusFiles(tmp_path / "index")
    docs = [f"doc{d}" for d in range(7)]
    update_keyword_index(files, store, docs[:4], DIM)
    update_keyword_index(files, store, docs[:5], DIM)
    assert _delta(files).exists()
    other = CorpusFiles(tmp_path / "other")
    update_keyword_index(other, store, docs[:4], DIM)  # the same rows under another base id
    files.keyword_index.write_bytes(other.keyword_index.read_bytes())
    result = update_keyword_index(files, store, docs, DIM)
    assert result.rebuild_reason is None and result.added == ["doc4", "doc5", "doc6"]
    assert result.index.equals(_clean(tmp_path / "clean", store, docs))


def test_an_arrow_index_from_before_deltas_is_read_then_folded(tmp_path, deltas):
    """An index written before deltas (no base id) is trusted with its list; the update folds it into a
    base with an id, after which updates write deltas."""
    store = _store(tmp_path, 7)
    files = CorpusFiles(tmp_path / "index")
    docs = [f"doc{d}" for d in range(7)]
    built = update_keyword_index(files, store, docs[:5], DIM)
    listed = _metadata(files.keyword_index)
    corpus_keywords._arrow_write(files.keyword_index, built.index, {k: v for k, v in listed.items() if k != corpus_keywords.KEYWORD_BASE})
    result = update_keyword_index(files, store, docs[:6], DIM)
    assert result.added == ["doc5"] and result.rebuild_reason is None
    assert corpus_keywords.KEYWORD_BASE in _metadata(files.keyword_index) and not _delta(files).exists()
    assert result.index.equals(_clean(tmp_path / "clean6", store, docs[:6]))
    later = update_keyword_index(files, store, docs, DIM)
    assert later.added == ["doc6"] and _delta(files).exists()
    assert later.index.equals(_clean(tmp_path / "clean7", store, docs))


def test_load_keyword_index_merges_base_and_delta(tmp_path, deltas):
    """_load_keyword_index (what benchmarks/settle_index.py reads) gives the whole index."""
    store = _store(tmp_path, 6)
    files = CorpusFiles(tmp_path / "index")
    docs = [f"doc{d}" for d in range(6)]
    update_keyword_index(files, store, docs[:5], DIM)
    result = update_keyword_index(files, store, docs, DIM)
    index, included, links = corpus_keywords._load_keyword_index(files, DIM)
    assert _delta(files).exists() and index.equals(result.index) and sorted(included) == docs
    assert links == result.link_counts


def test_updated_rows_mark_keywords_that_go_and_refuse_bad_subtractions():
    occurrences = pl.DataFrame([{"keyword": w, "chunk_id": "c", "sentence_id": 0, "char_start": 0, "char_end": 1}
                                for w in ("a", "b")], schema=kw.OCCURRENCE_SCHEMA)
    doc = kw.keyword_stats(occurrences, np.ones((1, 3)))
    index = add_keyword_stats(kw.empty_keyword_index(3), doc)
    rows = kw.updated_keyword_rows(index, doc, -1)
    assert rows["keyword"].to_list() == ["a", "b"] and rows["sentence_count"].to_list() == [0, 0]
    assert not np.any(rows["vector_sum"].to_numpy())
    assert kw.apply_keyword_rows(index, rows).height == 0
    with pytest.raises(ValueError, match="not in the index"):
        kw.updated_keyword_rows(kw.empty_keyword_index(3), doc, -1)
    with pytest.raises(ValueError, match="twice"):
        kw.updated_keyword_rows(pl.concat([index, index]), doc, +1)


def _keyword_stores(root: Path, store: ExtractStore, docs: int) -> tuple[GraphStore, VectorStore]:
    """A real Kùzu graph holding the documents' chunks, and a LanceDB folder."""
    graph = GraphStore(root / f"graph{GRAPH_SUFFIX}", writable=True)
    chunk_ids = sorted({c for d in range(docs) for c in store.read("keywords", f"doc{d}")["chunk_id"].to_list()})
    load_chunk_nodes(graph, pl.DataFrame({"chunk_id": chunk_ids, "doc_id": [c.split("-")[0] for c in chunk_ids]}))
    return graph, VectorStore(str(root / "lance"))


def _held(graph: GraphStore, vectors: VectorStore) -> tuple[set, list, dict]:
    keywords = graph.query("MATCH (k:Keyword) RETURN k.id AS id")
    links = graph.query("MATCH (k:Keyword)-[r:KEYWORD_IN]->(c:Chunk) RETURN k.id, c.id, r.occurrences")
    table = pl.from_arrow(vectors.db.open_table("keywords").to_arrow())
    return (set(keywords["id"].to_list()) if keywords.height else set(), sorted(links.iter_rows()),
            {k: (n, tuple(v)) for k, n, v in zip(table["keyword"], table["sentence_count"], table["vector"])})


@pytest.mark.slow  # five Kùzu graphs and LanceDB folders built
def test_stores_written_from_deltas_equal_a_full_write(tmp_path, deltas, monkeypatch):
    """Keyword nodes, links and vectors written as diffs from delta updates equal a whole rewrite."""
    monkeypatch.setattr(corpus_keywords, "rewrite_is_cheaper", lambda changed, total: False)
    store = _store(tmp_path, 8)
    files = CorpusFiles(tmp_path / "index")
    graph, vectors = _keyword_stores(tmp_path / "diffs", store, 8)
    present = ["doc0", "doc1", "doc2", "doc3"]
    write_keyword_index(files, store, graph, vectors, update_keyword_index(files, store, present, DIM))
    steps = [["doc0", "doc1", "doc2", "doc3", "doc4"], ["doc0", "doc2", "doc3", "doc4"],
             ["doc0", "doc2", "doc3", "doc4", "doc5", "doc6"], ["doc2", "doc3", "doc4", "doc5", "doc6", "doc7"]]
    for step, docs in enumerate(steps):
        if step == 2:
            _write_doc(store, "doc2", 77)
        result = update_keyword_index(files, store, docs, DIM)
        figures = write_keyword_index(files, store, graph, vectors, result)
        assert figures["keywords_rewritten"] is False, figures
        full_graph, full_vectors = _keyword_stores(tmp_path / f"whole{step}", store, 8)
        full_graph.replace_keywords(result.index["keyword"], corpus_keywords.keyword_chunk_links(store, docs))
        full_vectors.replace_keywords(kw.keyword_vectors(result.index))
        assert _held(graph, vectors) == _held(full_graph, full_vectors)
        full_graph.close()
    graph.close()
