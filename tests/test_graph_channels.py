"""The lexical graph's retrieval channels (statement, entity) on the sample corpus, ingested through Dagster
with the default offline NLP extractor: right documents, traversal budgets, an index without a lexical graph,
hostile queries, and the statements behind a chunk hit."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from lexgraph.index import LexIndex
from lexgraph.query import graph_channels as gc
from lexgraph.query.retrieval import METHODS, Retriever, load_index
from lexgraph.query.retrieval_types import RetrievalParams
from lexgraph.settings import Settings
from orchestration.cli import main
from tests.conftest import ROOT

GRAPH_METHODS = ("statement", "entity")
QUESTIONS = json.loads((ROOT / "sample" / "questions.json").read_text())


@pytest.fixture(scope="module")
def retriever(sample_home, embedder) -> Retriever:
    settings = Settings.from_env(home=sample_home)
    return Retriever(load_index(settings), embedder.embed_query, RetrievalParams(), embedder.embed_queries)


def documents(hits) -> list[str]:
    return list(dict.fromkeys(hit.doc_key for hit in hits))


def with_params(**changes) -> RetrievalParams:
    return dataclasses.replace(RetrievalParams(), **changes)


def test_the_channels_are_methods_of_search_and_bench():
    assert {"statement", "entity"} <= set(METHODS)
    assert "hybrid" in METHODS and RetrievalParams().fusion_weights == (("dense", 0.5), ("bm25", 1.0), ("keyword", 0.5))


def test_the_lexical_graph_is_loaded_with_the_index(retriever):
    graph = retriever.index.graph
    assert graph is not None and graph.statements is not None and graph.entities is not None
    statements, entities = graph.statements, graph.entities
    assert statements.size > 100 and statements.unit_vectors.shape == (statements.size, retriever.index.vectors.shape[1])
    assert statements.links.nnz > 0 and statements.topic_members.shape[1] == statements.size
    assert entities.size > 50 and entities.mentions.nnz > 0 and entities.relations.nnz > 0
    # every statement sits on an indexed chunk of its own document
    chunk_docs = retriever.index.chunks["doc_id"].to_list()
    assert all(0 <= row < retriever.index.size for row in statements.chunk_rows)
    assert {chunk_docs[row] for row in statements.chunk_rows} == set(chunk_docs)


@pytest.mark.parametrize("method", GRAPH_METHODS)
@pytest.mark.parametrize("qid", ["3", "4", "9", "10"])
def test_each_channel_finds_the_evidence_document(retriever, method, qid):
    question = QUESTIONS[qid]
    found = documents(retriever.search(method, question["question"], 20))
    assert question["evidence"] in found[:3], (method, question["question"], found[:5])


@pytest.mark.parametrize("method", GRAPH_METHODS)
def test_scores_are_one_per_chunk_and_minus_infinity_where_not_retrieved(retriever, method):
    scores = retriever.scores(method, QUESTIONS["3"]["question"])
    assert isinstance(scores, np.ndarray) and scores.shape == (retriever.index.size,)
    finite = np.isfinite(scores)
    assert 0 < finite.sum() < retriever.index.size
    assert np.isneginf(scores[~finite]).all()


def test_search_and_the_cli_accept_the_new_methods(sample_home, capsys):
    index = LexIndex(Settings.from_env(home=sample_home))
    question = QUESTIONS["9"]
    for method in GRAPH_METHODS:
        hits = index.search(question["question"], 3, method)
        assert 1 <= len(hits) <= 3 and hits[0].doc_key == question["evidence"]
        assert main(["--home", str(sample_home), "search", question["question"], "--method", method, "-k", "2"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("1. ") and "group-overview.md" in out


def test_entity_names_in_the_query_are_found_by_the_resolver_key(retriever):
    graph = retriever.index.graph.entities
    names = {graph.names[i] for i in gc.query_entities(graph, "What did the Kestrel Propulsion GmbH tell MV Nordlys Spirit?")}
    assert any(name.startswith("Kestrel Propulsion") for name in names), names
    assert any("Nordlys Spirit" in name for name in names), names
    assert gc.query_entities(graph, "") == [] and gc.query_entities(graph, "the of and") == []


def test_statement_traversal_honours_hops_nodes_and_statements(retriever, embedder):
    graph = retriever.index.graph.statements
    query = embedder.embed_query(QUESTIONS["12"]["question"])  # a multi-hop question: the CEO of the contract's supplier

    seeds = gc.traverse_statements(graph, query, with_params(statement_hops=0, statement_top=15))
    assert 0 < len(seeds) <= 15 and {s.hop for s in seeds} == {0} and {s.via for s in seeds} == {"vector"}

    one = gc.traverse_statements(graph, query, with_params(statement_hops=1))
    assert max(s.hop for s in one) == 1 and len(one) > len(seeds)
    assert len(one) <= RetrievalParams().statement_limit
    # through shared facts and entities the traversal reaches sources none of the seeds is in
    links = gc.traverse_statements(graph, query, with_params(statement_hops=1, statement_top=5, statement_topic_weight=0.0))
    doc_of = retriever.index.chunks["doc_id"].to_list()
    seed_docs = {doc_of[graph.chunk_rows[s.row]] for s in links if s.hop == 0}
    assert {doc_of[graph.chunk_rows[s.row]] for s in links if s.hop == 1} - seed_docs
    assert all(not s.via.startswith("topic:") for s in links if s.hop)

    for nodes in (1, 3):
        limited = gc.traverse_statements(graph, query, with_params(statement_hops=2, statement_nodes=nodes))
        assert len({s.via for s in limited if s.hop}) <= nodes
    for limit in (1, 7, 25):
        assert len(gc.traverse_statements(graph, query, with_params(statement_hops=2, statement_limit=limit))) <= limit
    two = gc.traverse_statements(graph, query, with_params(statement_hops=2, statement_nodes=400, statement_limit=400))
    assert max(s.hop for s in two) == 2 and len(two) <= 400
    assert [s.score for s in two] == sorted((s.score for s in two), reverse=True)
    assert gc.traverse_statements(graph, query, with_params(statement_limit=0)) == []


def test_entity_hop_adds_at_most_the_neighbour_budget(retriever, embedder):
    graph = retriever.index.graph.entities
    question = QUESTIONS["12"]["question"]
    query = embedder.embed_query(question)
    alone = gc.entity_weights(graph, question, query, with_params(entity_neighbours=0))
    seeds = set(alone)
    assert 0 < len(seeds) <= RetrievalParams().entity_top + len(gc.query_entities(graph, question))
    assert all(weight > 0 for weight in alone.values())
    for budget in (1, 5):
        hopped = gc.entity_weights(graph, question, query, with_params(entity_neighbours=budget))
        added = set(hopped) - seeds
        assert 0 < len(added) <= budget
        # neighbours are down-weighted: below the seed entities' weight
        assert max(hopped[a] for a in added) < max(alone.values())


def test_statements_behind_a_chunk_hit(retriever, embedder):
    question = QUESTIONS["3"]["question"]
    query = embedder.embed_query(question)
    hit = retriever.search("statement", question, 1)[0]
    found = gc.statements_for(retriever.index, query, [retriever.index.position[hit.chunk_id]], limit=5)
    assert 1 <= len(found) <= 5
    assert {s.chunk_id for s in found} == {hit.chunk_id} and {s.doc_id for s in found} == {hit.doc_id}
    assert [s.score for s in found] == sorted((s.score for s in found), reverse=True)
    assert all(s.statement_id.startswith("st-") and s.text for s in found)
    assert any("Helene Strand" in s.text for s in gc.statements_for(retriever.index, query, [hit.chunk_id], limit=50))
    assert gc.statements_for(retriever.index, query, [], limit=5) == []
    assert gc.statements_for(retriever.index, query, ["no-such-chunk", 10 ** 9], limit=5) == []
    assert gc.statements_for(retriever.index, query, [hit.chunk_id], limit=0) == []


def test_an_index_without_a_lexical_graph_loads_and_the_channels_find_nothing(sample_home, tmp_path, embedder):
    settings = Settings.from_env(home=sample_home)
    bare_home = tmp_path / "bare"
    bare = Settings.from_env(home=bare_home)
    shutil.copytree(settings.index_dir, bare.index_dir, ignore=shutil.ignore_patterns("*.lock"))
    for table in ("statements.lance", "entities.lance"):
        shutil.rmtree(bare.index_dir / "lance" / table)
    for stage in ("extractions", "statements", "topics", "facts", "entities", "relations"):
        shutil.rmtree(bare.extract_dir / stage)
    index = load_index(bare)
    assert index.graph is not None and index.graph.statements is None and index.graph.entities is None
    retriever = Retriever(index, embedder.embed_query)
    for method in GRAPH_METHODS:
        assert np.isneginf(retriever.scores(method, QUESTIONS["3"]["question"])).all()
        assert retriever.search(method, QUESTIONS["3"]["question"]) == []
        assert LexIndex(bare).search(QUESTIONS["3"]["question"], 5, method) == []
    assert retriever.search("dense", QUESTIONS["3"]["question"], 1)  # the other channels are unaffected
    assert gc.statements_for(index, embedder.embed_query("x"), [0], 5) == []


def test_vectors_without_the_parquet_links_still_serve_the_statement_channel(sample_home, tmp_path, embedder):
    settings = Settings.from_env(home=sample_home)
    partial = Settings.from_env(home=tmp_path / "partial")
    shutil.copytree(settings.index_dir, partial.index_dir, ignore=shutil.ignore_patterns("*.lock"))
    for stage in ("facts", "entities", "relations"):
        shutil.rmtree(partial.extract_dir / stage)
    retriever = Retriever(load_index(partial), embedder.embed_query)
    question = QUESTIONS["4"]
    assert documents(retriever.search("statement", question["question"], 10))[0] == question["evidence"]
    assert retriever.search("entity", question["question"]) == []  # no mentions: no chunk to lead to


@pytest.mark.parametrize("method", GRAPH_METHODS)
def test_hostile_queries_give_a_clean_error_or_a_safe_answer(sample_home, retriever, method, capsys):
    index = LexIndex(Settings.from_env(home=sample_home))
    with pytest.raises(ValueError, match="the query is empty"):
        index.search("", 5, method)
    with pytest.raises(ValueError, match="the query is empty"):
        index.search(" \t\n", 5, method)
    assert main(["--home", str(sample_home), "search", "", "--method", method]) == 2
    assert "the query is empty" in capsys.readouterr().err
    for query in ("\x00\x01\x1b[31m Kestrel \x07\u202e\ufeff", "MATCH (n) DETACH DELETE n RETURN n",
                  "'; DROP TABLE statements; --", "\"\\' OR 1=1 {}[]()*?+^$|"):
        hits = retriever.search(method, query, 5)
        assert len(hits) <= 5 and all(np.isfinite(hit.score) for hit in hits)
    long_query = ("Who chaired the board? " * 5_000)[:100_000]
    assert len(long_query.encode()) == 100_000
    assert len(index.search(long_query, 3, method)) <= 3
