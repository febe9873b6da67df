"""The ``openai`` extractor: instructor over the openai client, against any OpenAI-compatible endpoint.

Configured by ``LEXGRAPH_LLM_BASE_URL``, ``LEXGRAPH_LLM_MODEL`` and ``LEXGRAPH_LLM_API_KEY``
(falling back to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), see :class:`LLMConfig`.

Failure handling, in two layers:

- transport: the openai client's own retries are off (``max_retries=0``); this module retries 429,
  408/409, 5xx, timeouts and connection errors itself, ``max_retries`` times, with exponential
  backoff from ``backoff_seconds`` capped at ``backoff_max_seconds``, honouring the server's
  ``Retry-After`` / ``retry-after-ms`` (capped the same way), so tests can make the waits tiny;
- output: instructor re-asks ``validation_retries`` times when the answer is not valid JSON or
  does not validate against the response model.

Circuit breaker, the third layer: after ``breaker_failures`` consecutive calls that failed after all
their retries (any :class:`LLMFailure`: timeouts, connection errors, 429s and 5xx past the retries,
rejected requests, malformed output), the client stops calling the endpoint. Every call while the
breaker is open fails at once with the reason ``"circuit open"`` and sends nothing; the extractor
then gives the chunk its fallback (outcome ``"fallback: circuit open"``, or ``"failed: circuit
open"`` without one) at no cost. After ``breaker_cooldown_seconds`` one call is let through as a
probe, with no transport retries (half-open): if it succeeds the breaker closes and calls resume;
if it fails the breaker opens again with the cool-down doubled, up to
``breaker_cooldown_max_seconds``. A cool-down rather than "off for the rest of the run", because a
nightly run lasts hours and an endpoint that restarts for five minutes should not cost the whole
night's extractions, and because the query service keeps one client for the life of its process:
there is no "rest of the run". Opening, re-opening and closing are logged as warnings; ``breaker``
(a :class:`CircuitBreaker`) tells the state, how often it opened and how many calls it refused.
The state lives in the client: one Dagster run step for the extractor (a batch of documents), the
process for the query service. ``breaker_failures=0`` turns the breaker off.

=====================================  ==================================================  ========
setting                                environment variable                                default
=====================================  ==================================================  ========
``breaker_failures``                   ``LEXGRAPH_LLM_BREAKER_FAILURES`` (0: off)           5
``breaker_cooldown_seconds``           ``LEXGRAPH_LLM_BREAKER_COOLDOWN``                    60
``breaker_cooldown_max_seconds``       ``LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX``                900
=====================================  ==================================================  ========

After the last retry ``extract()`` does not raise: it returns an :class:`ExtractionOutcome` with
outcome ``"failed: <reason>"`` and the error, or, when a ``fallback`` extractor was given, the
fallback's extraction with outcome ``"fallback: <reason>"``; the tokens the failed calls spent are
kept on the outcome either way. A 4xx other than 408/409/429 (bad key, unknown model) is not
retried.

Instructor mode: ``json`` by default (``response_format={"type": "json_object"}``, the schema in the
system message, the answer in ``message.content``), which vLLM, Ollama and llama.cpp's server all
support; ``tools`` (a forced function call) is available for endpoints that prefer it.

PII: an optional ``masker`` (e.g. :func:`lexgraph.extract.pii.mask_pii`) is applied to the user
message before any request. If it raises, nothing is sent and the outcome is
``"not sent: masking failed: <error>"`` with an empty extraction (no fallback: a document whose
masking fails is not indexed).
"""
from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

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
DEFAULT_MODEL = "gpt-4o-mini"
MODES = ("json", "tools")
LOCAL_API_KEY = "not-needed"  # local OpenAI-compatible servers accept any key; the client insists on one

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

_TRANSIENT_STATUS = {408, 409, 429}


class LLMConfigError(ValueError):
    """An LLM setting with an invalid value; the message names the environment variable."""


@dataclass(frozen=True)
class LLMConfig:
    """Where the LLM is and how patiently to call it. Build with :meth:`from_env`."""

    base_url: str | None = None
    model: str = DEFAULT_MODEL
    api_key: str | None = field(default=None, repr=False)
    timeout_seconds: float = 60.0
    max_retries: int = 4            # transport retries after the first request (429, 5xx, timeouts)
    validation_retries: int = 2     # instructor re-asks after a malformed or invalid answer
    backoff_seconds: float = 1.0    # first backoff; doubles each retry
    backoff_max_seconds: float = 30.0  # cap on any wait, Retry-After included
    mode: str = "json"
    entity_types: tuple[str, ...] = DEFAULT_ENTITY_TYPES
    breaker_failures: int = 5       # consecutive failed calls that open the circuit breaker; 0: no breaker
    breaker_cooldown_seconds: float = 60.0  # open this long, then one probe call; doubles after a failed probe
    breaker_cooldown_max_seconds: float = 900.0  # cap on the doubled cool-down

    ENV = {
        "base_url": ("LEXGRAPH_LLM_BASE_URL", "OPENAI_BASE_URL"),
        "model": ("LEXGRAPH_LLM_MODEL",),
        "api_key": ("LEXGRAPH_LLM_API_KEY", "OPENAI_API_KEY"),
        "timeout_seconds": ("LEXGRAPH_LLM_TIMEOUT",),
        "max_retries": ("LEXGRAPH_LLM_MAX_RETRIES",),
        "validation_retries": ("LEXGRAPH_LLM_VALIDATION_RETRIES",),
        "backoff_seconds": ("LEXGRAPH_LLM_BACKOFF",),
        "backoff_max_seconds": ("LEXGRAPH_LLM_BACKOFF_MAX",),
        "mode": ("LEXGRAPH_LLM_MODE",),
        "entity_types": ("LEXGRAPH_ENTITY_TYPES",),
        "breaker_failures": ("LEXGRAPH_LLM_BREAKER_FAILURES",),
        "breaker_cooldown_seconds": ("LEXGRAPH_LLM_BREAKER_COOLDOWN",),
        "breaker_cooldown_max_seconds": ("LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX",),
    }

    @property
    def enabled(self) -> bool:
        """An endpoint is configured (a base URL, or an API key for the default OpenAI endpoint)."""
        return bool(self.base_url or self.api_key)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "LLMConfig":
        """Read the variables in :attr:`ENV` (the first set one of each tuple wins), then ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, variables in cls.ENV.items():
            for variable in variables:
                raw = environ.get(variable, "").strip()
                if raw:
                    values[name] = _parse_setting(name, variable, raw)
                    break
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "entity_types" in values:
            values["entity_types"] = tuple(values["entity_types"])
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        def fail(name: str, message: str) -> None:
            raise LLMConfigError(f"{self.ENV[name][0]} {message}")

        if self.base_url is not None and not re.match(r"https?://[^/\s]+", self.base_url):
            fail("base_url", f"must be an http:// or https:// URL, got {self.base_url!r}")
        if not self.model or self.model != self.model.strip():
            fail("model", f"must be a model id, got {self.model!r}")
        if not 0 < self.timeout_seconds <= 3600:
            fail("timeout_seconds", f"must be seconds, more than 0 and at most 3600, got {self.timeout_seconds}")
        if not 0 <= self.max_retries <= 20:
            fail("max_retries", f"must be a whole number from 0 to 20, got {self.max_retries}")
        if not 0 <= self.validation_retries <= 10:
            fail("validation_retries", f"must be a whole number from 0 to 10, got {self.validation_retries}")
        if not 0 <= self.backoff_seconds <= 600:
            fail("backoff_seconds", f"must be seconds from 0 to 600, got {self.backoff_seconds}")
        if not 0 <= self.backoff_max_seconds <= 3600:
            fail("backoff_max_seconds", f"must be seconds from 0 to 3600, got {self.backoff_max_seconds}")
        if self.mode not in MODES:
            fail("mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.entity_types or not all(isinstance(t, str) and t.strip() for t in self.entity_types):
            fail("entity_types", f"must be a comma-separated list of type names, got {self.entity_types!r}")
        if not 0 <= self.breaker_failures <= 1000:
            fail("breaker_failures", f"must be a whole number from 0 (no breaker) to 1000, got {self.breaker_failures}")
        if not 0 <= self.breaker_cooldown_seconds <= 86400:
            fail("breaker_cooldown_seconds", f"must be seconds from 0 to 86400, got {self.breaker_cooldown_seconds}")
        if not self.breaker_cooldown_seconds <= self.breaker_cooldown_max_seconds <= 86400:
            fail("breaker_cooldown_max_seconds", "must be seconds from the cool-down "
                 f"({self.breaker_cooldown_seconds:g}) to 86400, got {self.breaker_cooldown_max_seconds}")


def _parse_setting(name: str, variable: str, raw: str) -> Any:
    try:
        if name in ("timeout_seconds", "backoff_seconds", "backoff_max_seconds", "breaker_cooldown_seconds",
                    "breaker_cooldown_max_seconds"):
            return float(raw)
        if name in ("max_retries", "validation_retries", "breaker_failures"):
            return int(raw)
    except ValueError:
        kind = "a number of seconds" if name.endswith("seconds") else "a whole number"
        raise LLMConfigError(f"{variable} must be {kind}, got {raw!r}") from None
    if name == "entity_types":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if name == "mode":
        return raw.lower()
    return raw


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


class _CallStats(threading.local):
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class LLMFailure(Exception):
    """An LLM call that failed after its retries: a short reason and the error's detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


CIRCUIT_OPEN = "circuit open"  # the LLMFailure reason of a call the breaker refused (nothing was sent)


class CircuitBreaker:
    """Consecutive-failure circuit breaker of one endpoint (see the module docstring). Thread-safe.

    closed: calls go through; ``threshold`` consecutive failed calls open it. open: calls are refused until
    the cool-down has passed, then one call is let through as a probe (half-open; the others are still
    refused). The probe's success closes it; its failure opens it again with the cool-down doubled, up to
    ``cooldown_max``. A threshold of 0 never opens.
    """

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, threshold: int, cooldown: float, cooldown_max: float, *, endpoint: str = "",
                 clock: Callable[[], float] = time.monotonic):
        self.threshold = threshold
        self.cooldown_base = cooldown
        self.cooldown_max = max(cooldown, cooldown_max)
        self.endpoint = endpoint
        self._clock = clock
        self._lock = threading.Lock()
        self.state = self.CLOSED
        self.cooldown = cooldown      # the current cool-down
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.opens = 0                # times it opened (re-opening after a failed probe included)
        self.refused = 0              # calls refused while open: nothing was sent for them
        self.probes = 0
        self.last_failure = ""        # the reason of the failure that last opened it

    def allow(self) -> str | None:
        """"call", "probe" (half-open: the one call let through after the cool-down) or None (refused)."""
        with self._lock:
            if self.state == self.CLOSED or self.threshold <= 0:
                return "call"
            if self.state == self.OPEN and self._clock() - (self.opened_at or 0.0) >= self.cooldown:
                self.state = self.HALF_OPEN
                self.probes += 1
                log.warning("LLM circuit breaker half-open: probing %s after a %gs cool-down", self.endpoint or
                            "the endpoint", self.cooldown)
                return "probe"
            self.refused += 1
            return None

    def succeeded(self) -> None:
        with self._lock:
            self.consecutive_failures = 0
            if self.state != self.CLOSED:
                log.warning("LLM circuit breaker closed: %s answers again; calls resume", self.endpoint or "the endpoint")
                self.state, self.cooldown, self.opened_at = self.CLOSED, self.cooldown_base, None

    def failed(self, reason: str, probe: bool = False) -> None:
        with self._lock:
            self.consecutive_failures += 1
            if probe or self.state == self.HALF_OPEN:
                self.cooldown = min(self.cooldown * 2, self.cooldown_max) if self.cooldown else self.cooldown_max
                self._open(reason, "the probe failed")
            elif self.state == self.CLOSED and 0 < self.threshold <= self.consecutive_failures:
                self._open(reason, f"{self.consecutive_failures} consecutive calls failed")

    def _open(self, reason: str, why: str) -> None:
        self.state, self.opened_at, self.last_failure = self.OPEN, self._clock(), reason
        self.opens += 1
        log.warning("LLM circuit breaker open: %s (last: %s); not calling %s for %gs, chunks get their "
                    "fallback extraction meanwhile", why, reason, self.endpoint or "the endpoint", self.cooldown)

    def describe(self) -> str:
        """Why a call is refused, for the refused call's error."""
        return (f"circuit breaker open after {self.threshold} consecutive failed calls (last: {self.last_failure}); "
                f"nothing sent to {self.endpoint or 'the endpoint'}, a probe follows after {self.cooldown:g}s")

    def snapshot(self) -> dict[str, Any]:
        """The state for metadata and reports."""
        with self._lock:
            return {"state": self.state, "opens": self.opens, "refused_calls": self.refused, "probes": self.probes,
                    "consecutive_failures": self.consecutive_failures, "threshold": self.threshold,
                    "cooldown_seconds": self.cooldown, "last_failure": self.last_failure}


class StructuredLLM:
    """An instructor client over one OpenAI-compatible endpoint: :meth:`call` returns a validated
    response model or raises :class:`LLMFailure` after the transport and validation retries, or at once
    while its circuit :attr:`breaker` is open. Shared by the extractor and the answerer, so both retry,
    back off, stop calling a failing endpoint and count tokens the same way."""

    def __init__(self, config: LLMConfig, *, sleep: Callable[[float], None] = time.sleep, http_client: Any = None,
                 clock: Callable[[], float] = time.monotonic):
        import instructor
        import openai

        config.validate()
        self.config = config
        self.model = config.model
        self._sleep = sleep
        api_key = config.api_key or (LOCAL_API_KEY if config.base_url else None)
        if api_key is None:
            raise LLMConfigError("LEXGRAPH_LLM_API_KEY (or OPENAI_API_KEY) is needed when no "
                                 "LEXGRAPH_LLM_BASE_URL is set")
        self._openai = openai.OpenAI(base_url=config.base_url, api_key=api_key, timeout=config.timeout_seconds,
                                     max_retries=0, http_client=http_client)
        mode = instructor.Mode.JSON if config.mode == "json" else instructor.Mode.TOOLS
        self._client = instructor.from_openai(self._openai, mode=mode)
        # instructor logs every failed attempt at ERROR, retries this class handles included; this module logs
        # each failure once, classified (unless the application configured instructor's logger itself)
        instructor_log = logging.getLogger("instructor")
        if instructor_log.level == logging.NOTSET:
            instructor_log.setLevel(logging.CRITICAL)
        self._stats = _CallStats()
        self._client.on("completion:kwargs", self._on_request)
        self._client.on("completion:response", self._on_response)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown_seconds,
                                      config.breaker_cooldown_max_seconds,
                                      endpoint=f"{config.model} at {config.base_url or 'the OpenAI API'}", clock=clock)

    def reset_stats(self) -> _CallStats:
        """Zero this thread's request and token counts, and return them (they fill in as calls are made)."""
        stats = self._stats
        stats.requests = stats.prompt_tokens = stats.completion_tokens = 0
        return stats

    def close(self) -> None:
        self._openai.close()

    # hooks: count every HTTP request and the usage of every response, retries included
    def _on_request(self, *args: Any, **kwargs: Any) -> None:
        self._stats.requests += 1

    def _on_response(self, response: Any) -> None:
        usage = getattr(response, "usage", None)
        if usage is not None:
            self._stats.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
            self._stats.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)

    def call(self, messages: list[dict[str, str]], response_model: type) -> Any:
        """The validated answer, or LLMFailure after the last transport or validation retry, or at once (reason
        "circuit open", nothing sent) while the circuit breaker is open."""
        permit = self.breaker.allow()
        if permit is None:
            raise LLMFailure(CIRCUIT_OPEN, self.breaker.describe())
        probe = permit == "probe"
        try:
            answer = self._call(messages, response_model, 0 if probe else self.config.max_retries)
        except LLMFailure as failure:
            self.breaker.failed(failure.reason, probe=probe)
            raise
        except BaseException:  # not the endpoint's fault (an interrupt): a probe must not leave it half-open
            if probe:
                self.breaker.failed("interrupted", probe=True)
            raise
        self.breaker.succeeded()
        return answer

    def _call(self, messages: list[dict[str, str]], response_model: type, max_retries: int) -> Any:
        import instructor.core.exceptions as instructor_errors

        retry_number = 0
        while True:
            try:
                answer, _completion = self._client.chat.completions.create_with_completion(
                    model=self.model, messages=[dict(m) for m in messages], response_model=response_model,
                    max_retries=self.config.validation_retries, temperature=0, strict=False)
                # a plain instance: without instructor's private _raw_response (memory, equality)
                return response_model.model_validate(answer.model_dump())
            except instructor_errors.InstructorRetryException as error:
                cause = error.__cause__ or error
                attempts = getattr(error, "n_attempts", None)
            except Exception as error:  # noqa: BLE001 - classified below
                cause, attempts = error, None
            transient, reason, delay_hint = _classify(cause, attempts)
            if not transient:
                raise LLMFailure(reason, _describe(cause))
            if retry_number >= max_retries:
                tries = "1 try" if retry_number == 0 else f"{retry_number + 1} tries"
                raise LLMFailure(f"{reason} after {tries}", _describe(cause))
            delay = self._backoff(retry_number, delay_hint)
            log.info("LLM %s (%s); retry %d of %d in %.2fs", reason, _describe(cause)[:200], retry_number + 1,
                     max_retries, delay)
            self._sleep(delay)
            retry_number += 1

    def _backoff(self, retry_number: int, retry_after: float | None) -> float:
        cap = self.config.backoff_max_seconds
        if retry_after is not None:
            return max(0.0, min(retry_after, cap))
        base = min(self.config.backoff_seconds * (2 ** retry_number), cap)
        return base * (0.75 + 0.25 * random.random())  # jitter, so parallel workers do not retry in step


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


def _classify(error: BaseException, attempts: int | None) -> tuple[bool, str, float | None]:
    """(transient?, short reason, Retry-After seconds) for an exception from a completion call."""
    import openai
    from pydantic import ValidationError

    if isinstance(error, openai.APITimeoutError):
        return True, "timeout", None
    if isinstance(error, openai.APIConnectionError):
        return True, "connection error", None
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        retry_after = _retry_after(getattr(error, "response", None))
        if status == 429:
            return True, "rate limited (429)", retry_after
        if status in _TRANSIENT_STATUS or status >= 500:
            return True, f"server error ({status})", retry_after
        return False, f"request rejected ({status})", None
    if isinstance(error, (ValidationError, json.JSONDecodeError, openai.APIResponseValidationError)) or \
            type(error).__name__ in ("ResponseParsingError", "IncompleteOutputException"):
        tries = f" after {attempts} attempts" if attempts else ""
        return False, f"malformed output{tries}", None
    return False, f"error ({type(error).__name__})", None


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        return None
    return max(0.0, parsed.timestamp() - time.time())


def _describe(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " ")
    return f"{type(error).__name__}: {text[:500]}" if text else type(error).__name__
