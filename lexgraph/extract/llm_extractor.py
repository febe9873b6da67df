"""The ``openai`` extractor: one chunk → one :class:`ChunkExtraction`, through instructor and an
OpenAI-compatible endpoint (:class:`OpenAIExtractor`), with its prompt and prompt version.

The endpoint, the model and the retries are configured by
:class:`~lexgraph.extract.llm_config.LLMConfig`; the calls, retries and circuit breaker are
:class:`~lexgraph.extract.llm_client.StructuredLLM`'s.

After the last retry ``extract()`` does not raise: it returns an :class:`ExtractionOutcome` with
outcome ``"failed: <reason>"`` and the error, or, when a ``fallback`` extractor was given, the
fallback's extraction with outcome ``"fallback: <reason>"``; the tokens the failed calls spent are
kept on the outcome either way. While the circuit breaker is open nothing is sent and the outcome is
``"fallback: circuit open"`` (``"failed: circuit open"`` without a fallback).

PII: an optional ``masker`` (e.g. :func:`lexgraph.extract.pii.mask_pii`) is applied to the user
message before any request. If it raises, nothing is sent and the outcome is
``"not sent: masking failed: <error>"`` with an empty extraction (no fallback: a document whose
masking fails is not indexed).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable

from lexgraph.extract.llm_client import CIRCUIT_OPEN, LLMFailure, StructuredLLM
from lexgraph.extract.llm_config import LLMConfig
from lexgraph.extract.schemas import (
    DEFAULT_ENTITY_TYPES,
    ChunkExtraction,
    ChunkInput,
    ExtractionOutcome,
    Extractor,
    extraction_model,
)
from lexgraph.ids import short_hash

log = logging.getLogger(__name__)

EXTRACTOR_NAME = "openai"

SYSTEM_PROMPT = """\
You turn one chunk of a document into a small knowledge graph. Use only what the chunk says; \
do not add outside knowledge and do not invent entities.

Return:
1. topics: the few subjects the chunk discusses (a section heading is a good topic name). Under each \
topic, list standalone statements. Each statement makes exactly one claim, in one sentence, and can be \
understood on its own: replace pronouns and references such as "it", "he", "the company" or \
"this agreement" with the names they refer to. Keep dates, amounts and qualifiers.
2. facts: for each statement, the (subject, predicate, object) facts it asserts; subject and object are \
entity names as written in the entities list, or values such as dates and amounts.
3. entities: every named entity in the chunk, each with a type from this list: {entity_types}; a short \
description from the chunk; and "mention": one line on how the entity appears in this chunk.
4. relations: relationships between two of those entities: source and target (exact entity names), a \
short predicate, a one-sentence description, and a strength from 0 to 1 for how explicitly the chunk \
states it.

If the chunk holds nothing worth extracting, return empty lists."""

USER_TEMPLATE = """\
Section: {heading_path}
<chunk>
{text}
</chunk>"""


def compute_prompt_version(system_prompt: str = SYSTEM_PROMPT, entity_types: Iterable[str] = DEFAULT_ENTITY_TYPES,
                           response_model: type | None = None, user_template: str = USER_TEMPLATE,
                           masking: str | None = None) -> str:
    """Short hash of everything that shapes the answer besides the model: the system prompt, the user
    message template, the response model's JSON schema, the entity types and whether PII is masked."""
    types = list(entity_types)
    model = response_model if response_model is not None else extraction_model(types)
    material = {
        "system": system_prompt,
        "user": user_template,
        "schema": model.model_json_schema(),
        "entity_types": types,
        "masking": masking,
    }
    return "p" + short_hash(json.dumps(material, sort_keys=True, ensure_ascii=False), 12)


class OpenAIExtractor(StructuredLLM):
    """One chunk → one :class:`ChunkExtraction`, through instructor and an OpenAI-compatible endpoint.

    Thread-safe: one extractor can serve several worker threads (token and request counts are per call).
    """

    name = EXTRACTOR_NAME

    def __init__(self, config: LLMConfig, *, fallback: Extractor | None = None,
                 masker: Callable[[str], Any] | None = None, system_prompt: str = SYSTEM_PROMPT,
                 sleep: Callable[[float], None] = time.sleep, http_client: Any = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(config, sleep=sleep, http_client=http_client, clock=clock)
        self.fallback = fallback
        self.masker = masker
        self.entity_types = tuple(config.entity_types)
        self.response_model = extraction_model(self.entity_types)
        self.system_prompt = system_prompt.replace("{entity_types}", ", ".join(self.response_model.entity_types))
        masking = None if masker is None else getattr(masker, "__qualname__", type(masker).__name__)
        self.prompt_version = compute_prompt_version(self.system_prompt, self.response_model.entity_types,
                                                     self.response_model, USER_TEMPLATE, masking)

    def __repr__(self) -> str:
        return (f"OpenAIExtractor(model={self.model!r}, base_url={self.config.base_url!r}, "
                f"prompt_version={self.prompt_version!r})")

    # -- the prompt -----------------------------------------------------------------------------------------

    def user_message(self, chunk: ChunkInput) -> str:
        """The user message for ``chunk``, masked when a masker is set (raises if masking fails)."""
        message = USER_TEMPLATE.format(heading_path=chunk.heading_path or "(none)", text=chunk.text)
        if self.masker is None:
            return message
        masked = self.masker(message)
        masked = getattr(masked, "text", masked)
        if not isinstance(masked, str):
            raise TypeError(f"masker returned {type(masked).__name__}, not text")
        return masked

    def cache_text(self, chunk: ChunkInput) -> str:
        """What the extraction depends on besides model and prompt version: for the cache key."""
        return f"{chunk.heading_path}\n{chunk.text}"

    def messages(self, user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    # -- extraction -----------------------------------------------------------------------------------------

    def extract(self, chunk: ChunkInput) -> ExtractionOutcome:
        started = time.monotonic()
        stats = self.reset_stats()
        try:
            user = self.user_message(chunk)
        except Exception as error:  # noqa: BLE001 - any masking failure means: do not send
            detail = f"{type(error).__name__}: {error}"
            log.warning("chunk %s not sent to the LLM: masking failed: %s", chunk.chunk_id, detail)
            return ExtractionOutcome(ChunkExtraction(), self.name, self.model, self.prompt_version,
                                     seconds=time.monotonic() - started, outcome=f"not sent: masking failed: {detail}",
                                     attempts=0, error=detail)
        try:
            extraction = self.call(self.messages(user), self.response_model)
        except LLMFailure as failure:
            return self._failed(chunk, failure, started)
        return ExtractionOutcome(extraction, self.name, self.model, self.prompt_version,
                                 prompt_tokens=stats.prompt_tokens, completion_tokens=stats.completion_tokens,
                                 seconds=time.monotonic() - started, outcome="ok", attempts=stats.requests)

    def _failed(self, chunk: ChunkInput, failure: LLMFailure, started: float) -> ExtractionOutcome:
        stats = self._stats
        if failure.reason == CIRCUIT_OPEN:  # the breaker warned once when it opened; nothing was sent
            log.debug("chunk %s not sent to the LLM: %s", chunk.chunk_id, failure.detail)
        else:
            log.warning("LLM extraction of chunk %s failed: %s (%s)", chunk.chunk_id, failure.reason,
                        failure.detail[:300])
        error = f"{self.model}: {failure.reason}: {failure.detail}"
        spent = dict(prompt_tokens=stats.prompt_tokens, completion_tokens=stats.completion_tokens,
                     attempts=stats.requests)
        if self.fallback is not None:
            try:
                backup = self.fallback.extract(chunk)
            except Exception as fallback_error:  # noqa: BLE001 - report both failures
                error += f"; fallback {self.fallback.name} failed too: {type(fallback_error).__name__}: {fallback_error}"
            else:
                return ExtractionOutcome(backup.extraction, backup.extractor, backup.model, backup.prompt_version,
                                         seconds=time.monotonic() - started, outcome=f"fallback: {failure.reason}",
                                         error=error, **spent)
        return ExtractionOutcome(ChunkExtraction(), self.name, self.model, self.prompt_version,
                                 seconds=time.monotonic() - started, outcome=f"failed: {failure.reason}",
                                 error=error, **spent)

    def ledger_row(self, outcome: ExtractionOutcome, chunk: ChunkInput, *, run_id: str,
                   stage: str = "chunk_extractions", cache_hit: bool = False) -> dict[str, Any]:
        """The cost-ledger row of one extraction. The model is this extractor's LLM even when the
        extraction came from the fallback, because the tokens were spent on the LLM."""
        return {"run_id": run_id, "stage": stage, "doc_id": chunk.doc_id, "chunk_id": chunk.chunk_id,
                "model": self.model, "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens, "seconds": float(outcome.seconds),
                "cache_hit": cache_hit, "outcome": outcome.outcome, "attempts": 0 if cache_hit else outcome.attempts}
