"""Where the LLM is and how patiently to call it: :class:`LLMConfig`, read from the environment and checked.

Configured by ``LEXGRAPH_LLM_BASE_URL``, ``LEXGRAPH_LLM_MODEL`` and ``LEXGRAPH_LLM_API_KEY``
(falling back to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``); the other variables are in :attr:`LLMConfig.ENV`.
What the retry, backoff and circuit-breaker settings do is in :mod:`lexgraph.extract.llm_client`.

=====================================  ==================================================  ========
setting                                environment variable                                default
=====================================  ==================================================  ========
``breaker_failures``                   ``LEXGRAPH_LLM_BREAKER_FAILURES`` (0: off)           5
``breaker_cooldown_seconds``           ``LEXGRAPH_LLM_BREAKER_COOLDOWN``                    60
``breaker_cooldown_max_seconds``       ``LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX``                900
=====================================  ==================================================  ========

Instructor mode: ``json`` by default (``response_format={"type": "json_object"}``, the schema in the
system message, the answer in ``message.content``), which vLLM, Ollama and llama.cpp's server all
support; ``tools`` (a forced function call) is available for endpoints that prefer it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from lexgraph.extract.schemas import DEFAULT_ENTITY_TYPES

DEFAULT_MODEL = "gpt-4o-mini"
MODES = ("json", "tools")


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
