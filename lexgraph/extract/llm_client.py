"""The LLM client: one instructor client over an OpenAI-compatible endpoint, with its retries and circuit breaker.

:class:`StructuredLLM` is shared by the extractor (:mod:`lexgraph.extract.llm_extractor`) and the answerer,
so both retry, back off, stop calling a failing endpoint and count tokens the same way. Its settings are an
:class:`~lexgraph.extract.llm_config.LLMConfig`.

Failure handling, in two layers:

- transport: the openai client's own retries are off (``max_retries=0``); this module retries 429,
  408/409, 5xx, timeouts and connection errors itself, ``max_retries`` times, with exponential
  backoff from ``backoff_seconds`` capped at ``backoff_max_seconds``, honouring the server's
  ``Retry-After`` / ``retry-after-ms`` (capped the same way), so tests can make the waits tiny;
- output: instructor re-asks ``validation_retries`` times when the answer is not valid JSON or
  does not validate against the response model.

A 4xx other than 408/409/429 (bad key, unknown model) is not retried. A call that failed after its
retries raises :class:`LLMFailure`, with a short reason and the error's detail.

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
"""
from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
import time
from typing import Any, Callable

from lexgraph.extract.llm_config import LLMConfig, LLMConfigError

log = logging.getLogger(__name__)

LOCAL_API_KEY = "not-needed"  # local OpenAI-compatible servers accept any key; the client insists on one

_TRANSIENT_STATUS = {408, 409, 429}


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
