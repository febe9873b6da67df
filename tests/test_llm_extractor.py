"""The openai extractor against a real OpenAI-compatible HTTP server on 127.0.0.1 (tests/llm_server.py):
no patched client. Backoffs are tiny so the whole file runs in seconds."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from lexgraph.extract.extraction_cache import CacheWarning, ExtractionCache, key_for
from lexgraph.extract.llm_config import LLMConfig, LLMConfigError
from lexgraph.extract.llm_extractor import SYSTEM_PROMPT, OpenAIExtractor, compute_prompt_version
from lexgraph.extract.pii import PiiMaskingError, mask_pii
from lexgraph.extract.schemas import (
    ChunkExtraction,
    ChunkInput,
    ExtractionOutcome,
    Extractor,
    Statement,
    Topic,
    extraction_model,
)
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings, SettingsError
from tests.llm_server import LLMTestServer

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("Alpha Shipping signed contract C-1 with Bolt Engines. Delivery is due in May 2024 at Bergen. "
        "Dana Frost runs Bolt Engines.")
CHUNK = ChunkInput("doc-a-c00000-abc", "doc-a", TEXT, "Alpha > Terms")


class StubFallback:
    """Stands in for the offline extractor: one statement, the whole chunk."""

    name = "heuristic"
    model = "none"
    prompt_version = "h-test"

    def __init__(self):
        self.calls = 0

    def extract(self, chunk: ChunkInput) -> ExtractionOutcome:
        self.calls += 1
        extraction = ChunkExtraction(topics=[Topic(name="fallback", statements=[Statement(text=chunk.text)])])
        return ExtractionOutcome(extraction, self.name, self.model, self.prompt_version, attempts=0)


@pytest.fixture(scope="module")
def llm_server_options() -> dict:
    return {"max_lifetime": 120}


@pytest.fixture
def delays():
    return []


def make(server, delays=None, *, fallback=None, masker=None, **config) -> OpenAIExtractor:
    settings = dict(base_url=server.base_url, model="test-model", timeout_seconds=2.0, max_retries=3,
                    validation_retries=1, backoff_seconds=0.01, backoff_max_seconds=0.2)
    settings.update(config)

    def sleep(seconds: float) -> None:
        if delays is not None:
            delays.append(seconds)
        time.sleep(seconds)

    return OpenAIExtractor(LLMConfig(**settings), fallback=fallback, masker=masker, sleep=sleep)


# -- the normal path ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["json", "tools"])
def test_extraction_is_schema_valid_and_usage_is_recorded(server, mode):
    extractor = make(server, mode=mode)
    assert isinstance(extractor, Extractor)
    outcome = extractor.extract(CHUNK)

    assert outcome.outcome == "ok" and outcome.error is None
    assert (outcome.extractor, outcome.model, outcome.prompt_version) == ("openai", "test-model",
                                                                          extractor.prompt_version)
    assert outcome.attempts == 1 and server.calls == 1
    stats = server.stats()
    assert outcome.prompt_tokens == stats["prompt_tokens"] > 0
    assert outcome.completion_tokens == stats["completion_tokens"] > 0
    assert outcome.seconds > 0

    extraction = outcome.extraction
    assert isinstance(extraction, ChunkExtraction)
    ChunkExtraction.model_validate(extraction.model_dump())
    assert [topic.name for topic in extraction.topics] == ["Alpha > Terms"]
    assert [s.text for _, s in extraction.statements()] == [
        "Alpha Shipping signed contract C-1 with Bolt Engines.", "Delivery is due in May 2024 at Bergen.",
        "Dana Frost runs Bolt Engines."]
    names = {entity.name for entity in extraction.entities}
    assert {"Alpha Shipping", "Bolt Engines", "Dana Frost", "Bergen"} <= names
    assert all(entity.type in extractor.response_model.entity_types for entity in extraction.entities)
    assert any(r.source == "Dana Frost" and r.target == "Bolt Engines" for r in extraction.relations)

    request = server.requests[0]
    assert request["model"] == "test-model"
    if mode == "json":
        assert request["response_format"] == {"type": "json_object"} and "tools" not in request
    else:
        assert request["tools"][0]["function"]["name"] and "response_format" not in request
    system = request["messages"][0]["content"]
    assert "standalone statements" in system and "person, organization" in system
    assert TEXT in server.user_texts()[0]


def test_the_same_chunk_gives_the_same_extraction(server):
    extractor = make(server)
    assert extractor.extract(CHUNK).extraction.model_dump() == extractor.extract(CHUNK).extraction.model_dump()


# -- transport faults -----------------------------------------------------------------------------------------

def test_429_is_retried_honouring_retry_after_then_succeeds(server, delays, tmp_path):
    server.fail_next(429, retry_after=0.05)
    extractor = make(server, delays)
    outcome = extractor.extract(CHUNK)

    assert outcome.outcome == "ok" and outcome.attempts == 2
    assert server.calls == 2 and server.served == ["429", "ok"]
    assert delays == [0.05]  # the server's Retry-After, not the 0.01 backoff

    ledger = CostLedger(tmp_path / "ledger")
    ledger.record([extractor.ledger_row(outcome, CHUNK, run_id="run-1")])
    totals = ledger.totals().row(0, named=True)
    assert totals["stage"] == "chunk_extractions" and totals["model"] == "test-model"
    assert (totals["calls"], totals["requests"], totals["cache_hits"]) == (1, 2, 0)
    assert totals["prompt_tokens"] == outcome.prompt_tokens > 0


def test_retry_after_is_capped_and_backoff_grows(server, delays):
    server.fail_next(429, retry_after=30)
    server.fail_next(503, times=2)
    outcome = make(server, delays, backoff_seconds=0.02, backoff_max_seconds=0.1).extract(CHUNK)
    assert outcome.outcome == "ok" and server.served == ["429", "503", "503", "ok"]
    assert delays[0] == 0.1  # Retry-After 30 s, capped
    assert 0.75 * 0.04 <= delays[1] <= 0.04 and 0.75 * 0.08 <= delays[2] <= 0.08  # 0.02 · 2^n, jittered


def test_500s_beyond_max_retries_fall_back_with_the_failure_recorded(server, delays):
    server.fail_next(500, times=10)
    fallback = StubFallback()
    extractor = make(server, delays, fallback=fallback, max_retries=2)
    outcome = extractor.extract(CHUNK)

    assert server.calls == 3 and len(delays) == 2  # first try + 2 retries
    assert outcome.outcome == "fallback: server error (500) after 3 tries"
    assert "500" in outcome.error and "test-model" in outcome.error
    assert fallback.calls == 1
    assert (outcome.extractor, outcome.model, outcome.prompt_version) == ("heuristic", "none", "h-test")
    assert [s.text for _, s in outcome.extraction.statements()] == [TEXT]
    assert outcome.attempts == 3
    row = extractor.ledger_row(outcome, CHUNK, run_id="r")
    assert row["model"] == "test-model" and row["outcome"].startswith("fallback") and row["attempts"] == 3


def test_without_a_fallback_the_outcome_is_failed_and_empty(server):
    server.fail_next(500, times=10)
    outcome = make(server, max_retries=1).extract(CHUNK)
    assert outcome.outcome == "failed: server error (500) after 2 tries"
    assert outcome.extraction.empty and outcome.extractor == "openai" and outcome.error


def test_timeout_is_retried(server, delays):
    # The stalled call would be answered after 60 s: a second call, with one backoff before it, shows that the
    # client gave up at its own timeout (0.3 s); had it waited, it would have taken the first answer.
    server.fail_next("timeout", seconds=60)
    outcome = make(server, delays, timeout_seconds=0.3).extract(CHUNK)
    assert outcome.outcome == "ok" and outcome.attempts == 2 and server.served == ["timeout", "ok"]
    assert len(delays) == 1 and delays[0] <= 0.2  # backoff_max_seconds


def test_dropped_connection_and_non_json_body_are_retried(server):
    server.fail_next("disconnect")
    server.fail_next("garbage")
    outcome = make(server).extract(CHUNK)
    assert outcome.outcome == "ok" and server.served == ["disconnect", "garbage", "ok"]


def test_an_open_circuit_breaker_sends_nothing_and_falls_back_at_no_cost(server):
    server.fail_every(1, 503)
    fallback = StubFallback()
    extractor = make(server, fallback=fallback, max_retries=0, breaker_failures=2)
    outcomes = [extractor.extract(CHUNK) for _ in range(4)]
    assert [o.outcome for o in outcomes] == ["fallback: server error (503) after 1 try"] * 2 + [
        "fallback: circuit open"] * 2
    assert server.calls == 2 and [o.attempts for o in outcomes] == [1, 1, 0, 0] and fallback.calls == 4
    assert "circuit breaker open after 2 consecutive failed calls" in outcomes[-1].error
    row = extractor.ledger_row(outcomes[-1], CHUNK, run_id="r")
    assert (row["attempts"], row["prompt_tokens"], row["outcome"]) == (0, 0, "fallback: circuit open")


def test_a_rejected_request_is_not_retried(server):
    server.fail_next(401, times=5)
    fallback = StubFallback()
    outcome = make(server, fallback=fallback).extract(CHUNK)
    assert server.calls == 1
    assert outcome.outcome == "fallback: request rejected (401)" and fallback.calls == 1


# -- malformed output ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["malformed", "invalid"])
def test_malformed_output_is_re_asked_then_succeeds(server, kind):
    server.fail_next(kind)
    outcome = make(server, validation_retries=2).extract(CHUNK)
    assert outcome.outcome == "ok" and outcome.attempts == 2 and server.served == [kind, "ok"]
    reask = server.requests[1]["messages"]
    assert len(reask) > len(server.requests[0]["messages"])  # the answer and the error went back
    assert "error" in json.dumps(reask[2:]).lower()
    assert outcome.prompt_tokens == server.stats()["prompt_tokens"]  # both attempts' tokens


def test_always_malformed_falls_back_after_the_validation_retries(server, delays):
    server.fail_when("Bolt Engines", "malformed")  # every call about this chunk
    fallback = StubFallback()
    outcome = make(server, delays, fallback=fallback, validation_retries=2).extract(CHUNK)
    assert server.calls == 3 and delays == []  # 1 + 2 re-asks, no transport retries
    assert outcome.outcome == "fallback: malformed output after 3 attempts"
    assert "validation" in outcome.error.lower() and fallback.calls == 1
    assert outcome.prompt_tokens > 0  # the failed answers still cost tokens


def test_a_marker_fault_hits_only_the_chunks_that_carry_it(server):
    server.fail_when("POISON", "500")
    extractor = make(server, max_retries=1, fallback=StubFallback())
    poisoned = extractor.extract(ChunkInput("c2", "doc-b", "POISON pill text from Acme Corp.", ""))
    healthy = extractor.extract(CHUNK)
    assert poisoned.outcome.startswith("fallback: server error (500)")
    assert healthy.outcome == "ok"
    assert server.served == ["500", "500", "ok"]


# -- prompt version -----------------------------------------------------------------------------------------

def test_prompt_version_changes_with_prompt_types_schema_and_masking(server):
    base = make(server)
    assert base.prompt_version == make(server).prompt_version  # stable
    assert base.prompt_version == make(server, mode="tools", timeout_seconds=9).prompt_version  # not a prompt change
    assert make(server, model="other-model").prompt_version == base.prompt_version  # the model is its own key part
    changed_prompt = OpenAIExtractor(base.config, system_prompt=SYSTEM_PROMPT + " Be terse.")
    assert changed_prompt.prompt_version != base.prompt_version
    assert make(server, entity_types=("person", "vessel")).prompt_version != base.prompt_version
    assert make(server, masker=mask_pii).prompt_version != base.prompt_version
    types = base.response_model.entity_types
    assert compute_prompt_version(SYSTEM_PROMPT, types, ChunkExtraction) != \
        compute_prompt_version(SYSTEM_PROMPT, types, extraction_model(types))  # schema change


# -- cache ----------------------------------------------------------------------------------------------------

def test_cache_roundtrip_and_keys(tmp_path, server):
    cache = ExtractionCache(tmp_path / "cache")
    extractor = make(server)
    key = key_for(extractor.cache_text(CHUNK), extractor.model, extractor.prompt_version)
    assert cache.get(key) is None

    outcome = extractor.extract(CHUNK)
    path = cache.put(key, outcome.extraction, meta={"extractor": outcome.extractor})
    assert path.parent.parent.parent == tmp_path / "cache"
    assert path.parent.name == extractor.prompt_version and path.name == f"{key.content_hash}.json"
    assert cache.get(key).model_dump() == outcome.extraction.model_dump()
    assert cache.entry(key)[1] == {"extractor": "openai"}
    assert not list(path.parent.glob(".*tmp"))

    # a second run reads the cache and makes no call
    calls = server.calls
    again = cache.get(key_for(extractor.cache_text(CHUNK), extractor.model, extractor.prompt_version))
    assert again.model_dump() == outcome.extraction.model_dump() and server.calls == calls

    assert key_for(extractor.cache_text(CHUNK), "other-model", extractor.prompt_version) != key
    assert key_for(extractor.cache_text(CHUNK), extractor.model, "p-other") != key
    assert key_for(extractor.cache_text(CHUNK) + " ", extractor.model, extractor.prompt_version) != key
    assert cache.get(key_for(extractor.cache_text(CHUNK), "other-model", extractor.prompt_version)) is None
    assert cache.path(key_for("x", "a/b", "v1")) != cache.path(key_for("x", "a-b", "v1"))


def test_cache_keeps_custom_entity_types_and_treats_damage_as_a_miss(tmp_path):
    cache = ExtractionCache(tmp_path)
    model = extraction_model(["ship_class", "person"])
    extraction = model.model_validate({"entities": [
        {"name": "Type 45", "type": "ship_class", "description": "d", "mention": "m"}]})
    key = key_for("text", "m", "v1")
    cache.put(key, extraction)
    assert cache.get(key).entities[0].type == "ship_class"

    cache.path(key).write_text('{"key": ["truncated')
    with pytest.warns(CacheWarning, match="unreadable"):
        assert cache.get(key) is None
    cache.put(key, extraction)  # overwritten whole
    assert cache.get(key) is not None
    with pytest.raises(ValueError):
        key_for("text", "m", "../escape")


# -- PII ------------------------------------------------------------------------------------------------------

PII_TEXT = ("Contact Jane Roe at jane.roe@example.com or +44 20 7946 0958. Her resident number is 900101-1234567, "
            "IBAN GB82 WEST 1234 5698 7654 32, card 4111 1111 1111 1111.")


def test_masked_text_is_what_reaches_the_server(server):
    chunk = ChunkInput("c-pii", "doc-p", PII_TEXT, "Contacts")
    outcome = make(server, masker=mask_pii).extract(chunk)
    assert outcome.outcome == "ok"
    sent = server.all_text()
    for raw in ("jane.roe@example.com", "7946 0958", "900101-1234567", "GB82 WEST", "4111 1111"):
        assert raw not in sent
    for placeholder in ("[EMAIL]", "[PHONE]", "[NATIONAL_ID]", "[IBAN]", "[CARD]"):
        assert placeholder in sent
    assert "Jane Roe" in sent  # names are not PII kinds here
    assert chunk.text == PII_TEXT  # the source text is untouched
    assert not any("@" in e.name for e in outcome.extraction.entities)


def test_without_a_masker_the_raw_text_is_sent(server):
    make(server).extract(ChunkInput("c-pii", "doc-p", PII_TEXT, ""))
    assert "jane.roe@example.com" in server.all_text()


def test_a_masking_failure_sends_nothing(server):
    def broken(text: str) -> str:
        raise PiiMaskingError("detector crashed")

    fallback = StubFallback()
    outcome = make(server, masker=broken, fallback=fallback).extract(CHUNK)
    assert server.calls == 0 and fallback.calls == 0
    assert outcome.outcome == "not sent: masking failed: PiiMaskingError: detector crashed"
    assert outcome.extraction.empty and outcome.attempts == 0

    surrogate = ChunkInput("c-bad", "doc-b", "broken \udc80 text with bob@example.com", "")
    outcome = make(server, masker=mask_pii).extract(surrogate)
    assert server.calls == 0 and outcome.outcome.startswith("not sent: masking failed: PiiMaskingError")


# -- configuration --------------------------------------------------------------------------------------------

def test_config_from_settings_with_openai_fallbacks_and_named_errors():
    """LLMConfig takes every value from the one Settings, which reads the variables and checks them."""
    def config_of(environ):
        return LLMConfig.from_settings(Settings.from_env(environ))

    config = config_of({"OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "OPENAI_API_KEY": "sk-o"})
    assert (config.base_url, config.api_key, config.enabled) == ("http://127.0.0.1:1/v1", "sk-o", True)
    assert "sk-o" not in repr(config)
    config = config_of({"LEXGRAPH_LLM_BASE_URL": "http://localhost:8000/v1", "OPENAI_BASE_URL": "http://x/v1",
                        "LEXGRAPH_LLM_MODEL": "qwen2.5", "LEXGRAPH_LLM_API_KEY": "k",
                        "OPENAI_API_KEY": "o", "LEXGRAPH_LLM_TIMEOUT": "7.5",
                        "LEXGRAPH_LLM_MAX_RETRIES": "2", "LEXGRAPH_ENTITY_TYPES": "person, vessel"})
    assert (config.base_url, config.model, config.api_key) == ("http://localhost:8000/v1", "qwen2.5", "k")
    assert (config.timeout_seconds, config.max_retries, config.entity_types) == (7.5, 2, ("person", "vessel"))
    assert not config_of({}).enabled
    assert config_of({}) == LLMConfig(model=Settings().llm_model)  # the same defaults, written once
    for variable, value in [("LEXGRAPH_LLM_TIMEOUT", "soon"), ("LEXGRAPH_LLM_TIMEOUT", "0"),
                            ("LEXGRAPH_LLM_MAX_RETRIES", "-1"), ("LEXGRAPH_LLM_BASE_URL", "localhost:8000"),
                            ("OPENAI_BASE_URL", "ftp://x"), ("LEXGRAPH_LLM_MODE", "xml"),
                            ("LEXGRAPH_LLM_BACKOFF", "x")]:
        with pytest.raises(SettingsError, match=variable.replace("OPENAI_BASE_URL", "LEXGRAPH_LLM_BASE_URL")):
            config_of({variable: value})
    with pytest.raises(LLMConfigError, match="LEXGRAPH_LLM_TIMEOUT"):  # a config built by hand: the same checks
        LLMConfig(base_url="http://127.0.0.1:1/v1", timeout_seconds=0).validate()


# -- the standalone server ------------------------------------------------------------------------------------

@pytest.mark.subprocess
def test_standalone_server_process_serves_and_takes_faults_over_http():
    process = subprocess.Popen([sys.executable, "-m", "tests.llm_server", "--port", "0", "--max-seconds", "60"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        base_url = line.strip().split(" on ")[1].split(" ")[0]
        assert base_url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(base_url + "/models", timeout=5) as response:
            assert json.load(response)["data"][0]["id"] == "lexgraph-test-llm"
        control = base_url.removesuffix("/v1") + "/_control"
        request = urllib.request.Request(control + "/faults", data=json.dumps({"kind": "503"}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=5).close()
        extractor = OpenAIExtractor(LLMConfig(base_url=base_url, model="bench", backoff_seconds=0.01,
                                              timeout_seconds=5))
        assert extractor.extract(CHUNK).outcome == "ok"
        with urllib.request.urlopen(control + "/stats", timeout=5) as response:
            stats = json.load(response)
        assert stats["calls"] == 2 and stats["served"] == {"503": 1, "ok": 1}
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert process.returncode == 0


def test_in_process_server_stops_by_itself():
    server = LLMTestServer(max_lifetime=0.3).start()
    time.sleep(0.8)
    assert not server.running
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OSError):
            urllib.request.urlopen(server.base_url + "/models", timeout=1)
