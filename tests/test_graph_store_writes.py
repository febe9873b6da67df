"""GraphStore's adds below CREATE_MAX_ROWS go in with CREATE, above it with COPY: the same graph either way,
the same refusal of an edge to a missing node; deletes report how many edges went."""
from datetime import datetime, timezone

import polars as pl
import pytest

from lexgraph.storage import graph_store
from lexgraph.storage.graph_store import GraphStore

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
EDGES = pl.DataFrame({"src": ["d1-a", "d1-a", "d1-b", "d1-a"], "dst": ["d1-b", "d2-a", "d2-a", "d1-b"],
                      "kind": ["semantic", "lexical", "semantic", "lexical"], "weight": [0.9, 0.5, 0.4, 0.25]})
LINKS = pl.DataFrame({"keyword": ["bergen", "kiel", "bergen"], "chunk_id": ["d1-a", "d1-b", "d2-a"],
                      "sentence_count": [1, 2, 3]})


def _documents(graph: GraphStore) -> None:
    for doc, names in (("d1", ["d1-a", "d1-b"]), ("d2", ["d2-a"])):
        sources = pl.DataFrame({"id": [doc], "uri": [f"file:///{doc}"], "relative_path": [f"{doc}.md"], "title": [doc],
                                "format": ["markdown"], "content_hash": ["h"], "version": ["v"], "size_bytes": [3],
                                "ingested_at": [AT]})
        chunks = pl.DataFrame({"chunk_id": names, "doc_id": [doc] * len(names), "order": list(range(len(names))),
                               "text": names, "char_start": [0] * len(names), "char_end": [1] * len(names),
                               "page_start": [1, None][:len(names)], "heading_path": ["h"] * len(names),
                               "token_count": [1] * len(names)})
        graph.replace_documents(sources, chunks)


def _lexical(graph: GraphStore) -> None:
    """Nodes with timestamps, lists and nulls, and an edge of each lexical rel table."""
    provenance = {"extractor": ["x"], "model": ["m"], "prompt_version": ["p1"], "extracted_at": [AT]}
    graph.add_lexical_rows("Topic", pl.DataFrame({"id": ["t1"], "doc_id": ["d1"], "name": ["Ships"]}))
    graph.add_lexical_rows("Statement", pl.DataFrame({"id": ["s1", "s2"], "doc_id": ["d1", "d1"],
                                                      "chunk_id": ["d1-a", "d1-b"], "topic_id": ["t1", None],
                                                      "text": ["Kiel is a port.", "Bergen too."],
                                                      **{k: v * 2 for k, v in provenance.items()}}))
    graph.add_lexical_rows("Fact", pl.DataFrame({"id": ["f1"], "subject": ["Kiel"], "predicate": ["is"],
                                                 "object": ["port"], "statements": [1], "documents": [1], **provenance}))
    graph.add_lexical_rows("Entity", pl.DataFrame({"id": ["e1", "e2"], "name": ["Kiel", "Bergen"], "type": ["CITY"] * 2,
                                                   "description": ["a port", None], "aliases": [["Kiel", "KI"], []],
                                                   "mentions": [2, 1], "documents": [1, 1],
                                                   **{k: v * 2 for k, v in provenance.items()}}))
    for rel, rows in {"EXTRACTED_FROM": {"from": ["s1", "s2"], "to": ["d1-a", "d1-b"]},
                      "BELONGS_TO": {"from": ["s1"], "to": ["t1"]}, "TOPIC_OF": {"from": ["t1"], "to": ["d1"]},
                      "SUPPORTS": {"from": ["f1"], "to": ["s1"]}, "SUBJECT": {"from": ["e1"], "to": ["f1"]},
                      "OBJECT": {"from": ["e2"], "to": ["f1"]},
                      "RELATED": {"from": ["e1"], "to": ["e2"], "predicate": ["near"], "description": [None],
                                  "weight": [0.5]},
                      "MENTIONED_IN": {"from": ["e1", "e2"], "to": ["d1-a", "d2-a"], "description": ["port", "city"]}}.items():
        graph.add_lexical_rows(rel, pl.DataFrame(rows, schema={c: pl.Float64 if c == "weight" else pl.String for c in rows}))


def _content(graph: GraphStore) -> dict[str, list]:
    """Every node with its properties and every edge with its ends and properties, sorted."""
    content = {}
    for table in sorted(graph.tables()):
        if table in graph_store.REL_ENDS:
            found = graph.query(f"MATCH (a)-[r:{table}]->(b) RETURN a.id AS a, b.id AS b, r")
            rows = [(a, b, sorted((k, str(v)) for k, v in r.items() if not k.startswith("_")))
                    for a, b, r in found.iter_rows()] if found.height else []
        else:
            found = graph.query(f"MATCH (n:{table}) RETURN n")
            rows = [sorted((k, str(v)) for k, v in n.items() if not k.startswith("_")) for (n,) in found.iter_rows()] \
                if found.height else []
        content[table] = sorted(rows, key=str)
    return content


def _build(path, monkeypatch, create_max_rows: int) -> dict[str, list]:
    monkeypatch.setattr(graph_store, "CREATE_MAX_ROWS", create_max_rows)
    with GraphStore.writer(path) as graph:
        _documents(graph)
        graph.add_similarity_edges(EDGES.head(2))  # into an empty table
        graph.add_similarity_edges(EDGES.tail(2))  # into a table that holds edges
        graph.add_keywords(["bergen", "kiel"])
        graph.add_keyword_links(LINKS)
        _lexical(graph)
    with GraphStore.writer(path) as graph:  # what was checkpointed at close
        return _content(graph)


def test_create_below_the_threshold_and_copy_above_write_the_same_graph(tmp_path, monkeypatch):
    created = _build(tmp_path / "created.kuzu", monkeypatch, 10**9)
    copied = _build(tmp_path / "copied.kuzu", monkeypatch, 0)
    assert created == copied
    assert len(created["SIMILAR"]) == 4 and len(created["KEYWORD_IN"]) == 3 and len(created["NEXT"]) == 1
    assert len(created["Entity"]) == 2 and len(created["MENTIONED_IN"]) == 2 and len(created["RELATED"]) == 1
    # a batch of exactly the threshold is created, one row more is copied: still the same edges
    split = _build(tmp_path / "split.kuzu", monkeypatch, 2)
    assert split == created


@pytest.mark.parametrize("create_max_rows", [10**9, 0], ids=["create", "copy"])
def test_an_edge_to_a_missing_node_fails_its_whole_batch(tmp_path, monkeypatch, create_max_rows):
    monkeypatch.setattr(graph_store, "CREATE_MAX_ROWS", create_max_rows)
    with GraphStore.writer(tmp_path / "g.kuzu") as graph:
        _documents(graph)
        graph.add_keywords(["bergen"])
        with pytest.raises(RuntimeError):
            graph.add_similarity_edges(pl.DataFrame({"src": ["d1-a", "d1-a"], "dst": ["d1-b", "gone"],
                                                     "kind": ["semantic"] * 2, "weight": [0.1, 0.2]}))
        with pytest.raises(RuntimeError):
            graph.add_keyword_links(pl.DataFrame({"keyword": ["bergen", "unknown"], "chunk_id": ["d1-a", "d1-a"],
                                                  "sentence_count": [1, 1]}))
        assert graph.count("SIMILAR") == 0 and graph.count("KEYWORD_IN") == 0  # not even the good edge
        graph.add_similarity_edges(EDGES)  # the store is usable after the refusal
        assert graph.count("SIMILAR") == 4


def test_deletes_report_how_many_edges_went(tmp_path):
    with GraphStore.writer(tmp_path / "g.kuzu") as graph:
        _documents(graph)
        graph.add_similarity_edges(EDGES)
        graph.replace_keywords(pl.Series(["bergen", "kiel"]), LINKS)
        # (src, dst, kind) of another kind, a repeated row and an unknown edge: one edge goes, counted once
        gone = graph.delete_similarity_edges(pl.DataFrame({"src": ["d1-a", "d1-a", "d1-b", "nope"],
                                                           "dst": ["d1-b", "d1-b", "d1-a", "d2-a"],
                                                           "kind": ["semantic", "semantic", "semantic", "semantic"]}))
        assert gone == 1 and graph.count("SIMILAR") == 3
        # edges of a reloaded document's chunks went with them: not there to delete, not counted
        _documents(graph)
        assert graph.delete_similarity_edges(EDGES) == 0 and graph.count("SIMILAR") == 0
        graph.add_similarity_edges(EDGES)
        graph.add_keyword_links(LINKS)
        assert graph.delete_keywords(["kiel", "never-there"]) == 1 and graph.count("KEYWORD_IN") == 2
        assert graph.delete_keyword_links(["d2", "d2"]) == 1 and graph.keyword_links_per_document() == {"d1": 1}
        assert graph.delete_keywords([]) == 0 and graph.delete_keyword_links([]) == 0
        assert graph.delete_similarity_edges(EDGES.head(0)) == 0
