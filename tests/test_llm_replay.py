"""The test server's replay mode: GPT-3.5's recorded MuSiQue extractions (HippoRAG's) answered over HTTP as
ChunkExtractions, and an ingest through the product's `openai` extractor, its cache and its cost ledger.

A handful of passages (and their recordings) are copied to a tmp folder, so every test runs in seconds."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from lexgraph.indexing.lexical_extraction import EXTRACTION_STAGE
from lexgraph.indexing.pipeline import CHUNKS, EXTRACTIONS
from lexgraph.extract.llm_config import LLMConfig
from lexgraph.extract.llm_extractor import OpenAIExtractor
from lexgraph.extract.schemas import ChunkInput, clean_text, name_key
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from orchestration.runner import ingest_folder, reextract_index
from tests.recorded_llm import RecordedExtractions, split_sentences

DATASET = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets" / "musique-hipporag"
RECORDING = DATASET / "openie_gpt-3.5-turbo-1106.json"
# the first dev question's two evidence passages (the second is long enough for two chunks), and three with
# triples in several sentences
STEMS = ("p7976b1e35e", "pda9107f338", "p007de50765", "p01fc050712", "p023c53c2a8")

pytestmark = [pytest.mark.skipif(not RECORDING.is_file(), reason=f"{RECORDING} not found (../shared/datasets)"),
              pytest.mark.usefixtures("no_llm_backoff")]


@pytest.fixture
def recorded(tmp_path) -> Path:
    """The five passages under corpus/ and their recording beside it, as the dataset lays them out."""
    records = json.loads(RECORDING.read_text(encoding="utf-8"))
    (tmp_path / "recorded" / "corpus").mkdir(parents=True)
    for stem in STEMS:
        shutil.copy2(DATASET / "corpus" / f"{stem}.txt", tmp_path / "recorded" / "corpus" / f"{stem}.txt")
    path = tmp_path / "recorded" / "openie.json"
    path.write_text(json.dumps({stem: records[stem] for stem in STEMS}), encoding="utf-8")
    return path


@pytest.fixture
def llm_server_options(recorded) -> dict:
    """The conftest `server` answers from the recording."""
    return {"max_lifetime": 120, "replay": RecordedExtractions.load(recorded)}


def passage(recorded: Path, stem: str) -> str:
    return (recorded.parent / "corpus" / f"{stem}.txt").read_text(encoding="utf-8")


def recorded_triples(recorded: Path, *stems: str) -> set[tuple[str, str, str]]:
    records = json.loads(recorded.read_text(encoding="utf-8"))
    return {tuple(clean_text(part) for part in triple) for stem in stems for triple in records[stem]["triples"]
            if len(triple) == 3}


def facts_of(extraction) -> set[tuple[str, str, str]]:
    return {(f.subject, f.predicate, f.object) for _, statement in extraction.statements() for f in statement.facts}


def extractor(server) -> OpenAIExtractor:
    return OpenAIExtractor(LLMConfig(base_url=server.base_url, model=server.model, timeout_seconds=5.0,
                                     max_retries=0, validation_retries=0))


def test_a_chunk_of_two_recorded_passages_gets_both_passages_triples(server, recorded):
    first, second = passage(recorded, "p7976b1e35e"), passage(recorded, "p007de50765")
    outcome = extractor(server).extract(ChunkInput("c-1", "d-1", first + "\n\n" + second))
    assert outcome.outcome == "ok"
    extraction = outcome.extraction
    assert facts_of(extraction) == recorded_triples(recorded, "p7976b1e35e", "p007de50765")
    # one topic per passage, named by its title, in the order of the chunk; statements are passage sentences
    assert [t.name for t in extraction.topics] == [first.split("\n")[0], second.split("\n")[0]]
    sentences = set(split_sentences(first.split("\n", 1)[1])) | set(split_sentences(second.split("\n", 1)[1]))
    assert all(statement.text in sentences for _, statement in extraction.statements())
    # the recording's entities, typed "other" unless their form says date; a relation needs two entities
    records = json.loads(recorded.read_text(encoding="utf-8"))
    names = {name_key(e) for stem in ("p7976b1e35e", "p007de50765") for e in records[stem]["entities"]}
    assert {name_key(e.name) for e in extraction.entities} == names
    assert {e.type for e in extraction.entities} <= {"other", "date"}
    assert extraction.relations and all(name_key(r.source) in names and name_key(r.target) in names
                                        for r in extraction.relations)
    # usage: the request's words in, the answer's words out
    stats = server.stats()
    assert outcome.prompt_tokens == stats["prompt_tokens"] > len((first + second).split())
    assert outcome.completion_tokens == stats["completion_tokens"] > 0


def test_a_fragment_gets_only_the_triples_of_its_sentences(server, recorded):
    text = passage(recorded, "p023c53c2a8")
    title, body = text.split("\n", 1)
    sentences = split_sentences(body)
    replay = server.replay
    whole = replay.find(text)[0].passage
    tail = " ".join(sentences[3:])  # no title, the first three sentences cut off
    expected = {tuple(t) for t, s in zip(whole.triples, whole.triple_sentence) if s >= 3}
    assert expected and expected != set(whole.triples)
    assert facts_of(extractor(server).extract(ChunkInput("c-2", "d-2", tail)).extraction) == expected


def test_an_unknown_chunk_gets_an_empty_valid_extraction(server):
    outcome = extractor(server).extract(ChunkInput("c-3", "d-3", "Kestrel Propulsion GmbH signed a supply contract "
                                                                 "with Alpha Shipping in Bergen on 4 May 2024."))
    assert outcome.outcome == "ok" and outcome.extraction.empty
    assert outcome.prompt_tokens > 0 and outcome.completion_tokens > 0
    assert server.served == ["ok"]


def test_replay_is_deterministic_and_answers_stay_as_they_were(server, recorded):
    text = passage(recorded, "pda9107f338")
    assert server.replay.extraction(text, ["other", "date"]) == server.replay.extraction(text, ["other", "date"])
    assert RecordedExtractions.load(recorded).extraction(text) == server.replay.extraction(text)


def _ledger(settings: Settings) -> pl.DataFrame:
    return CostLedger(settings.ledger_dir).read().filter(pl.col("stage") == EXTRACTION_STAGE)


@pytest.mark.ingest
def test_ingest_through_the_openai_extractor_then_a_rerun_is_all_cache_hits(server, recorded, tmp_path):
    folder = tmp_path / "inbox"
    shutil.copytree(recorded.parent / "corpus", folder)
    settings = Settings.from_env(home=tmp_path / "first", inbox=folder, beta=1.0, llm_base_url=server.base_url,
                                 llm_model=server.model)
    with dg.DagsterInstance.ephemeral() as instance:
        report = ingest_folder(folder, instance, settings=settings, progress=False)
        assert not report.failed and report.new == len(STEMS) and report.corpus_index_ok is not False
        store = ExtractStore(settings.extract_dir)
        chunks = store.scan(CHUNKS).select("chunk_id").collect().height
        extractions = store.scan(EXTRACTIONS).collect()
        # β = 1: every chunk went to the recorded LLM once, and the ledger has the server's own usage counts
        assert set(extractions["extractor"]) == {"openai"} and set(extractions["outcome"]) == {"ok"}
        ledger = _ledger(settings)
        stats = server.stats()
        assert ledger.height == chunks == stats["calls"] > len(STEMS)  # one passage took two chunks
        assert not ledger["cache_hit"].any()
        assert (ledger["prompt_tokens"].sum(), ledger["completion_tokens"].sum()) == (
            stats["prompt_tokens"], stats["completion_tokens"])
        # the index holds exactly the recorded triples of its passages as facts
        facts = set()
        for row in extractions.iter_rows(named=True):
            for topic in json.loads(row["extraction"])["topics"]:
                facts |= {(f["subject"], f["predicate"], f["object"]) for s in topic["statements"] for f in s["facts"]}
        assert facts == recorded_triples(recorded, *STEMS)

        # nothing changed: a second ingest and a reextract make no call
        again = ingest_folder(folder, instance, settings=settings, progress=False)
        redo = reextract_index(instance, settings, progress=False)
        assert (again.new, again.changed, len(redo.documents), redo.llm_calls) == (0, 0, 0, 0)
        assert server.calls == chunks

    # a re-run into a new index home that keeps the extraction cache: every chunk is a cache hit, no call
    rerun = settings.with_(home=tmp_path / "rerun")
    shutil.copytree(settings.extraction_cache_dir, rerun.extraction_cache_dir)
    with dg.DagsterInstance.ephemeral() as instance:
        report = ingest_folder(folder, instance, settings=rerun, progress=False)
    assert not report.failed and report.new == len(STEMS)
    ledger = _ledger(rerun)
    assert ledger.height == chunks and ledger["cache_hit"].all()
    assert (ledger["prompt_tokens"].sum(), ledger["completion_tokens"].sum()) == (0, 0)
    assert server.calls == chunks
    replayed = ExtractStore(rerun.extract_dir).scan(EXTRACTIONS).collect()
    assert dict(zip(replayed["chunk_id"], replayed["extraction"])) == dict(zip(extractions["chunk_id"],
                                                                               extractions["extraction"]))
