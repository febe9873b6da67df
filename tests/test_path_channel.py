"""The ``path`` retrieval channel (lexgraph.query.path_channel): MiniRAG-style entity paths from the query's
entities toward the answer type, on the sample corpus (the session's read-only ``sample_home``): right documents
for two-hop questions, answer types from the question word, the path budgets, an index without a lexical graph,
and hostile queries."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from lexgraph.index import LexIndex
from lexgraph.query import path_channel as pc
from lexgraph.query.retrieval import METHODS, Retriever, load_index
from lexgraph.query.retrieval_types import RetrievalParams
from lexgraph.settings import Settings
from tests.conftest import ROOT

QUESTIONS = json.loads((ROOT / "sample" / "questions.json").read_text())
ROUTED = {item["id"]: item for item in json.loads((ROOT / "sample" / "questions.router.json").read_text())}


@pytest.fixture(scope="module")
def retriever(sample_home) -> Retriever:
    return LexIndex(Settings.from_env(home=sample_home)).retriever()


def params(**changes) -> RetrievalParams:
    return dataclasses.replace(RetrievalParams(), **changes)


def documents(hits) -> list[str]:
    return list(dict.fromkeys(hit.doc_key for hit in hits))


def test_path_is_a_retrieval_method():
    assert "path" in METHODS
    defaults = RetrievalParams()
    assert 1 <= defaults.path_hops <= 2 and defaults.path_max_paths > 0


def test_scores_are_one_per_chunk_and_minus_infinity_where_not_reached(retriever):
    scores = retriever.scores("path", QUESTIONS["12"]["question"])
    assert isinstance(scores, np.ndarray) and scores.shape == (retriever.index.size,)
    finite = np.isfinite(scores)
    assert 0 < finite.sum() < retriever.index.size
    assert np.isneginf(scores[~finite]).all()


@pytest.mark.parametrize("qid", ["12", "14", "15", "17"])
def test_two_hop_sample_questions_find_their_evidence(retriever, qid):
    question = QUESTIONS[qid]
    evidence = question["evidence"].split("<and>")
    found = documents(retriever.search("path", question["question"], 30))
    assert set(evidence) & set(found[:5]), (question["question"], found[:8])


@pytest.mark.parametrize("qid", ["graph-001", "graph-002", "graph-004", "graph-006"])
def test_graph_route_questions_find_their_evidence(retriever, qid):
    item = ROUTED[qid]
    found = documents(retriever.search("path", item["question"], 30))
    assert set(item["evidence"]) & set(found[:5]), (item["question"], found[:8])


@pytest.mark.parametrize("question, expected", [
    ("Who founded Halvorsen Maritime Group?", {"person", "organization"}),
    ("Where is the yard located?", {"location"}),
    ("When did the vessel return to service?", {"date", "event"}),
    ("In what year was the company founded?", {"date", "event"}),
    ("Which company owns the supplier?", {"organization"}),
    ("In which town is the yard?", {"location"}),
    ("Which shipbuilder built the vessel?", {"organization"}),
    ("What is the name of the ship that was damaged?", {"vessel"}),
    ("Which vessel was damaged?", {"vessel"}),
    ("How much was the manufacturer ordered to pay?", {"money"}),
    ("What links Fosna Marine Engineering AS and Vanderlinde Coatings BV?", set()),
    ("", set()),
])
def test_answer_types_come_from_the_question_word(question, expected):
    assert pc.answer_types(question) == expected


def test_a_fitting_end_type_raises_the_path(retriever, embedder):
    graph = retriever.index.graph.entities
    question = QUESTIONS["12"]["question"]  # who → person, organization
    query = embedder.embed_query(question)
    plain = {p.nodes: p.score for p in pc.find_paths(retriever.index, graph, question, query, params(path_type_bonus=0))}
    typed = pc.find_paths(retriever.index, graph, question, query, params(path_type_bonus=1.0))
    fitting = [p for p in typed if p.fits and p.nodes in plain]
    assert fitting and all(p.score > plain[p.nodes] for p in fitting)
    types = pc.entity_types(retriever.index, graph)
    assert all(types[p.nodes[-1]] in {"person", "organization"} for p in fitting)


def test_path_budgets_are_honoured(retriever, embedder):
    index, graph = retriever.index, retriever.index.graph.entities
    question = QUESTIONS["13"]["question"]
    query = embedder.embed_query(question)
    none = pc.find_paths(index, graph, question, query, params(path_hops=0))
    assert none and {p.hops for p in none} == {0}
    one = pc.find_paths(index, graph, question, query, params(path_hops=1, path_max_paths=1000))
    assert max(p.hops for p in one) == 1
    two = pc.find_paths(index, graph, question, query, params(path_hops=2, path_max_paths=1000))
    assert max(p.hops for p in two) == 2 and len(two) > len(one)
    assert [p.score for p in two] == sorted((p.score for p in two), reverse=True)
    assert all(len(set(p.nodes)) == len(p.nodes) for p in two)  # no path revisits an entity
    for limit in (1, 5, 40):
        assert len(pc.find_paths(index, graph, question, query, params(path_max_paths=limit))) <= limit
    assert pc.find_paths(index, graph, question, query, params(path_max_paths=0)) == []
    assert np.isneginf(pc.path_scores(index, question, query, params(path_max_paths=0))).all()
    # fan-out: every hop follows at most path_fanout relations of the node it leaves
    narrow = pc.find_paths(index, graph, question, query, params(path_fanout=1, path_self_weight=0, path_max_paths=1000))
    for length in (2, 3):
        prefixes = [p.nodes[:length - 1] for p in narrow if len(p.nodes) == length]
        assert len(prefixes) == len(set(prefixes))
    # the beam: at most path_beam one-hop paths are grown into two-hop paths
    beam = pc.find_paths(index, graph, question, query, params(path_beam=3, path_max_paths=1000))
    assert len({p.nodes[:2] for p in beam if p.hops == 2}) <= 3
    # start entities: verbatim names plus at most path_start_top nearest vectors
    starts = pc.start_entities(graph, question, query, params(path_start_top=4))
    assert 0 < len(starts) <= 4 + len(pc.query_entities(graph, question))


def test_an_index_without_a_lexical_graph_returns_nothing(sample_home, tmp_path, embedder):
    settings = Settings.from_env(home=sample_home)
    bare = Settings.from_env(home=tmp_path / "bare")
    shutil.copytree(settings.index_dir, bare.index_dir, ignore=shutil.ignore_patterns("*.lock"))
    for table in ("statements.lance", "entities.lance"):
        shutil.rmtree(bare.index_dir / "lance" / table)
    for stage in ("extractions", "statements", "topics", "facts", "entities", "relations"):
        shutil.rmtree(bare.extract_dir / stage)
    retriever = Retriever(load_index(bare), embedder.embed_query)
    question = QUESTIONS["12"]["question"]
    assert np.isneginf(retriever.scores("path", question)).all()
    assert retriever.search("path", question) == []
    assert LexIndex(bare).search(question, 5, "path") == []


def test_hostile_queries_do_not_raise(sample_home, retriever):
    index = LexIndex(Settings.from_env(home=sample_home))
    with pytest.raises(ValueError, match="the query is empty"):
        index.search("", 5, "path")
    for query in ("\x00\x01\x1b[31m Kestrel \x07\u202e\ufeff", "MATCH (n) DETACH DELETE n RETURN n",
                  "'; DROP TABLE entities; --", "\"\\' OR 1=1 {}[]()*?+^$|", "who who who where when which"):
        hits = retriever.search("path", query, 5)
        assert len(hits) <= 5 and all(np.isfinite(hit.score) for hit in hits)
    long_query = ("Who chaired the board of Halvorsen Maritime Group? " * 2_000)[:100_000]
    assert len(long_query.encode()) == 100_000
    assert len(retriever.search("path", long_query, 3)) <= 3
