"""The lexical graph end to end: real Dagster instance, LanceDB, Kùzu, and for the LLM path a real
OpenAI-protocol server on localhost (tests/llm_server.py), never a patched client.

Only skeleton chunks reach the LLM; the cache makes a second run free; a prompt change re-extracts exactly
the skeleton chunks; the selection diff re-extracts only the affected documents (CLI runner and sensor);
entities and facts merge across documents; deleting a document rebuilds the rest without a call; PII is
masked before anything is sent; a failed call keeps the offline extraction.
"""
import dagster as dg
import polars as pl
import pytest

from lexgraph.indexing import lexical_extraction
from lexgraph.indexing.corpus_skeleton import read_selection_diff
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.extract.extraction_cache import ExtractionCache
from lexgraph.extract.llm_extractor import OpenAIExtractor
from lexgraph.extract.pii import PiiMaskingError, mask_pii
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from orchestration.definitions import build_definitions, code_versions
from orchestration.runner import ingest_folder, reextract_index
from tests.helpers import materialized_partitions
from tests.llm_server import chunk_of

MODEL = "lexgraph-test-llm"
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


@pytest.fixture(scope="module")
def llm_server_options() -> dict:
    return {"model": MODEL}


@pytest.fixture
def llm(module_server, no_llm_backoff):
    module_server.reset()
    return module_server


def llm_settings(home, inbox, server, **changes) -> Settings:
    return Settings.from_env(home=home, inbox=inbox, llm_base_url=server.base_url, llm_model=MODEL,
                             **{"beta": 0.5, **changes})


def selected(settings: Settings) -> pl.DataFrame:
    return pl.read_parquet(CorpusFiles(settings.index_dir).skeleton).filter("selected").select("chunk_id", "doc_id")


def chunk_texts(settings: Settings) -> dict[str, str]:
    chunks = pl.read_parquet(settings.extract_dir / "chunks" / "*.parquet")
    return dict(zip(chunks["chunk_id"], chunks["text"]))


def sent(server, since: int = 0) -> list[str]:
    """The chunk texts the server was asked about (from call number `since` on)."""
    return [chunk_of(body)[1] for body in server.requests[since:]]


def query(settings: Settings, cypher: str) -> pl.DataFrame:
    graph = GraphStore(settings.graph_path)
    try:
        return graph.query(cypher)
    finally:
        graph.close()


def extraction_ledger(settings: Settings) -> pl.DataFrame:
    return CostLedger(settings.ledger_dir).read().filter(pl.col("stage") == "extraction")


def test_only_skeleton_chunks_reach_the_llm_then_cache_and_prompt_versions(tiny_corpus, home, instance, llm, capsys,
                                                                           monkeypatch):
    secret = "sk-test-key-never-in-metadata"
    monkeypatch.setenv("LEXGRAPH_LLM_API_KEY", secret)
    settings = llm_settings(home, tiny_corpus, llm)
    report = ingest_folder(tiny_corpus, instance, settings=settings, progress=False)
    assert report.failed == {} and report.corpus_index_ok
    skeleton, texts = selected(settings), chunk_texts(settings)
    assert 0 < skeleton.height < len(texts)
    # exactly the skeleton chunks were sent, once each (the first ingest ran before any skeleton existed, so
    # they reached the LLM through the selection diff's re-extraction)
    assert llm.calls == skeleton.height
    assert sorted(sent(llm)) == sorted(texts[c] for c in skeleton["chunk_id"])
    assert set(report.reextracted) == set(skeleton["doc_id"])
    extractions = pl.read_parquet(settings.extract_dir / "extractions" / "*.parquet")
    assert sorted(extractions["chunk_id"]) == sorted(texts)  # every chunk has one extraction
    by_llm = extractions.filter(pl.col("extractor") == "openai")
    assert set(by_llm["chunk_id"]) == set(skeleton["chunk_id"]) and set(by_llm["outcome"]) == {"ok"}
    assert set(by_llm["prompt_version"]) == {lexical_extraction.llm_prompt_version(settings)}
    assert set(extractions.filter(pl.col("extractor") != "openai")["extractor"]) == {"nlp"}
    # provenance on the nodes: LLM statements come from skeleton chunks, offline ones from the rest
    rows = query(settings, "MATCH (s:Statement)-[:EXTRACTED_FROM]->(c:Chunk) RETURN s.extractor AS extractor, "
                           "s.model AS model, s.prompt_version AS version, c.in_skeleton AS skeleton")
    assert set(rows.filter(pl.col("extractor") == "openai")["skeleton"]) == {True}
    assert set(rows.filter(pl.col("extractor") == "nlp")["skeleton"]) == {False}
    assert set(rows.filter(pl.col("extractor") == "openai")["model"]) == {MODEL}
    assert query(settings, f"MATCH (e:Entity) WHERE e.model CONTAINS '{MODEL}' RETURN count(e) AS n")["n"][0] > 0
    # every call is a ledger row with its tokens
    calls = extraction_ledger(settings)
    assert calls.height == skeleton.height and not calls["cache_hit"].any()
    assert calls["prompt_tokens"].sum() > 0 and calls["completion_tokens"].sum() > 0
    assert set(calls["model"]) == {MODEL}

    # a second ingest of the same files: nothing to do, no call
    again = ingest_folder(tiny_corpus, instance, settings=settings, progress=False)
    assert (again.new, again.changed, again.reextracted) == (0, 0, [])
    assert llm.calls == skeleton.height

    # re-running every document's extraction (a UI backfill at the same code version): cache hits only
    defs = build_definitions(settings)
    keys = instance.get_dynamic_partitions("documents")
    result = defs.resolve_job_def("extract_documents").execute_in_process(
        instance=instance, tags={RANGE_START: keys[0], RANGE_END: keys[-1]})
    assert result.success and llm.calls == skeleton.height
    totals = CostLedger(settings.ledger_dir).totals(by=["stage"], run_id=result.run_id).row(0, named=True)
    assert (totals["calls"], totals["cache_hits"], totals["requests"]) == (skeleton.height, skeleton.height, 0)
    # each partition's materialization describes its own document's extraction
    doc = skeleton["doc_id"][0]
    record = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=dg.AssetKey("chunk_extractions"), asset_partitions=[doc]), limit=1).records[0]
    meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta["doc_id"] == doc and meta["skeleton_chunks"] == skeleton.filter(pl.col("doc_id") == doc).height
    assert meta["cache_hits"] == meta["skeleton_chunks"] and meta["llm_calls"] == 0
    assert MODEL in meta["model"].split(", ")  # the models its rows were made by (its other chunks: nlp)

    from orchestration.cli import main

    assert main(["--home", str(home), "status"]) == 0
    out = capsys.readouterr().out
    statements = query(settings, "MATCH (s:Statement) RETURN count(s) AS n")["n"][0]
    assert f"Statement: {statements}  Topic: " in out and statements > 0
    assert f"skeleton: {skeleton.height} of {len(texts)} chunks selected" in out
    assert f"LLM calls so far: {skeleton.height} ({skeleton.height} cache hits" in out
    assert main(["--home", str(home), "cost"]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:3] == ["extraction", MODEL, str(2 * skeleton.height)] for line in out.splitlines())
    assert any(line.split()[:1] == ["embedding"] for line in out.splitlines())

    # a prompt change (other entity types) is a new code version, and `reextract` re-extracts exactly the
    # skeleton chunks; run again, it finds nothing left to do
    changed = settings.with_(entity_types=("person", "organization", "location", "other"))
    assert lexical_extraction.llm_prompt_version(changed) != lexical_extraction.llm_prompt_version(settings)
    old, new = code_versions(settings), code_versions(changed)
    assert {name for name in old if old[name] != new[name]} == {
        "chunk_extractions", "document_statements", "document_topics", "document_facts", "document_entities",
        "lexical_graph"}
    before = llm.calls
    redone = reextract_index(instance, changed, progress=False)
    assert set(redone.documents) == set(skeleton["doc_id"]) and redone.failed == {}
    assert llm.calls - before == redone.llm_calls == skeleton.height
    assert sorted(sent(llm, before)) == sorted(texts[c] for c in skeleton["chunk_id"])
    assert redone.lexical_ok
    versions = query(settings, "MATCH (s:Statement) WHERE s.extractor = 'openai' RETURN DISTINCT s.prompt_version AS v")
    assert versions["v"].to_list() == [lexical_extraction.llm_prompt_version(changed)]
    assert reextract_index(instance, changed, progress=False).documents == {} and llm.calls - before == skeleton.height
    # the console command, under the same settings from the environment, agrees: nothing left to do
    for variable, value in {"LEXGRAPH_LLM_BASE_URL": llm.base_url, "LEXGRAPH_LLM_MODEL": MODEL, "LEXGRAPH_BETA": "0.5",
                            "LEXGRAPH_ENTITY_TYPES": "person,organization,location,other"}.items():
        monkeypatch.setenv(variable, value)
    assert main(["--home", str(home), "reextract", "--quiet"]) == 0
    assert "nothing to do" in capsys.readouterr().out and llm.calls - before == skeleton.height
    # the API key was used, and is nowhere in what Dagster recorded
    assert settings.llm_api_key == secret
    for run in instance.get_runs():
        assert secret not in str(run.run_config) and secret not in str(run.tags)
        assert all(secret not in str(record) for record in instance.all_logs(run.run_id))


def test_selection_diff_reextracts_only_the_affected_documents(tiny_corpus, home, instance, llm):
    settings = llm_settings(home, tiny_corpus, llm)
    ingest_folder(tiny_corpus, instance, settings=settings, progress=False)
    files = CorpusFiles(settings.index_dir)
    before_selection, calls = set(selected(settings)["chunk_id"]), llm.calls
    extracted = materialized_partitions(instance, "chunk_extractions")

    # the CLI path: a new document changes the selection; the runner re-extracts the documents with newly
    # selected chunks, and only those chunks call the LLM
    (tiny_corpus / "epsilon.md").write_text("# Epsilon\n\nEpsilon Freight leased two vessels from Alpha Shipping "
                                            "in Bergen under contract C-7.\n\nBolt Engines services them in Kiel.\n")
    report = ingest_folder(tiny_corpus, instance, settings=settings, progress=False)
    diff = read_selection_diff(files)
    now = selected(settings)
    newly = set(now["chunk_id"]) - before_selection
    assert newly and set(diff["newly_selected"]) == newly
    affected = set(now.filter(pl.col("chunk_id").is_in(list(newly)))["doc_id"])
    assert set(report.reextracted) == affected and len(affected) < len(instance.get_dynamic_partitions("documents"))
    texts = chunk_texts(settings)
    assert sorted(sent(llm, calls)) == sorted(texts[c] for c in newly)
    epsilon = [k for k in instance.get_dynamic_partitions("documents") if k.startswith("epsilon")][0]
    added = materialized_partitions(instance, "chunk_extractions")[len(extracted):]
    assert sorted(added) == sorted([epsilon, *affected])  # its own ingestion, then one re-extraction each
    assert report.lexical_run is not None
    # the rebuilt lexical graph holds the newly selected chunks' LLM statements, and LLM statements only of
    # skeleton chunks
    openai_chunks = set(query(settings, "MATCH (s:Statement) WHERE s.extractor = 'openai' RETURN s.chunk_id AS c")["c"])
    assert newly <= openai_chunks <= set(now["chunk_id"])

    # the daemon path: a corpus run publishes a diff; the re-extraction sensor requests runs for exactly its
    # documents, then the corpus sensor rebuilds only the lexical graph
    from orchestration.sensors import corpus_index_sensor, reextraction_sensor

    (tiny_corpus / "zeta.md").write_text("# Zeta\n\nZeta Holdings bought Bolt Engines in 2025.\n")
    ingest_folder(tiny_corpus, instance, settings=settings, progress=False, corpus=False)
    defs = build_definitions(settings)
    previous = set(selected(settings)["chunk_id"])
    assert defs.resolve_job_def("build_corpus_index").execute_in_process(instance=instance).success
    newly = set(selected(settings)["chunk_id"]) - previous
    calls = llm.calls

    def tick(sensor, cursor=None):
        with dg.build_sensor_context(instance=instance, cursor=cursor, resources=defs.resources,
                                     repository_def=defs.get_repository_def()) as context:
            return sensor.evaluate_tick(context)

    requested = tick(reextraction_sensor)
    affected = set(selected(settings).filter(pl.col("chunk_id").is_in(list(newly)))["doc_id"])
    keys = instance.get_dynamic_partitions("documents")
    covered = {k for r in requested.run_requests
               for k in keys[keys.index(r.tags[RANGE_START]): keys.index(r.tags[RANGE_END]) + 1]}
    assert covered == affected and all(r.job_name == "extract_documents" for r in requested.run_requests)
    assert tick(reextraction_sensor, requested.cursor).skip_message  # the same diff is requested once
    for request in requested.run_requests:
        assert defs.resolve_job_def(request.job_name).execute_in_process(instance=instance, tags=request.tags).success
    assert llm.calls - calls == len(newly)
    [follow] = tick(corpus_index_sensor).run_requests
    # the lexical graph, and the LanceDB tables the lance backend reads it from
    assert follow.asset_selection == [dg.AssetKey("lexical_graph"), dg.AssetKey("graph_tables")]
    assert defs.resolve_job_def(follow.job_name).execute_in_process(
        instance=instance, asset_selection=follow.asset_selection).success
    assert tick(corpus_index_sensor).skip_message.startswith("corpus index is current")


def test_entities_and_facts_merge_across_documents_and_deletion_rebuilds_without_calls(tmp_path, home, instance, llm):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "contract.txt").write_text("Kestrel Propulsion GmbH supplies engines to Halvorsen Shipping AS.\n")
    (inbox / "email.txt").write_text("The Kestrel Propulsion supplies engines to Halvorsen Shipping.\n\n"
                                     "Marta Nowak reported the fault.\n")
    (inbox / "notes.md").write_text("# Notes\n\nBergen Yard repaired the Nordlys Spirit.\n")
    settings = llm_settings(home, inbox, llm, beta=1.0)
    assert ingest_folder(inbox, instance, settings=settings, progress=False).failed == {}
    assert llm.calls == len(chunk_texts(settings))  # β = 1: every chunk

    kestrel = query(settings, "MATCH (e:Entity) WHERE e.name STARTS WITH 'Kestrel' RETURN e.id AS id, e.name AS name, "
                              "e.aliases AS aliases, e.documents AS documents, e.model AS model")
    assert kestrel.height == 1, kestrel
    assert set(kestrel["aliases"][0]) == {"Kestrel Propulsion GmbH", "Kestrel Propulsion"}
    assert kestrel["documents"][0] == 2 and kestrel["model"][0] == MODEL
    merges = pl.read_parquet(CorpusFiles(settings.index_dir).entity_merges)
    merge = merges.filter(pl.col("entity_id") == kestrel["id"][0]).row(0, named=True)
    assert merge["reason"] == "legal suffix GmbH" and len(merge["doc_ids"]) == 1
    shared = query(settings, "MATCH (e:Entity)-[:SUBJECT]->(f:Fact)-[:SUPPORTS]->(s:Statement) WHERE e.id = '"
                             + kestrel["id"][0] + "' RETURN f.id AS fact, f.statements AS n, f.extractor AS extractor, "
                             "collect(DISTINCT s.doc_id) AS docs")
    assert shared.height == 1 and shared["n"][0] == 2 and len(shared["docs"][0]) == 2
    assert shared["extractor"][0] == "openai"
    assert query(settings, "MATCH (e:Entity {name: 'Marta Nowak'})-[m:MENTIONED_IN]->(:Chunk) "
                           "RETURN m.description AS d")["d"][0] == "Marta Nowak reported the fault."
    assert query(settings, "MATCH (:Entity)-[r:RELATED]->(:Entity) RETURN count(r) AS n")["n"][0] > 0
    vectors = VectorStore(settings.lance_uri)
    assert vectors.count("statements") == query(settings, "MATCH (s:Statement) RETURN count(s) AS n")["n"][0]
    assert vectors.count("entities") == query(settings, "MATCH (e:Entity) RETURN count(e) AS n")["n"][0]

    # deleting the e-mail: what only it supported goes, the rest is rebuilt from Parquet with no call
    calls = llm.calls
    (inbox / "email.txt").unlink()
    report = ingest_folder(inbox, instance, settings=settings, prune=True, progress=False)
    assert report.removed == 1 and report.corpus_index_ok and llm.calls == calls
    email = [d for d in report_docs(settings) if d.startswith("email")]
    assert email == []
    assert query(settings, "MATCH (e:Entity {name: 'Marta Nowak'}) RETURN count(e) AS n")["n"][0] == 0
    assert query(settings, "MATCH (s:Statement) WHERE s.doc_id STARTS WITH 'email' RETURN count(s) AS n")["n"][0] == 0
    kept = query(settings, "MATCH (e:Entity)-[:SUBJECT]->(f:Fact) WHERE e.name STARTS WITH 'Kestrel' "
                           "RETURN e.aliases AS aliases, f.statements AS n")
    assert kept["aliases"].to_list() == [["Kestrel Propulsion GmbH"]] and kept["n"].to_list() == [1]
    assert pl.read_parquet(CorpusFiles(settings.index_dir).entity_merges).filter(
        pl.col("entity_id") == kestrel["id"][0]).height == 0
    assert vectors.count("statements", "doc_id LIKE 'email%'") == 0
    assert vectors.count("entities", "name = 'Marta Nowak'") == 0


def report_docs(settings: Settings) -> list[str]:
    return VectorStore(settings.lance_uri).sources()["doc_id"].to_list()


def test_pii_is_masked_before_anything_reaches_the_llm(tmp_path, home, instance, llm):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    source = ("# Contact\n\nAnnika Vogt can be reached at annika.vogt@kestrel.example or +49 40 1234 5678.\n\n"
              "Her resident registration number is 900101-1234567 and her card is 4111 1111 1111 1111.\n")
    (inbox / "contact.md").write_text(source)
    settings = llm_settings(home, inbox, llm, beta=1.0, pii_masking="on")
    assert lexical_extraction.llm_prompt_version(settings) != lexical_extraction.llm_prompt_version(settings.with_(pii_masking="off"))
    assert ingest_folder(inbox, instance, settings=settings, progress=False).failed == {}
    assert llm.calls >= 1
    seen = llm.all_text()
    for secret in ("annika.vogt@kestrel.example", "1234 5678", "900101-1234567", "4111 1111 1111 1111"):
        assert secret not in seen, secret
    for placeholder in ("[EMAIL]", "[PHONE]", "[NATIONAL_ID]", "[CARD]"):
        assert placeholder in seen, placeholder
    # the stored source and chunk text are untouched
    stored = pl.read_parquet(settings.extract_dir / "sources" / "*.parquet")["text"][0]
    assert "annika.vogt@kestrel.example" in stored
    assert "annika.vogt@kestrel.example" in "".join(query(settings, "MATCH (c:Chunk) RETURN c.text AS t")["t"])


def test_failed_calls_keep_the_offline_extraction_and_a_failed_masking_sends_nothing(tmp_path, llm, monkeypatch):
    monkeypatch.setenv("LEXGRAPH_LLM_MAX_RETRIES", "1")
    settings = Settings.from_env(home=tmp_path / "home", llm_base_url=llm.base_url, llm_model=MODEL)
    store = ExtractStore(settings.extract_dir)
    texts = {"d1": ["Kestrel Propulsion GmbH builds engines.", "FAILME Bolt Engines is in Kiel."],
             "d2": ["Dana Frost runs Bolt Engines.", "The SECRET plan names Alpha Shipping."]}
    for doc, chunks in texts.items():
        store.write("chunks", doc, pl.DataFrame({"chunk_id": [f"{doc}-c{i}" for i in range(len(chunks))],
                                                 "doc_id": doc, "text": chunks, "heading_path": ""}))
    skeleton = {f"{doc}-c{i}" for doc, chunks in texts.items() for i in range(len(chunks))}
    cache, ledger = ExtractionCache(settings.extraction_cache_dir), CostLedger(settings.ledger_dir)
    llm.fail_when("FAILME", "500")
    extractor = lexical_extraction.llm_extractor(settings)
    result = lexical_extraction.extract_documents(["d1"], store, skeleton, extractor, lexical_extraction.offline_extractor(settings),
                                       cache, ledger, "run-1")
    rows = {r["chunk_id"]: r for r in store.read("extractions", "d1").iter_rows(named=True)}
    assert rows["d1-c0"]["extractor"] == "openai" and rows["d1-c0"]["outcome"] == "ok"
    failed = rows["d1-c1"]
    assert failed["extractor"] == "nlp" and failed["outcome"].startswith("failed") and "500" in failed["error"]
    assert "Bolt Engines" in failed["extraction"]  # the offline extraction, not nothing
    assert result.figures["d1"]["llm_failures"] == 1 and result.figures["d1"]["llm_calls"] == 2
    recorded = ledger.read().filter(pl.col("chunk_id") == "d1-c1").row(0, named=True)
    assert recorded["outcome"].startswith("failed") and recorded["attempts"] == 2  # first try and one retry
    assert ExtractionCache(settings.extraction_cache_dir).get(  # a failure is never cached
        lexical_extraction.key_for(extractor.cache_text(lexical_extraction.chunk_inputs(store.read("chunks", "d1"))[1]), MODEL,
                        extractor.prompt_version)) is None

    def masker(text):
        if "SECRET" in text:
            raise PiiMaskingError("cannot mask this text")
        return mask_pii(text)

    calls = llm.calls
    masked = OpenAIExtractor(lexical_extraction.llm_config(settings), masker=masker)
    result = lexical_extraction.extract_documents(["d2"], store, skeleton, masked, lexical_extraction.offline_extractor(settings),
                                       cache, ledger, "run-2", masker=masker)
    assert llm.calls == calls  # neither of the document's chunks was sent
    assert "PII masking failed" in result.figures["d2"]["not_sent"]
    rows = store.read("extractions", "d2")
    assert set(rows["extractor"]) == {"nlp"} and set(rows["outcome"]) == {"not sent: masking failed"}
    assert rows["error"].str.contains("cannot mask this text").all()
