"""GraphStore's deletes of a diff: matched from their nodes, each edge counted once, edges of reloaded chunks
(gone with them) neither deleted nor counted."""
from datetime import datetime, timezone

import polars as pl

from lexgraph.storage.graph_store import GraphStore
from tests.conftest import GRAPH_SUFFIX

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


def test_deletes_report_how_many_edges_went(tmp_path):
    with GraphStore.writer(tmp_path / f"g{GRAPH_SUFFIX}") as graph:
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


def test_lexical_edge_deletes_take_only_the_edges_named(tmp_path):
    with GraphStore.writer(tmp_path / f"g{GRAPH_SUFFIX}") as graph:
        _documents(graph)
        graph.add_lexical_rows("Statement", pl.DataFrame(
            {"id": ["s1", "s2"], "doc_id": ["d1", "d1"], "chunk_id": ["d1-a", "d1-b"], "topic_id": ["t1", "t1"],
             "text": ["a", "b"], "extractor": ["x"] * 2, "model": ["m"] * 2, "prompt_version": ["p"] * 2,
             "extracted_at": [AT] * 2}))
        graph.add_lexical_rows("EXTRACTED_FROM", pl.DataFrame({"from": ["s1", "s1", "s2"], "to": ["d1-a", "d1-b", "d1-b"]}))
        graph.delete_lexical_edges("EXTRACTED_FROM", pl.DataFrame({"from": ["s1", "s1", "s2", "nope"],
                                                                   "to": ["d1-b", "d1-b", "d1-a", "d1-a"]}))
        left = graph.query("MATCH (s:Statement)-[:EXTRACTED_FROM]->(c:Chunk) RETURN s.id AS sid, c.id AS cid ORDER BY sid, cid")
        assert left.rows() == [("s1", "d1-a"), ("s2", "d1-b")]


def test_a_delete_matched_from_a_few_source_nodes_takes_the_same_edges_as_one_over_every_edge(tmp_path, monkeypatch):
    """Deletes naming at most MASKED_DELETE_SOURCES source nodes match from those nodes' offsets; more, from a
    join over every edge. Same edges, same count, with kinds, repeats, unknown ids and edges of both directions."""
    from lexgraph.storage import graph_store

    doomed = pl.DataFrame({"src": ["d1-a", "d1-a", "d1-a", "d1-b", "nope", "d1-a"],
                           "dst": ["d1-b", "d1-b", "d2-a", "d1-a", "d2-a", "nope"],
                           "kind": ["lexical", "lexical", "semantic", "semantic", "semantic", "lexical"]})
    left = {}
    for limit in (graph_store.MASKED_DELETE_SOURCES, 0):
        monkeypatch.setattr(graph_store, "MASKED_DELETE_SOURCES", limit)
        with GraphStore.writer(tmp_path / f"g{limit}{GRAPH_SUFFIX}") as graph:
            _documents(graph)
            graph.add_similarity_edges(EDGES)
            assert graph.delete_similarity_edges(doomed) == 1  # only (d1-a, d1-b, lexical) is there
            assert graph.delete_similarity_edges(pl.DataFrame({"src": ["nope"], "dst": ["d1-a"], "kind": ["semantic"]})) == 0
            left[limit] = sorted(graph.similarity_edges().iter_rows())
    assert left[0] == left[graph_store.MASKED_DELETE_SOURCES] == sorted(
        row for row in EDGES.iter_rows() if row[:3] != ("d1-a", "d1-b", "lexical"))
