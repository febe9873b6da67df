"""The lexical graph written as a difference: documents added, changed and removed one at a time leave the
same Kùzu nodes and edges and the same LanceDB statement and entity rows as a build from nothing; damaged
inputs and a damaged saved state fall back safely. Real Kùzu, real LanceDB, the offline NLP extractor."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from lexgraph.indexing import lexical, lexical_extraction, lexical_tables
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.pipeline import (STATEMENTS, chunk_documents, embed_documents, load_graph, load_sources,
                                     purge_documents)
from lexgraph.extract.nlp_extractor import NLPExtractor
from lexgraph.ids import document_id
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import LEXICAL_NODES, LEXICAL_RELS, GraphStore
from lexgraph.storage.vector_store import VectorStore

FIXTURE_MARKS = {"index": ("ingest",)}  # every stage of an ingest, without Dagster; marks by fixture (tests/conftest.py)

DOCS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n## Terms\n\n"
                "Delivery of two engines is due in May 2024 at Bergen harbour.\n",
    "beta.txt": "Bolt Engines is run by Dana Frost.\n\nIts plant in Kiel builds marine engines for Alpha Shipping.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million to Alpha Shipping.\n",
}


class Index:
    """One index folder driven through the engine's stages (no Dagster: these tests are about the stores)."""

    def __init__(self, home: Path, inbox: Path, embedder):
        self.settings = Settings.from_env(home=home, inbox=inbox)
        self.inbox, self.embedder = inbox, embedder
        self.store, self.vectors = ExtractStore(self.settings.extract_dir), VectorStore(self.settings.lance_uri)
        self.state = CorpusFiles(self.settings.index_dir).lexical_state

    def put(self, name: str, text: str) -> str:
        """Write (or change) a document and take it through every per-document stage."""
        (self.inbox / name).write_text(text)
        doc_id = document_id(name)
        sources = load_sources({doc_id: self.inbox / name}, self.inbox, self.store, self.settings.index_version)
        chunks = chunk_documents(sources.done, self.store, self.embedder, self.settings.chunk_tokens)
        embed_documents(chunks.done, self.store, self.embedder, self.vectors)
        with GraphStore.writer(self.settings.graph_path) as graph:
            load_graph(chunks.done, self.store, graph, self.vectors)
        lexical_extraction.extract_documents(chunks.done, self.store, set(), None, NLPExtractor(self.settings.entity_types),
                                  None, None, "test")
        lexical.flatten_documents(chunks.done, self.store)
        return doc_id

    def remove(self, name: str) -> None:
        (self.inbox / name).unlink()
        with GraphStore.writer(self.settings.graph_path) as graph:
            purge_documents([document_id(name)], self.store, graph, self.vectors)

    def build(self) -> lexical_tables.LexicalGraphResult:
        with GraphStore.writer(self.settings.graph_path) as graph:
            return lexical.build_lexical_graph(sorted(self.vectors.indexed_hashes()), self.store, graph, self.vectors,
                                               self.embedder, state_dir=self.state)

    def snapshot(self) -> dict:
        graph = GraphStore(self.settings.graph_path)
        try:
            found = {t: _rows(graph.query(f"MATCH (n:{t}) RETURN n.*")) for t in LEXICAL_NODES}
            for rel, (source, target) in LEXICAL_RELS.items():
                found[rel] = _rows(graph.query(f"MATCH (a:{source})-[r:{rel}]->(b:{target}) RETURN a.id, b.id, r.*"))
        finally:
            graph.close()
        for table, key in (("statements", "statement_id"), ("entities", "entity_id")):
            frame = pl.from_arrow(self.vectors.db.open_table(table).to_arrow())
            found[table] = {row[key]: row for row in frame.iter_rows(named=True)}
        return found


def _rows(frame: pl.DataFrame) -> list:
    keep = [c for c in frame.columns if not c.startswith("r._")]  # Kùzu's internal edge ids differ
    return sorted(tuple(tuple(v) if isinstance(v, list) else v for v in row) for row in frame.select(keep).iter_rows())


def assert_same(diffed: dict, scratch: dict) -> None:
    for table in (*LEXICAL_NODES, *LEXICAL_RELS):
        assert diffed[table] == scratch[table], table
        assert len(set(diffed[table])) == len(diffed[table]), f"{table} has a row twice"
    for table in ("statements", "entities"):
        assert diffed[table].keys() == scratch[table].keys(), table
        for key, row in scratch[table].items():
            mine = diffed[table][key]
            assert {k: v for k, v in mine.items() if k != "vector"} == {k: v for k, v in row.items() if k != "vector"}
            assert np.allclose(mine["vector"], row["vector"], atol=1e-4), (table, key)


def from_scratch(index: Index, tmp_path: Path) -> dict:
    """The same extracts and catalog, with the lexical state and its vector tables deleted: a whole build."""
    fresh = tmp_path / f"scratch-{len(list(tmp_path.glob('scratch-*')))}"
    shutil.copytree(index.settings.home, fresh / "home")
    other = Index(fresh / "home", index.inbox, index.embedder)
    shutil.rmtree(other.state, ignore_errors=True)
    for table in ("statements", "entities"):
        other.vectors.db.drop_table(table)
    result = other.build()
    assert result.mode == "rebuild"
    return other.snapshot()


@pytest.fixture
def index(tmp_path, embedder) -> Index:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    return Index(tmp_path / "home", inbox, embedder)


def test_add_change_remove_one_at_a_time_equal_a_build_from_nothing(index, tmp_path):
    index.put("alpha.md", DOCS["alpha.md"])
    first = index.build()
    assert first.mode == "rebuild" and "no saved lexical state" in first.reason

    beta = index.put("beta.txt", DOCS["beta.txt"])
    added = index.build()
    assert added.mode == "diff", added.reason
    assert added.documents_read == [beta] and added.changes["added"] == [beta]
    assert added.written["Statement"]["added"] > 0 and added.written["Statement"]["removed"] == 0
    assert_same(index.snapshot(), from_scratch(index, tmp_path))

    index.put("gamma.md", DOCS["gamma.md"])
    index.build()
    before = index.snapshot()
    index.put("beta.txt", DOCS["beta.txt"].replace("Dana Frost", "Erik Holm"))  # changed and reloaded
    changed = index.build()
    assert changed.mode == "diff", changed.reason
    assert changed.documents_read == [beta] and changed.changes["changed"] == [beta]
    after = index.snapshot()
    assert_same(after, from_scratch(index, tmp_path))
    names = lambda snap: {row[1] for row in snap["Entity"]}  # noqa: E731
    assert "Erik Holm" in names(after) and "Erik Holm" not in names(before)
    entity_diff = changed.written["Entity"]
    assert entity_diff["added"] == len(names(after) - names(before))
    assert entity_diff["removed"] == len(names(before) - names(after))

    index.remove("gamma.md")
    removed = index.build()
    assert removed.mode == "diff" and removed.changes["removed"] == [document_id("gamma.md")]
    assert removed.documents_read == []
    gone = index.snapshot()
    assert not any(row[1] == document_id("gamma.md") for row in gone["Statement"])
    assert all(row["doc_id"] != document_id("gamma.md") for row in gone["statements"].values())
    assert_same(gone, from_scratch(index, tmp_path))

    again = index.build()  # nothing changed: nothing read, nothing written
    assert again.mode == "diff" and again.documents_read == [] and again.embedded == {"statements": 0, "entities": 0}
    assert all(not any(v.values()) for v in again.written.values()), again.written
    assert again.digest == removed.digest


def test_an_entity_shared_by_two_documents_stays_until_both_are_gone(index, tmp_path):
    index.put("alpha.md", DOCS["alpha.md"])
    index.put("gamma.md", DOCS["gamma.md"])
    index.build()
    shared = lambda: [row for row in index.snapshot()["Entity"] if row[1] == "Alpha Shipping"]  # noqa: E731
    assert shared() and shared()[0][6] == 2  # documents

    index.remove("alpha.md")
    assert index.build().mode == "diff"
    assert shared() and shared()[0][6] == 1
    assert_same(index.snapshot(), from_scratch(index, tmp_path))
    facts_before = len(index.snapshot()["Fact"])

    index.remove("gamma.md")
    emptied = index.build()
    assert emptied.mode == "diff" and not shared()
    snap = index.snapshot()
    assert not snap["Entity"] and not snap["Statement"] and not snap["entities"] and not snap["statements"]
    assert emptied.written["Fact"]["removed"] == facts_before


def test_a_damaged_lexical_table_is_named_and_the_rest_is_built(index, tmp_path):
    alpha = index.put("alpha.md", DOCS["alpha.md"])
    index.build()
    kept = index.snapshot()
    gamma = index.put("gamma.md", DOCS["gamma.md"])
    beta = index.put("beta.txt", DOCS["beta.txt"])
    damaged = index.store.path(STATEMENTS, gamma)
    damaged.write_bytes(damaged.read_bytes()[:40])  # truncated
    index.put("alpha.md", DOCS["alpha.md"] + "\nAlpha Shipping also chartered a vessel.\n")
    alpha_path = index.store.path("entities", alpha)
    alpha_path.write_bytes(b"not parquet at all")  # alpha changed, but its new table is unreadable

    result = index.build()
    assert result.mode == "diff", result.reason
    assert set(result.damaged) == {alpha, gamma}
    assert str(damaged) in result.damaged[gamma] and str(alpha_path) in result.damaged[alpha]
    snap = index.snapshot()
    statement_docs = {row[1] for row in snap["Statement"]}
    assert beta in statement_docs and gamma not in statement_docs
    # alpha was reloaded (its chunks are new), so its old share went with its chunks; nothing else was lost
    assert {row for row in snap["Entity"] if row[1] == "Bolt Engines"}
    assert result.damaged == index.build().damaged  # named again on the next run
    del kept


def test_a_changed_document_with_a_damaged_table_keeps_its_share(index, tmp_path):
    alpha = index.put("alpha.md", DOCS["alpha.md"])
    index.put("beta.txt", DOCS["beta.txt"])
    index.build()
    kept = index.snapshot()
    path = index.store.path("facts", alpha)
    path.write_bytes(path.read_bytes()[:-20])  # rewritten (new size and time) and truncated
    result = index.build()
    assert result.mode == "diff" and alpha in result.damaged and str(path) in result.damaged[alpha]
    assert_same(index.snapshot(), kept)  # nothing already built was lost


@pytest.mark.parametrize("damage", ["delete", "garbage", "unsynced"])
def test_a_missing_or_damaged_state_means_a_rebuild(index, tmp_path, damage):
    index.put("alpha.md", DOCS["alpha.md"])
    index.build()
    index.put("beta.txt", DOCS["beta.txt"])
    marker = index.state / "state.json"
    if damage == "delete":
        shutil.rmtree(index.state)
    elif damage == "garbage":
        for path in index.state.glob("*/*.arrow"):
            path.write_bytes(b"garbage")
    else:  # killed between the Kùzu write and the state's: the marker still says "writing"
        lexical_diff_mark(index)
    result = index.build()
    assert result.mode == "rebuild" and result.reason, result
    assert marker.exists()
    assert_same(index.snapshot(), from_scratch(index, tmp_path))
    assert index.build().mode == "diff"


def test_a_state_saved_as_parquet_before_is_still_read(index, tmp_path):
    """A generation saved as Parquet (before the state was Arrow IPC) is read: the next build is a diff, not a
    rebuild, and ends equal to a build from nothing; the state it saves is Arrow IPC."""
    index.put("alpha.md", DOCS["alpha.md"])
    index.build()
    saved = list(index.state.glob("*/*.arrow"))
    assert saved
    for path in saved:
        pl.read_ipc(path).write_parquet(path.with_suffix(".parquet"), compression="lz4")
        path.unlink()
    index.put("beta.txt", DOCS["beta.txt"])
    result = index.build()
    assert result.mode == "diff", result.reason
    assert_same(index.snapshot(), from_scratch(index, tmp_path))
    assert not list(index.state.glob("*/*.parquet")) and list(index.state.glob("*/*.arrow"))


def lexical_diff_mark(index: Index) -> None:
    from lexgraph.indexing.lexical_state import mark_writing

    mark_writing(index.state)


@pytest.mark.parametrize("table", ["Entity", "Statement"])
def test_a_graph_that_does_not_add_up_is_rebuilt(index, tmp_path, table):
    index.put("alpha.md", DOCS["alpha.md"])
    index.put("beta.txt", DOCS["beta.txt"])
    index.build()
    with GraphStore.writer(index.settings.graph_path) as graph:  # a node deleted behind the build's back
        graph.conn.execute(f"MATCH (n:{table}) WITH n ORDER BY n.id LIMIT 1 DETACH DELETE n")
    index.put("gamma.md", DOCS["gamma.md"])
    result = index.build()
    assert result.mode == "rebuild", result.reason
    assert f"{table} " in result.reason or "could not be written" in result.reason, result.reason
    assert_same(index.snapshot(), from_scratch(index, tmp_path))


def test_a_change_to_most_documents_is_rebuilt(index, tmp_path, monkeypatch):
    from lexgraph.indexing import lexical_diff

    monkeypatch.setattr(lexical_diff, "REBUILD_MIN_DOCUMENTS", 1)  # the corpus here is tiny
    index.put("alpha.md", DOCS["alpha.md"])
    index.put("beta.txt", DOCS["beta.txt"])
    index.build()
    index.put("gamma.md", DOCS["gamma.md"])  # a third of the documents: over the share
    result = index.build()
    assert result.mode == "rebuild" and "a rebuild is cheaper" in result.reason
    assert_same(index.snapshot(), from_scratch(index, tmp_path))
    assert index.build().mode == "diff"


def test_vector_rows_lost_behind_the_builds_back_are_found_and_restored(index, tmp_path):
    """The saved signatures stand for the stored vectors only while the row counts agree: a lost statement
    row makes the diff scan the table (and rewrite that document), a lost entity row replaces the table."""
    index.put("alpha.md", DOCS["alpha.md"])
    index.put("beta.txt", DOCS["beta.txt"])
    index.build()
    alpha = document_id("alpha.md")
    statements = index.vectors.db.open_table("statements")
    lost = statements.search().where(f"doc_id = '{alpha}'").limit(1).to_list()[0]["statement_id"]
    statements.delete(f"statement_id = '{lost}'")
    entities = index.vectors.db.open_table("entities")
    entities.delete(f"entity_id = '{entities.search().limit(1).to_list()[0]['entity_id']}'")
    index.put("gamma.md", DOCS["gamma.md"])
    result = index.build()
    assert result.mode == "diff", result.reason
    assert result.statement_vectors.startswith("scanned") and result.entity_vectors.startswith("replaced")
    assert_same(index.snapshot(), from_scratch(index, tmp_path))


class Scripted:
    """An extractor that reads what it extracts from the chunk's lines ("entity: Jordan | person", "fact: Jordan |
    borders | Israel", "relation: Jordan | Amman | has capital"), so the types are the test's, not a model's."""

    name, model, prompt_version = "scripted", "scripted-v1", "s1"

    def extract(self, chunk):
        from lexgraph.extract.schemas import ChunkExtraction, ExtractionOutcome

        entities, statements, relations = [], [], []
        for line in chunk.text.splitlines():
            kind, _, rest = line.partition(": ")
            parts = [part.strip() for part in rest.split("|")]
            if kind == "entity":
                entities.append({"name": parts[0], "type": parts[1], "description": f"{parts[0]}, a {parts[1]}.",
                                 "mention": line})
            elif kind == "fact":
                statements.append({"text": " ".join(parts) + ".",
                                   "facts": [dict(zip(("subject", "predicate", "object"), parts))]})
            elif kind == "relation":
                relations.append({"source": parts[0], "target": parts[1], "predicate": parts[2], "description": line,
                                  "strength": 0.8})
        extraction = ChunkExtraction.model_validate(
            {"topics": [{"name": "notes", "statements": statements}] if statements else [], "entities": entities,
             "relations": relations})
        return ExtractionOutcome(extraction, self.name, self.model, self.prompt_version)


def put_scripted(index: Index, name: str, lines: list[str]) -> str:
    """Index.put with the Scripted extractor."""
    (index.inbox / name).write_text("\n".join(lines) + "\n")
    doc_id = document_id(name)
    sources = load_sources({doc_id: index.inbox / name}, index.inbox, index.store, index.settings.index_version)
    chunks = chunk_documents(sources.done, index.store, index.embedder, index.settings.chunk_tokens)
    embed_documents(chunks.done, index.store, index.embedder, index.vectors)
    with GraphStore.writer(index.settings.graph_path) as graph:
        load_graph(chunks.done, index.store, graph, index.vectors)
    lexical_extraction.extract_documents(chunks.done, index.store, set(), None, Scripted(), None, None, "test")
    lexical.flatten_documents(chunks.done, index.store)
    return doc_id


def same_as_scratch(index: Index, tmp_path: Path, result: lexical_tables.LexicalGraphResult) -> dict:
    """assert_same against a build from nothing, and the same entity merges and digest; -> the snapshot."""
    snap = index.snapshot()
    assert_same(snap, from_scratch(index, tmp_path))
    scratch = sorted(tmp_path.glob("scratch-*"), key=lambda p: int(p.name.split("-")[1]))[-1] / "home"
    other = Index(scratch, index.inbox, index.embedder)
    again = other.build()  # the state the scratch build saved: nothing to do, and its merges as they stand
    assert again.mode == "diff" and again.documents_read == []
    assert result.merges_frame.equals(again.merges_frame) and result.digest == again.digest
    return snap


TYPED = {
    "atlas.txt": ["entity: Jordan | location", "entity: Amman | location", "entity: Israel | location",
                  "fact: Jordan | borders | Israel", "relation: Jordan | Amman | has capital"],
    "news.txt": ["entity: Jordan | other", "entity: Israel | location", "fact: Jordan | borders | Israel"],
    "crew.txt": ["entity: Jordan | person", "entity: Bolt Engines | organization",
                 "fact: Jordan | works at | Bolt Engines", "relation: Jordan | Bolt Engines | works at"],
    "letters.txt": ["entity: Jordan | person", "entity: Bolt Engines | organization",
                    "fact: Jordan | works at | Bolt Engines"],
}


def test_a_document_that_splits_a_name_by_type_and_its_removal_equal_a_build_from_nothing(index, tmp_path):
    """The country Jordan arrives beside the person Jordan (a split), a second person document hands the name's id
    to the person, and the documents leave again until the split is undone: after each step the diff equals a
    build from nothing, and only documents whose rows of Jordan resolve anew are rewritten besides the changed."""
    from lexgraph.indexing.name_keys import entity_id

    crew, news = put_scripted(index, "crew.txt", TYPED["crew.txt"]), put_scripted(index, "news.txt", TYPED["news.txt"])
    index.build()
    jordans = lambda snap: {row[2]: row[0] for row in snap["Entity"] if row[1] == "Jordan"}  # noqa: E731 type -> id
    assert jordans(index.snapshot()) == {"person": entity_id("Jordan")}  # news's untyped Jordan joined the person

    atlas = put_scripted(index, "atlas.txt", TYPED["atlas.txt"])
    split = index.build()
    assert split.mode == "diff", split.reason
    assert split.changes["resolved_again"] == [crew]  # its person left the name's id; news's bare Jordan did not
    snap = same_as_scratch(index, tmp_path, split)
    ids = jordans(snap)
    assert set(ids) == {"location", "person"} and ids["location"] == entity_id("Jordan")  # a tie: location keeps it
    by_predicate = {row[2]: row for row in snap["Fact"]}
    assert {(e, f) for e, f, *_ in snap["SUBJECT"]} >= {(ids["person"], by_predicate["works at"][0]),
                                                        (ids["location"], by_predicate["borders"][0])}
    assert by_predicate["borders"][4] == 2  # atlas's and news's statements: news's bare Jordan is the larger family
    apart = split.merges_frame.filter(pl.col("reason").str.starts_with("kept apart"))
    assert sorted(apart["entity_id"].to_list()) == sorted(ids.values())

    put_scripted(index, "letters.txt", TYPED["letters.txt"])
    tipped = index.build()
    assert tipped.mode == "diff" and tipped.changes["resolved_again"] == sorted([atlas, crew, news])
    ids = jordans(same_as_scratch(index, tmp_path, tipped))
    assert ids["person"] == entity_id("Jordan") and ids["location"] != entity_id("Jordan")  # 2 persons, 1 place

    index.remove("letters.txt")
    back = index.build()
    assert back.mode == "diff" and back.changes["resolved_again"] == sorted([atlas, crew, news]), back.reason
    assert jordans(same_as_scratch(index, tmp_path, back))["location"] == entity_id("Jordan")

    index.remove("atlas.txt")
    joined = index.build()
    assert joined.mode == "diff" and joined.changes["resolved_again"] == [crew], joined.reason
    assert jordans(same_as_scratch(index, tmp_path, joined)) == {"person": entity_id("Jordan")}
    assert not joined.merges_frame.filter(pl.col("reason").str.starts_with("kept apart")).height
