"""LLM faults never lose a night's run: real Dagster runs against the local OpenAI-protocol server
(tests/llm_server.py) while it injects faults, never a patched client.

- A storm over 100 documents (timeouts, a run of 429s, malformed JSON): the run completes, every failed
  call is a ledger row with its reason, the failed chunks keep their offline extraction, and the next
  run sends exactly those chunks again and nothing that succeeded (cache hits).
- An endpoint that is down opens the circuit breaker after exactly N failed calls; no request follows,
  the remaining chunks are refused at no cost, each a ledger row, and the run's metadata says so. After
  the cool-down one probe is let through (half-open), and its success closes the breaker.
- `kill -9` in the middle of an extraction run, then the same command again: the stores equal a clean
  build, nothing is duplicated, and no call is paid for twice (the cache holds what the dead run paid);
  the next night's `lexgraph ingest` sends the one chunk that failed, and nothing else.

The storm writes its documents' chunks straight into the extract store and runs the extraction job as
`lexgraph ingest` does after the corpus update: reading, embedding and the corpus index make no LLM
call, and over 100 documents they would take minutes. Backoffs, timeouts and Retry-After are tiny: a
failed call costs milliseconds, a timeout TIMEOUT per request.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from lexgraph.indexing import lexical, lexical_extraction, lexical_tables, pipeline
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.extract.extraction_cache import ExtractionCache
from lexgraph.extract.llm_client import CIRCUIT_OPEN, LLMFailure, StructuredLLM
from lexgraph.extract.llm_config import LLMConfig
from lexgraph.extract.schemas import extraction_model
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings, SettingsError
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from orchestration.definitions import build_definitions
from orchestration.reextraction import mark_handled, selection_reextraction
from orchestration.runner import run_extractions
from tests.llm_server import LLMTestServer, chunk_of
from tests.conftest import cleared_variables

FIXTURE_MARKS = {"heuristic_index": ("ingest",)}  # marks by fixture (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
MODEL = "lexgraph-test-llm"
# Tiny waits: a failed call costs milliseconds, except a timeout, which costs TIMEOUT per request.
TIMEOUT = 0.5
FAST = {"LEXGRAPH_LLM_TIMEOUT": str(TIMEOUT), "LEXGRAPH_LLM_MAX_RETRIES": "2", "LEXGRAPH_LLM_VALIDATION_RETRIES": "1",
        "LEXGRAPH_LLM_BACKOFF": "0.001", "LEXGRAPH_LLM_BACKOFF_MAX": "0.01"}


@pytest.fixture(scope="module")
def llm_server_options() -> dict:
    return {"model": MODEL, "max_lifetime": 1200, "timeout_seconds": TIMEOUT + 1}


@pytest.fixture
def llm(module_server, monkeypatch):
    module_server.reset()
    for variable in [v for v in os.environ if v.startswith("LEXGRAPH_LLM_")]:
        monkeypatch.delenv(variable)
    for variable, value in FAST.items():
        monkeypatch.setenv(variable, value)
    return module_server


# --- a synthetic index: chunks and a skeleton selection, as the ingestion and the corpus job leave them ----------


def doc_id(i: int) -> str:
    return f"doc-{i:03d}"


def paragraph(i: int, part: str = "a") -> str:
    """One short paragraph; `Ref007a` marks it for the server's fault rules (zero-padded: no marker is a
    prefix of another)."""
    return (f"Ref{i:03d}{part}: Company{i} Holdings signed contract C-{i} with Supplier{i} Engines in Bergen. "
            "Delivery is due in May.")


def write_index(settings: Settings, docs: dict[str, list[str]]) -> None:
    """Each document's chunks in the extract store, every chunk selected (β = 1.0), and the selection diff
    that newly selects them: what `lexgraph ingest` leaves before it sends the skeleton to the LLM."""
    store = ExtractStore(settings.extract_dir)
    for doc, texts in docs.items():
        rows = [{"chunk_id": f"{doc}-c{n}", "doc_id": doc, "order": n, "text": text, "char_start": 0,
                 "char_end": len(text), "heading_path": "", "token_count": len(text.split()), "source_path": f"{doc}.txt",
                 "content_hash": "0" * 64, "page_start": None, "page_end": None} for n, text in enumerate(texts)]
        store.write(pipeline.CHUNKS, doc, pl.DataFrame(rows, schema=pipeline.CHUNK_COLUMNS))
    files = CorpusFiles(settings.index_dir)
    files.root.mkdir(parents=True, exist_ok=True)
    chunks = [(f"{doc}-c{n}", doc) for doc, texts in docs.items() for n in range(len(texts))]
    pl.DataFrame({"chunk_id": [c for c, _ in chunks], "doc_id": [d for _, d in chunks],
                  "selected": [True] * len(chunks)}).write_parquet(files.skeleton)
    files.skeleton_diff.write_text(json.dumps({"newly_selected": [c for c, _ in chunks], "left": []}))


def nightly_extraction(settings: Settings, instance: dg.DagsterInstance, catalog: list[str]) -> tuple[list[str], list]:
    """What `lexgraph ingest` does after the corpus update (orchestration.runner.follow_selection): the documents
    the selection diff and earlier failures ask for, re-extracted in batched Dagster runs. -> (documents, results)"""
    digest, doc_ids = selection_reextraction(settings, catalog)
    if not doc_ids:
        return [], []
    defs = build_definitions(settings)
    runs, failed, ok = run_extractions(defs, instance, doc_ids, {"lexgraph/reextraction": "test"})
    assert failed == {} and ok, failed  # the runs complete whatever the LLM did
    mark_handled(CorpusFiles(settings.index_dir), digest)
    return doc_ids, [instance.get_run_by_id(run) for run in runs]


def extraction_rows(settings: Settings, runs: list | None = None) -> pl.DataFrame:
    """The extraction stage's ledger rows (of these runs)."""
    rows = CostLedger(settings.ledger_dir).read().filter(pl.col("stage") == lexical_extraction.EXTRACTION_STAGE)
    return rows if runs is None else rows.filter(pl.col("run_id").is_in([run.run_id for run in runs]))


def extractions(settings: Settings) -> dict[str, dict]:
    frame = pl.read_parquet(settings.extract_dir / pipeline.EXTRACTIONS / "*.parquet")
    assert frame["chunk_id"].is_unique().all()  # one extraction per chunk, never two
    return {row["chunk_id"]: row for row in frame.iter_rows(named=True)}


def sent_chunks(server: LLMTestServer, since: int = 0) -> list[str]:
    """The chunk texts of the chat-completion requests from number `since` on (retries included)."""
    return [chunk_of(body)[1] for body in server.requests[since:]]


def run_metadata(instance: dg.DagsterInstance, run_id: str) -> dict:
    """The chunk_extractions metadata of the run's first partition: the batch figures are on every one."""
    for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = event.dagster_event.step_materialization_data.materialization
        if materialization.asset_key == dg.AssetKey("chunk_extractions"):
            return {k: v.value for k, v in materialization.metadata.items()}
    raise AssertionError(f"run {run_id} materialized no chunk_extractions")


def warnings_of(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.level == 30 and e.user_message]


# --- the storm ---------------------------------------------------------------------------------------------------

N_DOCS = 100
# The failing documents come in two contiguous ranges (the next run re-extracts each range in one Dagster run),
# never five failed calls in a row (the circuit breaker's default would open).
STORM_429 = 14          # consecutive 429s from the first request: documents 0-3 fail (3 tries each), 4 gets through
TIMEOUT_ALWAYS = (5,)   # every request stalls past the client's timeout
TIMEOUT_ONCE = (40,)
MALFORMED_ALWAYS = (6, 7, 8)  # the answer is never JSON, re-asked once
MALFORMED_ONCE = (30, 60, 90)
TWO_CHUNKS = (5, 6)     # a failing chunk and one that succeeds: the next run must not pay for the second again


@pytest.mark.ingest
def test_a_storm_over_100_documents_completes_and_the_next_run_retries_exactly_the_failed_chunks(
        tmp_path, llm):
    settings = Settings.from_env(home=tmp_path / "home", llm_base_url=llm.base_url, llm_model=MODEL, beta=1.0)
    docs = {doc_id(i): [paragraph(i)] + ([paragraph(i, "b")] if i in TWO_CHUNKS else []) for i in range(N_DOCS)}
    write_index(settings, docs)
    catalog = sorted(docs)
    text_of = {f"{doc}-c{n}": text for doc, texts in docs.items() for n, text in enumerate(texts)}

    llm.fail_next(429, times=STORM_429, retry_after=0.001)
    for i in TIMEOUT_ALWAYS:
        llm.fail_when(f"Ref{i:03d}a", "timeout")
    for i in TIMEOUT_ONCE:
        llm.fail_when(f"Ref{i:03d}a", "timeout", times=1)
    for i in MALFORMED_ALWAYS:
        llm.fail_when(f"Ref{i:03d}a", "malformed")
    for i in MALFORMED_ONCE:
        llm.fail_when(f"Ref{i:03d}a", "malformed", times=1)

    with dg.DagsterInstance.ephemeral() as instance:
        done, runs = nightly_extraction(settings, instance, catalog)
        assert done == catalog and len(runs) == 1 and runs[0].is_success  # the run completes
        run = runs[0].run_id

        # what the server saw: every chunk, plus exactly the retries the faults called for
        failed_429 = [f"{doc_id(i)}-c0" for i in range(4)]
        failed_timeout = [f"{doc_id(i)}-c0" for i in TIMEOUT_ALWAYS]
        failed_malformed = [f"{doc_id(i)}-c0" for i in MALFORMED_ALWAYS]
        failed = sorted(failed_429 + failed_timeout + failed_malformed)
        requests = Counter(sent_chunks(llm))
        expected = {text: 1 for text in text_of.values()}
        expected.update({text_of[c]: 3 for c in failed_429 + failed_timeout})  # first try and 2 retries
        expected[text_of[f"{doc_id(4)}-c0"]] = 3  # the storm's last two 429s, then an answer
        expected.update({text_of[c]: 2 for c in failed_malformed})  # asked, and re-asked once
        expected.update({paragraph(i): 2 for i in TIMEOUT_ONCE + MALFORMED_ONCE})
        assert requests == expected
        assert Counter(llm.served) == {"ok": len(text_of) - len(failed), "429": STORM_429, "timeout": 3 + 1, "malformed": 6 + 3}

        # every failure is a ledger row with its reason; every request is counted
        ledger = extraction_rows(settings, runs)
        assert ledger.height == len(text_of) and not ledger["cache_hit"].any()
        assert Counter(ledger["outcome"]) == {
            "ok": len(text_of) - len(failed),
            "failed: rate limited (429) after 3 tries": 4,
            "failed: timeout after 3 tries": 1,
            "failed: malformed output after 2 attempts": 3}
        assert ledger["attempts"].sum() == llm.calls
        assert sorted(ledger.filter(pl.col("outcome") != "ok")["chunk_id"]) == failed
        assert ledger["prompt_tokens"].sum() > 0 and set(ledger["model"]) == {MODEL}

        # the failed chunks keep their offline extraction, with the failure on their row; the rest are the LLM's
        rows = extractions(settings)
        assert sorted(rows) == sorted(text_of)
        for chunk, row in rows.items():
            if chunk in failed:
                assert row["extractor"] == "nlp" and row["outcome"].startswith("failed: ") and row["error"]
                assert "Supplier" in row["extraction"]  # the offline extraction, not nothing
            else:
                assert (row["extractor"], row["model"], row["outcome"]) == ("openai", MODEL, "ok"), chunk
        statements = pl.read_parquet(settings.extract_dir / pipeline.STATEMENTS / "*.parquet")
        assert set(statements["chunk_id"]) == set(text_of)  # every chunk has statements, failed or not

        # only the LLM's answers are cached, never a fallback
        cache = ExtractionCache(settings.extraction_cache_dir)
        cached = sorted(meta["chunk_id"] for _, meta in cache.items())
        assert cached == sorted(set(text_of) - set(failed))

        # the run says so: its metadata counts the failures by reason, the breaker stayed closed
        meta = run_metadata(instance, run)
        assert meta["batch_llm_failures"] == len(failed) and meta["batch_llm_refused_circuit_open"] == 0
        assert meta["batch_llm_failure_reasons"] == {"malformed output after 2 attempts": 3,
                                                     "rate limited (429) after 3 tries": 4, "timeout after 3 tries": 1}
        assert meta["batch_llm_calls"] == len(text_of) and meta["batch_llm_requests"] == llm.calls
        assert meta["llm_circuit_breaker"]["state"] == "closed" and meta["llm_circuit_breaker"]["opens"] == 0

        # the next run, the endpoint well again: exactly the failed chunks are sent, once each; the chunks that
        # succeeded (the second chunks of documents 10 and 20 among them) are cache hits, never paid twice
        llm.clear_faults()
        before = llm.calls
        done, runs = nightly_extraction(settings, instance, catalog)
        assert done == sorted({chunk.rsplit("-c", 1)[0] for chunk in failed}) and len(runs) == 2
        assert sorted(sent_chunks(llm, before)) == sorted(text_of[c] for c in failed)
        assert all(r.is_success for r in runs)  # (one run per contiguous range of documents)
        again = extraction_rows(settings, runs)
        assert sorted(again.filter(~pl.col("cache_hit"))["chunk_id"]) == failed
        assert set(again.filter(~pl.col("cache_hit"))["outcome"]) == {"ok"}
        assert sorted(again.filter(pl.col("cache_hit"))["chunk_id"]) == [f"{doc_id(i)}-c1" for i in TWO_CHUNKS]
        rows = extractions(settings)
        assert {(r["extractor"], r["outcome"]) for r in rows.values()} == {("openai", "ok")}
        assert len(list(cache.items())) == len(text_of)

        # and the night after: nothing left to retry, no call
        before = llm.calls
        assert nightly_extraction(settings, instance, catalog) == ([], []) and llm.calls == before


# --- the circuit breaker ------------------------------------------------------------------------------------------


@pytest.mark.ingest
def test_a_down_endpoint_opens_the_breaker_after_exactly_n_failed_calls_then_nothing_is_sent(
        tmp_path, llm, monkeypatch):
    monkeypatch.setenv("LEXGRAPH_LLM_BREAKER_FAILURES", "3")
    monkeypatch.setenv("LEXGRAPH_LLM_MAX_RETRIES", "1")
    settings = Settings.from_env(home=tmp_path / "home", llm_base_url=llm.base_url, llm_model=MODEL, beta=1.0)
    docs = {doc_id(i): [paragraph(i)] for i in range(12)}
    write_index(settings, docs)
    llm.fail_every(1, 503)  # the endpoint answers every request with 503

    with dg.DagsterInstance.ephemeral() as instance:
        done, runs = nightly_extraction(settings, instance, sorted(docs))
        assert len(done) == 12 and runs[0].is_success
        run = runs[0].run_id
        # three calls of two requests each, then not one more request
        assert llm.calls == 3 * 2 and set(llm.served) == {"503"}
        ledger = extraction_rows(settings, runs)
        assert Counter(ledger["outcome"]) == {"failed: server error (503) after 2 tries": 3,
                                              f"failed: {CIRCUIT_OPEN}": 9}
        refused = ledger.filter(pl.col("outcome") == f"failed: {CIRCUIT_OPEN}")
        assert refused["attempts"].sum() == 0 and refused["prompt_tokens"].sum() == 0  # nothing sent, nothing paid
        assert sorted(refused["chunk_id"]) == [f"{doc_id(i)}-c0" for i in range(3, 12)]
        rows = extractions(settings)
        assert {r["extractor"] for r in rows.values()} == {"nlp"}  # every chunk keeps an extraction
        assert all("circuit breaker open after 3 consecutive failed calls" in rows[c]["error"]
                   for c in refused["chunk_id"])
        # and it says so: a warning in the run's log, the breaker's state in the metadata
        meta = run_metadata(instance, run)
        breaker = meta["llm_circuit_breaker"]
        assert (breaker["state"], breaker["opens"], breaker["refused_calls"], breaker["probes"]) == ("open", 1, 9, 0)
        assert breaker["last_failure"] == "server error (503) after 2 tries"
        assert (meta["batch_llm_calls"], meta["batch_llm_requests"], meta["batch_llm_refused_circuit_open"]) == (3, 6, 9)
        assert any("circuit breaker opened 1 time(s)" in w and "9 chunk(s) were not sent" in w
                   for w in warnings_of(instance, run))

        # the next run, the endpoint back: the failed and the refused chunks are sent, each once
        llm.clear_faults()
        done, runs = nightly_extraction(settings, instance, sorted(docs))
        assert len(done) == 12 and llm.calls == 6 + 12
        assert Counter(extraction_rows(settings, runs)["outcome"]) == {"ok": 12}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_probes_after_the_cool_down_and_closes_when_the_probe_succeeds(llm):
    """StructuredLLM is the client of the extractor and of the query service's answerer: both get this."""
    clock = Clock()
    config = LLMConfig(base_url=llm.base_url, model=MODEL, timeout_seconds=2, max_retries=2, backoff_seconds=0,
                       breaker_failures=2, breaker_cooldown_seconds=10, breaker_cooldown_max_seconds=15)
    client = StructuredLLM(config, clock=clock)
    model = extraction_model(("person", "organization", "other"))
    messages = [{"role": "user", "content": "<chunk>\nDana Frost runs Bolt Engines.\n</chunk>"}]

    def call() -> str:
        try:
            client.call(messages, model)
            return "ok"
        except LLMFailure as failure:
            return failure.reason

    llm.fail_every(1, 500)
    assert [call(), call()] == ["server error (500) after 3 tries"] * 2 and llm.calls == 6
    assert client.breaker.state == "open"
    assert [call(), call()] == [CIRCUIT_OPEN] * 2 and llm.calls == 6  # refused: not one request
    clock.now += 9.9
    assert call() == CIRCUIT_OPEN and llm.calls == 6
    clock.now += 0.1  # the cool-down has passed: one probe, without retries; it fails, the cool-down doubles (capped)
    assert call() == "server error (500) after 1 try" and llm.calls == 7
    assert (client.breaker.state, client.breaker.cooldown, client.breaker.opens) == ("open", 15, 2)
    clock.now += 14
    assert call() == CIRCUIT_OPEN and llm.calls == 7
    llm.clear_faults()
    clock.now += 1
    assert call() == "ok" and llm.calls == 8  # the probe succeeds: closed, and calls resume
    assert [call(), call()] == ["ok", "ok"] and llm.calls == 10
    snapshot = client.breaker.snapshot()
    assert (snapshot["state"], snapshot["opens"], snapshot["probes"], snapshot["refused_calls"]) == ("closed", 2, 2, 4)
    assert snapshot["cooldown_seconds"] == 10 and snapshot["consecutive_failures"] == 0
    # a success in between resets the count: failures that are not consecutive never open it
    llm.fail_next(500, times=3)
    assert [call(), call()] == ["server error (500) after 3 tries", "ok"]
    llm.fail_next(500, times=3)
    assert call() == "server error (500) after 3 tries" and client.breaker.state == "closed"
    client.close()


def test_a_ledger_merge_killed_midway_counts_every_row_once_and_refused_calls_are_not_calls(tmp_path):
    """The extraction writes each paid call's row at once (a part each), then merges a document's parts into
    one; killed between writing the merged part and deleting the others, every row still counts once."""
    ledger = CostLedger(tmp_path / "ledger")
    row = {"run_id": "r", "stage": lexical_extraction.EXTRACTION_STAGE, "model": MODEL, "doc_id": "d"}
    parts = [ledger.record([{**row, "chunk_id": f"c{i}", "prompt_tokens": 10, "attempts": 2}]) for i in range(3)]
    parts.append(ledger.record([{**row, "chunk_id": "c3", "cache_hit": True, "attempts": 0},
                                {**row, "chunk_id": "c4", "outcome": f"failed: {CIRCUIT_OPEN}", "attempts": 0}]))
    merged = ledger.merge(parts)
    assert ledger.parts() == [merged] and ledger.read().height == 5
    for part in parts:  # as if killed before the old parts were deleted: every row is there twice
        shutil.copy(merged, part)
    assert len(ledger.parts()) == 5 and ledger.read().height == 5
    totals = ledger.totals(by=[]).row(0, named=True)
    assert (totals["calls"], totals["cache_hits"], totals["refused"], totals["requests"], totals["prompt_tokens"]) == (
        4, 1, 1, 6, 30)
    figures = lexical_extraction.llm_failure_figures(ledger.read(), "r")
    assert figures == {"batch_llm_failures": 0, "batch_llm_failure_reasons": {}, "batch_llm_refused_circuit_open": 1}


def test_breaker_settings_come_from_the_environment_and_are_checked():
    def config_of(environ):
        return LLMConfig.from_settings(Settings.from_env(environ))

    config = config_of({"LEXGRAPH_LLM_BASE_URL": "http://127.0.0.1:1/v1", "LEXGRAPH_LLM_BREAKER_FAILURES": "7",
                        "LEXGRAPH_LLM_BREAKER_COOLDOWN": "30", "LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX": "120"})
    assert (config.breaker_failures, config.breaker_cooldown_seconds, config.breaker_cooldown_max_seconds) == (7, 30, 120)
    defaults = config_of({})
    assert (defaults.breaker_failures, defaults.breaker_cooldown_seconds, defaults.breaker_cooldown_max_seconds) == (
        5, 60, 900)
    for variable, value, message in [
            ("LEXGRAPH_LLM_BREAKER_FAILURES", "many", "LEXGRAPH_LLM_BREAKER_FAILURES must be a whole number, got 'many'"),
            ("LEXGRAPH_LLM_BREAKER_FAILURES", "-1", "LEXGRAPH_LLM_BREAKER_FAILURES must be a whole number from 0"),
            ("LEXGRAPH_LLM_BREAKER_COOLDOWN", "soon", "LEXGRAPH_LLM_BREAKER_COOLDOWN must be a number of seconds"),
            ("LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX", "5", "LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX must be seconds from the "
                                                      "cool-down (60) to 86400, got 5.0")]:
        with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
            config_of({variable: value})
    off = LLMConfig(base_url="http://127.0.0.1:1/v1", breaker_failures=0)
    client = StructuredLLM(off)
    for _ in range(3):
        client.breaker.failed("boom")
    assert client.breaker.state == "closed" and client.breaker.allow() == "call"  # 0: no breaker
    client.close()


# --- kill -9 during an extraction run -------------------------------------------------------------------------------

# Three documents of two sections each: six chunks, all selected (β = 1.0).
KILL_DOCS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n"
                "## Terms\n\nDelivery is due in May 2024 at Bergen.\n",
    "beta.md": "# Beta\n\nBolt Engines is run by Dana Frost.\n\n## Plant\n\nThe Bolt Engines plant is in Kiel.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n\n"
                "## Parties\n\nAlpha Shipping and Bolt Engines settled in Bergen.\n",
}
KILLED_AFTER = 3  # paid calls: the process dies right after the third is in the ledger and the cache
LEXICAL_TABLES = ("Statement", "Topic", "Fact", "Entity", "EXTRACTED_FROM", "BELONGS_TO", "TOPIC_OF", "SUPPORTS",
                  "SUBJECT", "OBJECT", "RELATED", "MENTIONED_IN")


def llm_environment(server: LLMTestServer) -> dict[str, str]:
    return {"LEXGRAPH_LLM_BASE_URL": server.base_url, "LEXGRAPH_LLM_MODEL": MODEL, "LEXGRAPH_BETA": "1.0", **FAST}


def lexgraph_killed(command: str, home: Path, dh: Path, server: LLMTestServer, crash_at: str):
    """`lexgraph <command>` in a subprocess (the console script's entry point) that SIGKILLs itself at crash_at."""
    from tests.test_crash_recovery import _environment

    script = "import sys; from orchestration.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, command, "--quiet"], cwd=ROOT,
                          env={**_environment(home, dh, crash_at), **llm_environment(server)}, capture_output=True,
                          text=True, timeout=600)


def lexgraph_here(args: list[str], home: Path, dh: Path, server: LLMTestServer, monkeypatch, capsys) -> tuple[int, str]:
    """`lexgraph <args>` in this process, the LLM configured as for the subprocess; exit code and output."""
    from orchestration.cli import main

    with monkeypatch.context() as patch:
        for key in cleared_variables():
            patch.delenv(key)
        for key, value in {"LEXGRAPH_HOME": str(home), "DAGSTER_HOME": str(dh), **llm_environment(server)}.items():
            patch.setenv(key, value)
        capsys.readouterr()
        code = main([*args, "--quiet"])
        out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def heuristic_index(tmp_path_factory, embedder) -> Path:
    """KILL_DOCS indexed without an LLM, every chunk selected (β = 1.0): where an operator who then configures
    an endpoint runs `lexgraph reextract`. Built once, copied by each test; its Dagster instance is ephemeral."""
    from orchestration.runner import ingest_folder
    from tests.test_crash_recovery import _instance, dagster_home, write_folder

    root = tmp_path_factory.mktemp("heuristic")
    inbox = write_folder(root / "inbox", KILL_DOCS)
    with dg.DagsterInstance.ephemeral() as instance:
        report = ingest_folder(inbox, instance, settings=Settings.from_env(home=root / "home", beta=1.0), progress=False)
    assert report.failed == {} and report.corpus_index_ok, report
    with _instance(dagster_home(root / "dagster")) as instance:  # the project's dagster.yaml; its storage created
        assert instance.get_runs() == []
    return root


def lexical_snapshot(home: Path) -> dict:
    """The lexical graph and its extract tables, compared exactly: per document a hash of each table's content
    (times and cache flags left out), and the graph's node and edge counts; plus duplicate checks."""
    settings = Settings.from_env(home=home)
    store = ExtractStore(settings.extract_dir)
    docs = store.doc_ids(pipeline.CHUNKS)
    graph = GraphStore(settings.graph_path)
    try:
        counts = {table: graph.count(table) for table in LEXICAL_TABLES}
        distinct = graph.query("MATCH (s:Statement) RETURN count(DISTINCT s.id) AS n")["n"][0]
    finally:
        graph.close()
    assert distinct == counts["Statement"], "a statement is in the graph twice"
    return {"tables": {stage: lexical.lexical_hashes(store, stage, docs)
                       for stage in (pipeline.EXTRACTIONS, *lexical_tables.LEXICAL_STAGES)}, "graph": counts}


def cached_chunks(home: Path) -> list[str]:
    return sorted(meta["chunk_id"] for _, meta in ExtractionCache(Settings.from_env(home=home).extraction_cache_dir).items())


@pytest.mark.subprocess
def test_kill_9_during_extraction_then_rerun_equals_a_clean_build_and_pays_no_call_twice(
        heuristic_index, tmp_path, llm, monkeypatch, capsys):
    from orchestration.runner import reextract_index
    from tests.test_crash_recovery import _failure_message, _instance, assert_same_stores, store_snapshot

    monkeypatch.setenv("LEXGRAPH_BETA", "1.0")  # the settings the stores are read and checked with
    shutil.copytree(heuristic_index, tmp_path / "crashed")
    shutil.copytree(heuristic_index, tmp_path / "clean")
    home, dh = tmp_path / "crashed" / "home", tmp_path / "crashed" / "dagster"
    settings = Settings.from_env(home=home)

    # `lexgraph reextract` (an endpoint was configured) dies mid-run: three calls paid, each in the ledger and the
    # cache, the document being extracted not written yet
    crashed = lexgraph_killed("reextract", home, dh, llm, f"extraction:{KILLED_AFTER}")
    assert crashed.returncode == -9, f"expected death by SIGKILL: {crashed.stderr[-3000:]}"
    assert llm.calls == KILLED_AFTER and set(llm.served) == {"ok"}
    paid_by_the_dead = extraction_rows(settings)
    assert paid_by_the_dead.height == KILLED_AFTER and not paid_by_the_dead["cache_hit"].any()  # its cost is not lost
    assert sorted(paid_by_the_dead["chunk_id"]) == cached_chunks(home)
    rows = extractions(settings)
    written = {chunk for chunk, row in rows.items() if row["extractor"] == "openai"}
    assert written < set(cached_chunks(home))  # killed between a paid call and its document's write
    # and the documents it wrote were not flattened yet: their statements are still the offline ones
    written_docs = sorted({rows[chunk]["doc_id"] for chunk in written})
    assert written_docs and lexical_extraction.documents_with_unflattened_extractions(
        ExtractStore(settings.extract_dir), sorted({row["doc_id"] for row in rows.values()})) == written_docs

    # one chunk the dead run had not reached fails in the re-run (and in the clean build, for the comparison)
    texts = dict(pl.read_parquet(settings.extract_dir / pipeline.CHUNKS / "*.parquet").select("chunk_id", "text")
                 .iter_rows())
    unlucky = sorted(set(texts) - set(cached_chunks(home)))[-1]
    marker = texts[unlucky].splitlines()[-1]
    llm.fail_when(marker, 503)
    clean_home = tmp_path / "clean" / "home"
    with monkeypatch.context() as patch, dg.DagsterInstance.ephemeral() as instance:
        for key, value in llm_environment(llm).items():
            patch.setenv(key, value)
        clean = reextract_index(instance, Settings.from_env(home=clean_home), progress=False)
    assert clean.failed == {} and clean.lexical_ok
    llm.reset()
    llm.fail_when(marker, 503)

    # the re-run: the same command
    code, output = lexgraph_here(["reextract"], home, dh, llm, monkeypatch, capsys)
    assert code == 0, output
    assert_same_stores(store_snapshot(home), store_snapshot(clean_home))
    assert lexical_snapshot(home) == lexical_snapshot(clean_home)
    ledger = extraction_rows(settings)
    rerun = ledger.filter(~pl.col("run_id").is_in(paid_by_the_dead["run_id"].unique().to_list()))
    # nothing the dead run paid for is paid again: its calls are this run's cache hits (the documents it wrote
    # are re-run too, as their statements were not made yet: cache hits only)
    assert sorted(rerun.filter(pl.col("cache_hit"))["chunk_id"]) == sorted(paid_by_the_dead["chunk_id"])
    paid = ledger.filter(~pl.col("cache_hit") & (pl.col("outcome") == "ok"))
    assert sorted(paid["chunk_id"]) == sorted(set(texts) - {unlucky})  # each chunk paid for once
    assert Counter(llm.served) == {"ok": len(texts) - KILLED_AFTER - 1, "503": 3}
    assert ledger.filter(pl.col("chunk_id") == unlucky)["outcome"].to_list() == ["failed: server error (503) after 3 tries"]
    assert ledger["attempts"].sum() == KILLED_AFTER + llm.calls  # every request of both processes is a ledger row
    with _instance(dh) as instance:  # the dead process's run is marked failed, none is left running
        assert instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED,
                                                                 dg.DagsterRunStatus.STARTING])) == []
        dead = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        assert len(dead) == 1 and "killed or crashed" in _failure_message(instance, dead[0].run_id)

    # the next night's `lexgraph ingest`, the endpoint well: exactly the chunk that failed is sent again, once
    llm.clear_faults()
    before = llm.calls
    inbox = tmp_path / "crashed" / "inbox"
    code, output = lexgraph_here(["ingest", str(inbox)], home, dh, llm, monkeypatch, capsys)
    assert code == 0 and "0 new, 0 changed, 3 unchanged" in output, output
    assert sent_chunks(llm, before) == [texts[unlucky]]
    assert extractions(settings)[unlucky]["extractor"] == "openai"
    assert cached_chunks(home) == sorted(texts)
    code, output = lexgraph_here(["ingest", str(inbox)], home, dh, llm, monkeypatch, capsys)
    assert code == 0 and llm.calls == before + 1, output  # and then there is nothing left to do
