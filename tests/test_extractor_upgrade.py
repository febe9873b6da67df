"""An index extracted by older offline rules: Dagster shows its extraction assets changed, and `reextract`
brings it up to date without any LLM call. Real Dagster instance, LanceDB and Kùzu."""
import dagster as dg
import polars as pl
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from lexgraph.extract.nlp_extractor import NLPExtractor
from lexgraph.ledger import CostLedger
from lexgraph.settings import Settings
from orchestration.definitions import build_definitions, code_versions
from orchestration.runner import ingest_folder, reextract_index

EXTRACTION_ASSETS = {"chunk_extractions", "document_statements", "document_topics", "document_facts",
                     "document_entities", "lexical_graph"}


def _status(instance, settings: Settings, key: str):
    defs = build_definitions(settings)
    resolver = CachingStaleStatusResolver(instance, defs.get_repository_def().asset_graph,
                                          LoadingContextForTest(instance))
    return resolver.get_status(dg.AssetKey("chunk_extractions"), key), resolver


def test_new_offline_rules_show_as_changed_code_and_reextract_calls_no_llm(tiny_corpus, home, instance, monkeypatch):
    monkeypatch.setattr(NLPExtractor, "prompt_version", "older-rules")
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    settings = Settings.from_env(home=home, inbox=tiny_corpus)
    before = code_versions(settings)
    keys = instance.get_dynamic_partitions("documents")
    assert _status(instance, settings, keys[0])[0] == StaleStatus.FRESH
    monkeypatch.undo()  # the rules this code ships

    after = code_versions(settings)
    assert {name for name in before if before[name] != after[name]} == EXTRACTION_ASSETS
    status, resolver = _status(instance, settings, keys[0])
    assert status == StaleStatus.STALE
    assert any("code version" in cause.reason for cause in resolver.get_stale_causes(
        dg.AssetKey("chunk_extractions"), keys[0]))

    report = reextract_index(instance, settings, progress=False)
    assert set(report.documents) == set(keys) and report.failed == {} and report.lexical_ok
    assert report.llm_calls == 0
    rows = pl.read_parquet(settings.extract_dir / "extractions" / "*.parquet")
    assert set(rows["prompt_version"]) == {NLPExtractor.prompt_version} and set(rows["extractor"]) == {"nlp"}
    ledger = CostLedger(settings.ledger_dir).read()
    assert ledger.filter(pl.col("stage") == "extraction").height == 0  # nothing was sent anywhere
    assert all(_status(instance, settings, key)[0] == StaleStatus.FRESH for key in keys)
    assert reextract_index(instance, settings, progress=False).documents == {}
