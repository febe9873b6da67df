"""The LLM extraction-cost benchmark's measuring function on the sample corpus, with the local test LLM server:
cost follows β, exactly the skeleton reaches the LLM, adding a document pays for its newly selected chunks
only, and nothing changed costs nothing."""
import shutil

import pytest

from benchmarks.bench_extraction import measure, table
from tests.conftest import SAMPLE_CORPUS

pytestmark = pytest.mark.ingest  # each β builds an index through Dagster

# Five short documents of the sample corpus (12 chunks): every step runs the whole asset graph (statements and
# entities embedded), so the full corpus would take minutes. The last one is the document added at the end.
DOCUMENTS = ("email-mccrae-aberdeen-quay7.txt", "email-nowak-engine-fault-2024-02.txt", "memo-cfo-liquidity-2024-05.txt",
             "note-nordlys-spirit-return.txt", "vanderlinde-coatings-order-fme-2022-14.txt")


def test_extraction_cost_follows_beta_and_a_second_run_is_free(tmp_path, no_llm_backoff, server):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in DOCUMENTS:
        shutil.copy2(SAMPLE_CORPUS / name, corpus / name)
    results = measure(corpus, tmp_path / "work", server, betas=(1.0, 0.8, 0.2), repeats=0, embed_repeats=0,
                      log=lambda line: None)
    by_beta = {f["beta"]: f for f in results["betas"]}
    calls = {beta: f["llm_calls"] for beta, f in by_beta.items()}
    assert 0 < calls[0.2] < calls[0.8] < calls[1.0]
    for beta, f in by_beta.items():
        # exactly the skeleton, ⌊β·n⌋ chunks, went to the LLM, each once, and every call succeeded
        assert f["skeleton_selected"] == f["floor_beta_n"] == f["llm_extracted_chunks"] == f["llm_calls"], f
        assert f["llm_extracted_in_skeleton"] == f["llm_extracted_chunks"] and f["skeleton_not_llm_extracted"] == 0
        assert f["extracted_chunks"] == f["chunks"] and f["cache_hits"] == 0 and f["failed_calls"] == 0
        assert f["ledger_llm_calls_total"] == f["llm_calls"]  # the base index made no LLM call
        assert f["prompt_tokens"] > 0 and f["completion_tokens"] > 0
    assert by_beta[1.0]["floor_beta_n"] == by_beta[1.0]["chunks"] and by_beta[1.0]["llm_calls_ratio"] == 1.0
    assert by_beta[0.2]["llm_calls_ratio"] < by_beta[0.8]["llm_calls_ratio"] < 1.0
    assert by_beta[0.2]["prompt_tokens"] < by_beta[0.8]["prompt_tokens"] < by_beta[1.0]["prompt_tokens"]

    # adding one document costs its newly selected skeleton chunks (its own and any that entered elsewhere)
    added = results["add_one_document"]
    assert added["document"] == DOCUMENTS[-1] and added["document_chunks"] > 0 and added["failed_calls"] == 0
    assert added["llm_calls"] == added["newly_selected_chunks"] == added["diff_newly_selected"]
    assert added["skeleton_selected"] == added["floor_beta_n"] == added["llm_extracted_in_skeleton"]
    assert added["llm_calls"] < by_beta[0.8]["llm_calls"]
    # nothing changed: a second ingest and a reextract make no call
    again = results["nothing_changed"]
    assert (again["ingest"]["new"], again["ingest"]["changed"], again["ingest"]["reextracted"]) == (0, 0, 0)
    assert again["ingest"]["llm_calls"] == again["reextract"]["llm_calls"] == again["reextract"]["documents"] == 0
    assert "| 0.2 |" in table(results)
