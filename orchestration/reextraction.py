"""Which documents to re-extract, as batched `extract_documents` runs: shared by the CLI runner, the
re-extraction sensor and `lexgraph reextract`.

Two causes. A skeleton selection change (the corpus job's skeleton_selection publishes its diff): only the
documents with newly selected chunks re-run, and only those chunks call the LLM (the others are cache hits
or offline). With the offline NLP extractor a selection change changes nothing, so nothing re-runs. And a
prompt, model or entity-type change (a new code version on the extraction assets): re-processing is a
deliberate backfill, `lexgraph reextract`, which re-runs every document whose extractions no longer match
the current extractors; unchanged chunks are cache hits.
"""
from __future__ import annotations

import json

import dagster as dg

from lexgraph.index import LexIndex
from lexgraph.indexing import lexical_extraction
from lexgraph.indexing.corpus_skeleton import read_selection_diff
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.ids import short_hash
from lexgraph.settings import Settings
from orchestration.reconcile import RANGE_END, RANGE_START, contiguous_batches

EXTRACTION_JOB = "extract_documents"
SELECTION_DIFF_TAG = "lexgraph/selection_diff"
REASON_TAG = "lexgraph/reextraction"


def diff_digest(files: CorpusFiles) -> str | None:
    """A hash of the last published selection diff (None before the first)."""
    try:
        return short_hash(files.skeleton_diff.read_text(), 16)
    except FileNotFoundError:
        return None


def handled_digest(files: CorpusFiles) -> str | None:
    """The selection diff whose re-extraction finished (recorded by the runner)."""
    try:
        return json.loads(files.reextracted.read_text()).get("digest")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def mark_handled(files: CorpusFiles, digest: str) -> None:
    files.root.mkdir(parents=True, exist_ok=True)
    partial = files.reextracted.with_suffix(".tmp")
    partial.write_text(json.dumps({"digest": digest}))
    partial.replace(files.reextracted)


def selection_reextraction(settings: Settings, catalog) -> tuple[str | None, list[str]]:
    """(digest of the current selection diff, documents to re-extract): those it newly selects chunks of, unless
    the diff was handled already, those with skeleton chunks whose LLM call failed last time (retried on every
    run until they succeed; only those chunks call the LLM), and those a killed run extracted but did not
    flatten (cache hits only). None when no LLM is configured."""
    files = LexIndex(settings).corpus_files
    digest = diff_digest(files)
    if digest is None or settings.extractor != "openai":
        return digest, []
    store = LexIndex(settings).extract_store
    skeleton = lexical_extraction.read_skeleton(files.skeleton)
    retry = {*lexical_extraction.documents_with_llm_failures(store, catalog, skeleton),
             *lexical_extraction.documents_with_unflattened_extractions(store, catalog)}
    if digest == handled_digest(files):
        return digest, sorted(retry)
    newly = lexical_extraction.documents_to_reextract(read_selection_diff(files), files.skeleton, catalog)
    return digest, sorted({*newly, *retry})


def changed_extractions(settings: Settings, catalog) -> dict[str, str]:
    """doc_id -> why its extractions no longer match the current extractors (model, prompt version, rules)."""
    index = LexIndex(settings)
    store, skeleton = index.extract_store, lexical_extraction.read_skeleton(index.corpus_files.skeleton)
    openai = settings.extractor == "openai"
    return lexical_extraction.stale_documents(store, sorted(catalog), skeleton, settings.llm_model if openai else None,
                                              lexical_extraction.llm_prompt_version(settings) if openai else None,
                                              lexical_extraction.offline_extractor(settings))


def extraction_requests(partition_keys: list[str], doc_ids, run_key: str, tags: dict[str, str]) -> list[dg.RunRequest]:
    """Batched extract_documents runs over contiguous ranges of the documents' partitions."""
    requests = []
    for batch in contiguous_batches(partition_keys, set(doc_ids)):
        batch_tags = {RANGE_START: batch[0], RANGE_END: batch[-1], "lexgraph/documents": str(len(batch)), **tags}
        requests.append(dg.RunRequest(run_key=f"{run_key}-{short_hash(','.join(batch), 12)}", job_name=EXTRACTION_JOB,
                                      tags=batch_tags))
    return requests
