"""The query side at scale (lexgraph.query.lance_backend): with the threshold set low, the sample index gets
LanceDB's search indexes from the Dagster asset, and the lance backend answers as the in-memory one does
(dense exactly: IVF_FLAT with every partition probed; BM25 and the keyword channel exactly, so the hybrid's
top hits too), citations stay exact spans, `/health` of a real `lexgraph serve` names the backend, a missing ANN
index falls back to flat search and says so, the graph route falls back to semantic with its reason, rows
appended after the build are found and folded in by the refresh, and bad settings exit 2."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time

import dagster as dg
import httpx
import numpy as np
import polars as pl
import pytest

from assets.search_indexes import graph_tables, search_indexes
from lexgraph.cli import main as cli_main
from lexgraph.extract.source_texts import source_text
from lexgraph.ids import chunk_id
from lexgraph.index import LexIndex
from lexgraph.query.lance_backend import LanceParams
from lexgraph.query.retrieval import Retriever, dense_scores, load_index, load_lance_index
from lexgraph.query.service import QueryService
from lexgraph.settings import Settings
from lexgraph.storage import lance_indexes as li
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import CHUNKS, VectorStore
from lexgraph.terms import STOPWORDS, tokenize
from resources import IndexResource, LanceDBResource
from tests.conftest import ROOT

QUESTIONS = ["Who is the CEO of the engine supplier Kestrel?", "What did the arbitration award decide?",
             "Which vessel had an engine fault in February 2024?", "What changed in the services agreement?",
             "When did the board meet about the Aberdeen quay?"]


@pytest.fixture(scope="module")
def lance_home(tmp_path_factory, sample_home):
    """A copy of the session's sample index whose search indexes and graph tables the search_indexes and
    graph_tables assets built (threshold 1)."""
    home = tmp_path_factory.mktemp("scale") / "index"
    shutil.copytree(sample_home, home)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
        settings = Settings.from_env(home=home)
        index = IndexResource.from_settings(settings)
        result = dg.materialize([search_indexes, graph_tables], resources={"index": index,
                                                                           "lancedb": LanceDBResource(index=index)},
                                selection=[search_indexes.key, graph_tables.key])
    assert result.success
    metadata = result.asset_materializations_for_node("search_indexes")[0].metadata
    assert metadata["decision"].value == "build" and metadata["unindexed_rows"].value == 0
    assert result.asset_materializations_for_node("graph_tables")[0].metadata["decision"].value == "written whole"
    return home


@pytest.fixture(scope="module")
def pair(lance_home):
    """(memory retriever, lance retriever) over the same index and embedder."""
    settings = Settings.from_env(home=lance_home)
    embedder = LexIndex(settings).embedder()
    memory = Retriever(load_index(settings), embedder.embed_query, None, embedder.embed_queries)
    lance = Retriever(load_lance_index(settings), embedder.embed_query, None, embedder.embed_queries)
    return memory, lance


def _ids(retriever, method, question, n=10):
    return [hit.chunk_id for hit in retriever.search(method, question, n)]


def test_lance_backend_agrees_with_memory(pair):
    memory, lance = pair
    assert lance.index.vectors is None and lance.index.keywords is None  # nothing of size N × 384 held
    assert type(lance.index.graph.entities).__name__ == "LanceEntities"  # the graph read from its tables
    overlap = []
    for question in QUESTIONS:
        assert _ids(lance, "dense", question) == _ids(memory, "dense", question)  # IVF_FLAT, all partitions
        assert _ids(lance, "keyword", question) == _ids(memory, "keyword", question)
        _same_bm25(lance, memory, question)  # the same terms, so the same scores
        overlap.append(len(set(_ids(lance, "hybrid", question, 5)) & set(_ids(memory, "hybrid", question, 5))) / 5)
    assert np.mean(overlap) == 1.0, overlap  # dense and bm25 exact, so the fused top 5 too
    hit = lance.search("hybrid", QUESTIONS[0], 1)[0]
    assert hit.text and hit.char_end > hit.char_start and hit.source_path


def _bm25(retriever, question, n=10):
    """The top BM25 scores, and the chunks scored above the cut's (a tie there may break either way)."""
    hits = retriever.search("bm25", question, n)
    cut = hits[-1].score * (1 + 1e-4) if hits else 0.0
    return sorted(h.chunk_id for h in hits if h.score > cut), [h.score for h in hits]


def _same_bm25(one, other, question) -> None:
    (ids, scores), (other_ids, other_scores) = _bm25(one, question), _bm25(other, question)
    assert ids == other_ids and scores == pytest.approx(other_scores, rel=1e-4), question


def test_full_text_counts_the_memory_bm25s_terms(pair):
    """search_text holds lexgraph.terms' terms, so a stemmed or other-stopword form matches on lance only
    where the memory BM25 matches it too."""
    memory, lance = pair
    store = VectorStore(lance.index.settings.lance_uri)
    row = store.db.open_table(CHUNKS).search().select(["text", "search_text"]).limit(1).to_arrow().to_pylist()[0]
    assert row["search_text"] == " ".join(tokenize(row["text"]))
    first = next(w for w in row["text"].split() if w.isalpha() and w.lower() not in STOPWORDS and len(w) > 4)
    for question in (first, first.upper() + "s", "the of and"):
        _same_bm25(lance, memory, question)


def test_a_camel_case_speaker_is_found_by_either_name_on_lance(tmp_path):
    """"WolfgangSchulz: ..." (a chat log's speaker) is found by "Wolfgang", as in memory; LanceDB's own
    tokenizer keeps the word whole."""
    store = VectorStore(tmp_path / "lance")
    texts = ["WolfgangSchulz: see you at the grocery store", "LiHua: the jam session is on Friday"]
    chunks = pl.DataFrame({"chunk_id": ["a-c0", "b-c0"], "doc_id": ["a", "b"], "order": [0, 0], "text": texts,
                           "char_start": [0, 0], "char_end": [len(t) for t in texts], "heading_path": ["", ""],
                           "token_count": [9, 7], "source_path": ["a.txt", "b.txt"], "content_hash": ["1", "2"],
                           "page_start": [None, None], "page_end": [None, None], "model": ["m", "m"]})
    store.replace_chunks(["a", "b"], chunks, np.eye(2, 8, dtype=np.float32))
    li.build_chunk_indexes(store)
    table = store.db.open_table(CHUNKS)
    for name in ("wolfgang", "schulz", "wolfgangschulz"):
        found = table.search(name, query_type="fts", fts_columns="search_text").select(["chunk_id"]).to_arrow()
        assert found.column("chunk_id").to_pylist() == ["a-c0"], name


GRAPH_QUESTIONS = [*QUESTIONS, "Who chairs Halvorsen Maritime and where did he open the meeting?",
                   "Which supplier did Annika Vogt lead, and what was it fined?"]


@pytest.mark.parametrize("method", ["statement", "entity", "path"])
def test_graph_channels_on_lance_return_the_memory_backends_evidence(pair, method):
    """The lexical graph read row by row from its LanceDB tables walks the same graph as the one loaded into
    memory: the same chunks, in the same order, with the same scores (flat vector search below 20,000 rows)."""
    memory, lance = pair
    for question in GRAPH_QUESTIONS:
        ours, theirs = lance.search(method, question, 10), memory.search(method, question, 10)
        assert theirs, f"{method}: nothing for {question!r} in memory"
        assert [h.chunk_id for h in ours] == [h.chunk_id for h in theirs], question
        assert np.allclose([h.score for h in ours], [h.score for h in theirs], atol=1e-5)


def test_statements_for_answers_read_from_the_tables(pair):
    from lexgraph.query.graph_channels import statements_for

    memory, lance = pair
    for question in QUESTIONS:
        vector = memory.embed(question)
        hits = lance.search("hybrid", question, 3)
        found = statements_for(lance.index, vector, [h.chunk_id for h in hits], 5)
        expected = statements_for(memory.index, vector, [h.chunk_id for h in hits], 5)
        assert [s.statement_id for s in found] == [s.statement_id for s in expected]
        assert all(s.chunk_id in {h.chunk_id for h in hits} for s in found)


def test_answers_through_lance_cite_exact_spans_and_graph_falls_back(lance_home, monkeypatch, tmp_path):
    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    settings = Settings.from_env(home=lance_home)
    service = QueryService(settings, use_llm=False)
    answer = service.ask(QUESTIONS[0], route="semantic")
    assert answer["citations"] and not answer["abstained"]
    store = ExtractStore(settings.extract_dir)
    catalog = VectorStore(settings.lance_uri).indexed_hashes()
    for citation in service.provenance(answer["query_id"])["citations"]:
        text = source_text(store, catalog[citation["doc_id"]])["text"]
        assert text[citation["char_start"]:citation["char_end"]] == citation["text"]
    routed = service.ask(QUESTIONS[2], route="graph")  # the graph tables are there: the graph route runs
    assert routed["route"] == "graph" and routed["citations"]
    assert not [r for r in service.log.lines()[-1].get("retries") or [] if r.get("to") == "semantic"]
    # an index whose graph tables were never written (built before them) answers on the semantic route, and says so
    bare = tmp_path / "bare"
    shutil.copytree(lance_home, bare)
    (LexIndex(Settings.from_env(home=bare)).corpus_files.graph_tables).unlink()
    fallback = QueryService(Settings.from_env(home=bare), use_llm=False)
    routed = fallback.ask(QUESTIONS[2], route="graph")
    line = fallback.log.lines()[-1]
    assert routed["route"] == "semantic" and line["requested_route"] == "graph"
    assert line["retries"][0]["from"] == "graph" and "tables are not written yet" in line["retries"][0]["reason"]


def test_missing_ann_index_falls_back_to_flat_search(lance_home, pair, tmp_path):
    home = tmp_path / "index"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home, query_backend="lance")
    VectorStore(settings.lance_uri).db.open_table(CHUNKS).drop_index(li.ANN_INDEX)
    health = QueryService(settings, use_llm=False).health()["query_backend"]
    assert health["backend"] == "lance" and health["indexes"][li.ANN_INDEX]["type"] is None
    assert any("no ANN vector index" in note for note in health["degraded"])
    memory, _ = pair
    flat = Retriever(load_lance_index(settings), memory.embed)
    assert _ids(flat, "dense", QUESTIONS[1]) == _ids(memory, "dense", QUESTIONS[1])


def test_appended_rows_are_searched_then_folded_in(lance_home, tmp_path):
    home = tmp_path / "index"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home)
    store = VectorStore(settings.lance_uri)
    table = store.db.open_table(CHUNKS)
    rows = table.count_rows()
    extra = table.search().limit(10).to_arrow()
    ids = [f"appended-{i}" for i in range(extra.num_rows)]
    table.add(extra.set_column(extra.schema.get_field_index("chunk_id"), "chunk_id", [ids]))
    states = li.chunk_index_states(store)
    assert states[li.ANN_INDEX].unindexed == extra.num_rows
    lance = Retriever(load_lance_index(settings), LexIndex(settings).embedder().embed_query)
    vector = np.asarray(extra.column("vector")[0].as_py(), dtype=np.float32)
    found = lance.hits(dense_scores(lance.index, vector), 20)
    assert ids[0] in {hit.chunk_id for hit in found}  # searched flat beside the index
    assert li.refresh_decision(rows + 10, rows, states) == "optimize"  # 10 of ~100 rows: past 5 %
    report = li.refresh(store, settings.index_dir / "corpus")
    assert report["decision"] == "optimize" and report["unindexed_rows"] == 0
    assert li.refresh_decision(rows * 3, rows, li.chunk_index_states(store)) == "build"


@pytest.mark.subprocess
def test_serve_health_names_the_backend(lance_home, tmp_path):
    env = dict(os.environ, LEXGRAPH_QUERY_BACKEND="lance", HF_HUB_OFFLINE="1")
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "lexgraph.cli", "--home", str(lance_home), "serve", "--port",
                                str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            health = _wait(client, process, tmp_path / "serve.log")
            backend = health["query_backend"]
            assert backend["backend"] == "lance" and backend["reason"] == "LEXGRAPH_QUERY_BACKEND=lance"
            assert backend["indexes"][li.ANN_INDEX]["type"] == "IVF_FLAT" and not backend["degraded"]
            answer = client.post("/ask", json={"question": QUESTIONS[0], "route": "semantic"})
            assert answer.status_code == 200 and answer.json()["citations"]
    finally:
        process.terminate()
        process.wait(30)
        log.close()


@pytest.mark.parametrize("variable, value, message", [
    ("LEXGRAPH_QUERY_BACKEND", "faiss", "LEXGRAPH_QUERY_BACKEND must be one of auto, memory, lance, got 'faiss'"),
    ("LEXGRAPH_LANCE_THRESHOLD", "lots", "LEXGRAPH_LANCE_THRESHOLD must be a whole number from 1 on (chunks)"),
    ("LEXGRAPH_LANCE_THRESHOLD", "0", "LEXGRAPH_LANCE_THRESHOLD must be a whole number of chunks from 1 on, got 0"),
])
def test_bad_settings_exit_2_with_a_clear_line(variable, value, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    assert cli_main(["--home", str(tmp_path), "serve"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {message}")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(client, process, log_path) -> dict:
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            return client.get("/health").json()
        except httpx.TransportError:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.25)


def _links_table(store: VectorStore) -> dict[str, list[str]]:
    rows = store.db.open_table(li.KEYWORD_LINKS).to_arrow().to_pylist()
    return {r["keyword"]: sorted(r["chunk_ids"]) for r in rows if r["chunk_ids"]}


def test_keyword_links_are_updated_by_document_and_end_equal_to_a_rewrite(lance_home, tmp_path):
    """Removing, changing and re-adding documents touches only their keywords' rows, and the table always
    equals one written whole from the same catalog; a run repeated after a kill changes nothing."""
    from lexgraph.indexing import corpus_keywords

    home = tmp_path / "index"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home)
    store, extract, corpus = VectorStore(settings.lance_uri), ExtractStore(settings.extract_dir), tmp_path / "corpus"
    corpus.mkdir()
    read = lambda docs: corpus_keywords.keyword_chunk_links(extract, docs)  # noqa: E731
    full = store.indexed_hashes()
    first = li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))
    assert first["keyword_links_mode"] == "rewritten"
    everything = _links_table(store)
    gone, changed = sorted(full)[:2], sorted(full)[2]

    def expected(catalog):
        return {k: v for k, v in li._grouped(read(sorted(catalog))).select("keyword", "chunk_ids").iter_rows()}

    smaller = {d: h for d, h in full.items() if d not in gone}
    report = li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))
    assert report["keyword_links_mode"] == "diff" and report["documents_read"] == 0
    assert report["documents_removed"] == 2 and report["keywords_deleted"] > 0
    assert _links_table(store) == expected(smaller) != everything
    edited = {**smaller, changed: "another version"}  # same chunks, new hash: its keywords are re-read
    report = li.update_keyword_links(store, corpus, li.DocumentLinks(edited, read))
    assert report["documents_read"] == 1 and report["documents_removed"] == 1
    assert _links_table(store) == expected(smaller)
    back = li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))
    assert back["documents_read"] == 3 - 1 + 1 and _links_table(store) == everything  # the 2 gone + `changed`
    assert li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))["keyword_links_mode"] == "unchanged"
    # killed after the table write, before the record's: the record is the old one, and the rerun repairs
    record = (corpus / li.LINK_DOCS_FILE).read_bytes()
    li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))
    (corpus / li.LINK_DOCS_FILE).write_bytes(record)
    li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))
    assert _links_table(store) == expected(smaller)
    # killed after adding documents, before the record's: the table holds links the record does not name, and
    # the rerun leaves them once
    record = (corpus / li.LINK_DOCS_FILE).read_bytes()
    li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))
    (corpus / li.LINK_DOCS_FILE).write_bytes(record)
    assert li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))["documents_read"] == 2
    assert _links_table(store) == everything
    # a record of the former layout (one row per document and keyword) is read, and rewritten one row a document
    per_document = pl.read_parquet(corpus / li.LINK_DOCS_FILE)
    (per_document.explode("keywords", empty_as_null=True).rename({"keywords": "keyword"})  # no keywords: null
     .write_parquet(corpus / li.LINK_DOCS_FILE))
    report = li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))
    assert report["keyword_links_mode"] == "diff" and report["documents_removed"] == 2
    assert _links_table(store) == expected(smaller)
    assert pl.read_parquet(corpus / li.LINK_DOCS_FILE).columns == ["doc_id", "hash", "keywords"]
    # a lost record: the table is rewritten whole, not trusted
    (corpus / li.LINK_DOCS_FILE).unlink()
    assert li.update_keyword_links(store, corpus, li.DocumentLinks(full, read))["keyword_links_mode"] == "rewritten"
    assert _links_table(store) == everything
    # a torn record, or a file of another kind: rewritten whole too, and said why (it failed every update before)
    for damaged in ((corpus / li.LINK_DOCS_FILE).read_bytes()[:200], b"PAR1 not a record PAR1"):
        (corpus / li.LINK_DOCS_FILE).write_bytes(damaged)
        report = li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))
        assert report["keyword_links_mode"] == "rewritten" and "unreadable" in report["keyword_links_reason"]
        assert _links_table(store) == expected(smaller)
    assert li.update_keyword_links(store, corpus, li.DocumentLinks(smaller, read))["keyword_links_mode"] == "unchanged"


def test_a_documents_links_are_told_apart_whatever_its_chunk_order_width():
    """The cheap slice for 5-digit chunk orders and the regex for longer ones drop the same links as the regex
    alone, including a document whose name looks like a chunk id's tail."""
    docs = ["memo.md-0badcafe", "memo-c00001-12345678.md-abcdef12", "x-c1-abcdef12"]
    links = pl.DataFrame([{"keyword": f"k{order % 3}", "chunk_id": chunk_id(doc, order, f"{doc} {order}")}
                          for doc in docs for order in (0, 7, 99_999, 100_000, 1_234_567)])
    for drop in ([], docs[:1], docs[1:], docs):
        kept = li._without_documents(links, drop).sort("chunk_id")
        assert kept.equals(links.filter(~li._document_of(pl.col("chunk_id")).is_in(drop)).sort("chunk_id"))
        assert kept.height == 5 * (len(docs) - len(drop))


# -- the batched hybrid (one LanceDB query per channel for a question and its clauses) ------------------------

COMPOUND = ["Who is the CEO of the engine supplier Kestrel and what did the arbitration award decide?",
            "Which vessel had an engine fault before the board met about the Aberdeen quay?"]


def _per_clause(lance: Retriever) -> Retriever:
    """The same index answered the way it was before batching: each clause's channels on their own."""
    from dataclasses import replace

    from lexgraph.query.lance_backend import LanceBackend, LanceSearch

    search = lance.index.backend.search
    old = LanceSearch(search.store, search.rows, replace(search.params, batched=False))
    return Retriever(replace(lance.index, backend=LanceBackend(old)), lance.embed, lance.params, lance.embed_batch)


def _as_dict(hits) -> dict[int, float]:
    rows, scores = hits
    return {int(r): round(float(s), 9) for r, s in zip(rows, scores)}


def test_batched_hybrid_equals_one_retrieval_per_clause(pair):
    from lexgraph.query.retrieval import sub_queries

    _, lance = pair
    search, old = lance.index.backend.search, _per_clause(lance)
    assert search.params.batched and not old.index.backend.search.params.batched
    for question in [*COMPOUND, *QUESTIONS]:
        texts = [question, *sub_queries(question)]
        vectors = [lance.embed(t) for t in texts]
        # each channel batched gives every text's own hits
        assert [_as_dict(h) for h in search.dense_many(vectors)] == [_as_dict(search.dense(v)) for v in vectors]
        p = lance.params
        assert [_as_dict(h) for h in search.keyword_many(texts, vectors, p.keyword_top, p.keyword_exact_weight,
                                                         p.keyword_evidence_weight)] == \
            [_as_dict(search.keyword(t, v, p.keyword_top, p.keyword_exact_weight, p.keyword_evidence_weight))
             for t, v in zip(texts, vectors)]
        # and the fused ranking is the per-clause one
        batched, per_clause = lance.scores("hybrid", question), old.scores("hybrid", question)
        assert np.array_equal(np.isfinite(batched), np.isfinite(per_clause)), question
        # up to which of two hits tied at a channel's depth cut gets the 1e-6 × weight floor share (ranks_of
        # leaves ties to argpartition; the batched fusion takes the lower row)
        assert np.allclose(batched[np.isfinite(batched)], per_clause[np.isfinite(per_clause)], atol=1.01e-6)
    assert all(len(sub_queries(q)) >= 2 for q in COMPOUND)


@pytest.mark.parametrize("fusion", ["score", "rrf"])
def test_fusion_on_hits_equals_fusion_on_arrays(fusion):
    from lexgraph.query.lance_backend import fuse
    from lexgraph.query.fusion import reciprocal_rank_fusion, score_fusion, spread

    rng = np.random.default_rng(3)
    size, depth = 500, 30
    rankings = []
    for weight in (0.5, 1.0, 0.5, 0.25, 0.5, 0.125):
        rows = rng.choice(size, size=int(rng.integers(0, 60)), replace=False)
        rankings.append((rows, rng.random(len(rows)), weight))
    arrays = [(spread(size, rows, scores), weight) for rows, scores, weight in rankings]
    expected = score_fusion(arrays, size, depth) if fusion == "score" else \
        reciprocal_rank_fusion(arrays, size, 60.0, depth)
    expected[expected <= 0] = -np.inf
    rows, scores = fuse(rankings, fusion, depth, 60.0)
    assert np.all(np.diff(scores) <= 0)  # best first
    assert np.allclose(spread(size, rows, scores), expected, equal_nan=True)
    assert fuse([], fusion, depth, 60.0)[0].size == 0


@pytest.mark.parametrize("question, refused", [
    ("", "empty"), (" \x00\x07\u200b ", "empty"), ("?!" * 10, "no letters"), ("x" * 100_000, "characters long"),
    ("Who\x00 is the\x1b CEO of\u2028 the engine supplier\x7f Kestrel?", None),
    ("O'Brien's \"quoted\" (Kestrel) AND OR NOT * ? : -- ; DROP TABLE chunks", None),
])
def test_bad_questions_get_clean_answers_in_lance_mode(lance_home, monkeypatch, question, refused):
    from lexgraph.query.service import QueryError

    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    service = _service(lance_home)
    if refused:
        with pytest.raises(QueryError, match=refused):
            service.ask(question, route="semantic")
        return
    answer = service.ask(question, route="auto")
    assert isinstance(answer["answer"], str) and answer["route"] in ("semantic", "graph", "agentic")
    assert service.log.lines()[-1]["query_id"] == answer["query_id"]


def test_a_100_kb_text_and_odd_characters_reach_lancedb_cleanly(pair):
    """Past the service's length check (the retriever serves `lexgraph search` and the bench too): a 100 kB
    text, quotes and control characters go through every LanceDB channel without a query-parser error."""
    _, lance = pair
    words = " ".join(f"{w}{i}" for i, w in enumerate(("Kestrel", "O'Brien's", "engine\x00", "quay\x1b")
                                                         * 6000))[:100_000]
    unit = np.zeros(len(lance.embed("probe")), dtype=np.float32)
    unit[0] = 1.0
    for text in (words, "\x00\x01", "'; DROP TABLE chunks; --", "Kestrel's \"engine\" (fault) AND NOT"):
        rows, scores = lance.index.backend.search.hybrid([text], lambda texts: [unit for _ in texts], lance.params, 0)
        assert len(rows) == len(scores) and np.all(np.isfinite(scores))


_SERVICES: dict = {}


def _service(home) -> QueryService:
    """One lance-mode service for the parametrized bad-question test (loading it is the slow part)."""
    if home not in _SERVICES:
        _SERVICES[home] = QueryService(Settings.from_env(home=home), use_llm=False)
    return _SERVICES[home]


def test_nprobes_covers_a_share_of_the_partitions_and_never_less_than_the_floor(pair):
    from dataclasses import replace

    from lexgraph.query.lance_backend import LanceSearch
    from lexgraph.storage import lance_indexes as li

    search = pair[1].index.backend.search
    partitions = li.ann_partitions(search.states[li.ANN_INDEX].indexed)
    assert search.nprobes == max(search.params.nprobes, math.ceil(search.params.probe_share * partitions))
    floor = LanceSearch(search.store, search.rows, replace(search.params, nprobes=1, probe_share=0.5))
    assert floor.nprobes == math.ceil(0.5 * partitions) > 1  # the share wins over a lower floor
    share = LanceSearch(search.store, search.rows, replace(search.params, nprobes=7, probe_share=0.0))
    assert share.nprobes == 7


def test_an_index_from_before_the_graph_tables_is_brought_up_by_the_corpus_job(lance_home, tmp_path, monkeypatch,
                                                                               instance):
    """An index built before the graph tables: the graph_tables step is the only one out of step, it runs alone
    (what `lexgraph ingest` and the corpus sensor do), and the graph route then runs on the lance backend."""
    import json

    from lexgraph.indexing.corpus_state import solo_steps
    from orchestration.definitions import build_definitions
    from orchestration.runner import run_corpus_steps

    monkeypatch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
    home = tmp_path / "old"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home)
    files = LexIndex(settings).corpus_files
    built = json.loads(files.built_from.read_text())
    files.built_from.write_text(json.dumps({k: v for k, v in built.items() if not k.startswith("graph_tables")}))
    files.graph_tables.unlink()
    catalog = VectorStore(settings.lance_uri).indexed_hashes()
    stale = files.stale_steps(catalog, settings)
    assert stale == ["graph_tables"] and solo_steps(stale) == ["graph_tables"]
    assert QueryService(settings, use_llm=False).ask(QUESTIONS[2], route="graph")["route"] == "semantic"
    result = run_corpus_steps(build_definitions(settings), instance, solo_steps(stale))
    assert result.success and files.stale_steps(catalog, settings) == []
    assert QueryService(settings, use_llm=False).ask(QUESTIONS[2], route="graph")["route"] == "graph"


def test_graph_tables_of_an_older_format_say_so_and_are_written_again_by_the_corpus_job(lance_home, tmp_path,
                                                                                         monkeypatch, instance):
    """Tables written before the current format (2: idf columns, no mention or relation rows): the query says what
    to run, the graph_tables step alone is out of step, and it writes them whole."""
    import json

    from lexgraph.indexing.corpus_state import solo_steps
    from lexgraph.query.lance_graph import load_lance_graph
    from orchestration.definitions import build_definitions
    from orchestration.runner import run_corpus_steps

    monkeypatch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
    home = tmp_path / "format2"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home)
    files = LexIndex(settings).corpus_files
    files.graph_tables.write_text(json.dumps({**json.loads(files.graph_tables.read_text()), "format": 2}))
    graph, why = load_lance_graph(VectorStore(settings.lance_uri), files, LanceParams())
    assert graph is None and "older format" in why and "lexgraph ingest" in why
    catalog = VectorStore(settings.lance_uri).indexed_hashes()
    assert files.stale_steps(catalog, settings) == ["graph_tables"]
    result = run_corpus_steps(build_definitions(settings), instance, solo_steps(["graph_tables"]))
    assert result.success and files.stale_steps(catalog, settings) == []
    metadata = result.asset_materializations_for_node("graph_tables")[0].metadata
    assert metadata["decision"].value == "written whole" and "format" in metadata["why_whole"].value
    assert QueryService(settings, use_llm=False).ask(QUESTIONS[2], route="graph")["route"] == "graph"


def test_an_index_from_before_search_text_gets_its_terms_from_the_corpus_job(lance_home, tmp_path, monkeypatch,
                                                                           instance, pair):
    """A chunk table written before search_text, its full-text index over the raw text: the search_indexes step
    is out of step and runs alone, fills every row's terms, builds the terms index and drops the old one."""
    import json

    from lancedb.index import FTS

    from lexgraph.indexing.corpus_state import solo_steps
    from orchestration.definitions import build_definitions
    from orchestration.runner import run_corpus_steps

    monkeypatch.setenv("LEXGRAPH_LANCE_THRESHOLD", "1")
    home = tmp_path / "old"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home)
    table = VectorStore(settings.lance_uri).db.open_table(CHUNKS)
    table.drop_index(li.FTS_INDEX)
    table.drop_columns(["search_text"])
    table.create_index("text", config=FTS(with_position=False), name=li.FORMER_FTS_INDEX)
    files = LexIndex(settings).corpus_files
    built = json.loads(files.built_from.read_text())
    built["search_indexes@settings"] = built["search_indexes@settings"].removesuffix(" full_text=terms")
    files.built_from.write_text(json.dumps(built))
    catalog = VectorStore(settings.lance_uri).indexed_hashes()
    stale = files.stale_steps(catalog, settings)
    assert stale == ["search_indexes"] and solo_steps(stale) == ["search_indexes"]
    assert run_corpus_steps(build_definitions(settings), instance, solo_steps(stale)).success
    table = VectorStore(settings.lance_uri).db.open_table(CHUNKS)
    assert li.rows_without_terms(table) == 0 and files.stale_steps(catalog, settings) == []
    assert {i.name for i in table.list_indices()} == {li.ANN_INDEX, li.FTS_INDEX, li.ID_INDEX}
    embedder = LexIndex(settings).embedder()
    upgraded = Retriever(load_lance_index(settings), embedder.embed_query, None, embedder.embed_queries)
    for question in QUESTIONS:
        _same_bm25(upgraded, pair[0], question)


def test_a_graph_route_question_is_answered_while_another_process_holds_the_graph_writer(lance_home, monkeypatch):
    """The lance backend's graph channels read LanceDB, never Kùzu: an ingest holding the single writer does not
    hold up a question."""
    monkeypatch.setenv("LEXGRAPH_QUERY_BACKEND", "lance")
    settings = Settings.from_env(home=lance_home)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from lexgraph.storage.graph_store import GraphStore\n"
         "with GraphStore.writer(sys.argv[1]):\n    print('holding', flush=True); time.sleep(120)",
         settings.graph_path], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        answer = QueryService(settings, use_llm=False).ask(QUESTIONS[0], route="graph")
        assert answer["route"] == "graph" and answer["citations"]
        assert holder.poll() is None  # still holding it
    finally:
        holder.kill()
        holder.wait()


def test_a_hubs_members_are_read_among_the_questions_nearest_statements(lance_home, tmp_path, monkeypatch, pair):
    """Past MEMBER_CAP a member list is not stored: a hub node's statements are its members among the question's
    nearest statements, a hub entity's chunks its mentions among their chunks, exactly those of the full graph."""
    from lexgraph.query import graph_tables_step, lance_graph, lance_graph_tables
    from lexgraph.query.retrieval_types import RetrievalParams

    monkeypatch.setattr(lance_graph_tables, "MEMBER_CAP", 3)
    monkeypatch.setattr(lance_graph, "FOCUS", 40)
    home = tmp_path / "hubs"
    shutil.copytree(lance_home, home)
    settings = Settings.from_env(home=home, query_backend="lance")
    index = LexIndex(settings)
    graph_tables_step.update_graph_tables(index.corpus_files, index.vectors, index.extract_store, settings)
    graph, why = lance_graph.load_lance_graph(index.vectors, index.corpus_files, LanceParams(nprobes=20))
    assert graph is not None, why
    memory = pair[0].index.graph
    vector = pair[0].embed(QUESTIONS[0])
    near = set(graph.statements.near(vector).tolist())
    assert len(near) == 40
    hub_nodes = [n for n in range(len(memory.statements.link_ids)) if len(memory.statements.link_statements(n)) > 3]
    assert hub_nodes
    for node in hub_nodes[:10]:
        found = set(graph.statements.link_statements(node, vector).tolist())
        assert found == set(memory.statements.link_statements(node).tolist()) & near
        assert graph.statements.link_statements(node).tolist() == []  # no question: a hub is not read whole
    chunk_ids = pair[0].index.chunks["chunk_id"].to_list()
    near_chunks = set(graph.statements.near_chunk_ids(vector))
    hubs = [e for e in range(memory.entities.size) if len(memory.entities.chunks_of([e])[0]) > 3]
    assert hubs
    for entity, chunks in zip(hubs[:10], graph.entities.chunks_of(hubs[:10], vector)):
        expected = {chunk_ids[r] for r in memory.entities.chunks_of([entity])[0].tolist()} & near_chunks
        assert set(chunks.tolist()) == expected
    retriever = Retriever(load_lance_index(settings), pair[0].embed, RetrievalParams(), pair[0].embed_batch)
    for method in ("statement", "entity", "path"):
        assert retriever.search(method, QUESTIONS[0], 5)  # the channels still find evidence through the hubs


def test_a_pq_index_is_probed_by_its_own_size_and_refined_to_exact_distances(tmp_path):
    """ann_probe (the keyword, entity and statement vectors' searches): a share of the table's own partitions,
    and PQ distances re-scored on the stored vectors, so the nearest rows come with their exact cosines."""
    import lancedb
    import pyarrow as pa
    from lancedb.index import IvfFlat, IvfPq

    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(600, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    table = lancedb.connect(tmp_path).create_table("v", data=pa.table({
        "row": np.arange(600), "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 384)}))
    assert li.ann_probe(table, "ann", 8, 0.5, 10) == li.AnnProbe(8, None)  # no index: flat, exact
    table.create_index("vector", config=IvfPq(distance_type="cosine", num_partitions=2, num_sub_vectors=48),
                       name="ann")
    probe = li.ann_probe(table, "ann", 1, 0.5, 10)
    assert probe == li.AnnProbe(math.ceil(0.5 * li.ann_partitions(600)), 10)
    query = vectors[3] + 0.1 * vectors[5]
    exact = 1.0 - vectors @ (query / np.linalg.norm(query))

    def nearest(p):
        found = p.apply(table.search(query).distance_type("cosine").limit(10), 10).select(["row", "_distance"]) \
            .to_arrow()
        return found.column("row").to_numpy(), found.column("_distance").to_numpy()

    rows, distances = nearest(probe)
    assert rows.tolist() == np.argsort(exact)[:10].tolist()
    assert distances == pytest.approx(exact[rows], abs=1e-4)
    _, unrefined = nearest(li.AnnProbe(probe.nprobes, None))
    assert not np.allclose(unrefined, np.sort(exact)[:10], atol=1e-4)  # PQ alone: approximate distances
    table.create_index("vector", config=IvfFlat(distance_type="cosine", num_partitions=2), name="ann", replace=True)
    assert li.ann_probe(table, "ann", 1, 0.5, 10).refine_factor is None
