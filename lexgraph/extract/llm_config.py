"""Where the LLM is and how patiently to call it: :class:`LLMConfig`, taken from the one :class:`~lexgraph.settings.Settings`.

The variables (``LEXGRAPH_LLM_BASE_URL``, ``LEXGRAPH_LLM_MODEL``, ``LEXGRAPH_LLM_API_KEY``, falling back to
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, and the client's ``LEXGRAPH_LLM_TIMEOUT`` ... ``_BREAKER_COOLDOWN_MAX``)
are read and checked by ``Settings.from_env``; :meth:`LLMConfig.from_settings` takes them from the settings it is
handed, so a key or endpoint given in a Settings object is the one the client uses. What the retry, backoff and
circuit-breaker settings do is in :mod:`lexgraph.extract.llm_client`.

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

from dataclasses import dataclass, field

from lexgraph.defaults import (DEFAULT_ENTITY_TYPES, DEFAULT_LLM_BACKOFF, DEFAULT_LLM_BACKOFF_MAX,
                               DEFAULT_LLM_BREAKER_COOLDOWN, DEFAULT_LLM_BREAKER_COOLDOWN_MAX,
                               DEFAULT_LLM_BREAKER_FAILURES, DEFAULT_LLM_MAX_RETRIES, DEFAULT_LLM_MODE,
                               DEFAULT_LLM_MODEL, DEFAULT_LLM_TIMEOUT, DEFAULT_LLM_VALIDATION_RETRIES, LLM_MODES)
from lexgraph.settings import Settings, SettingsError, check_llm_client

DEFAULT_MODEL = DEFAULT_LLM_MODEL
MODES = LLM_MODES


class LLMConfigError(SettingsError):
    """An LLM setting with an invalid value, or a missing one; the message names the environment variable."""


@dataclass(frozen=True)
class LLMConfig:
    """Where the LLM is and how patiently to call it. Build with :meth:`from_settings`."""

    base_url: str | None = None
    model: str = DEFAULT_MODEL
    api_key: str | None = field(default=None, repr=False)
    timeout_seconds: float = DEFAULT_LLM_TIMEOUT
    max_retries: int = DEFAULT_LLM_MAX_RETRIES  # transport retries after the first request (429, 5xx, timeouts)
    validation_retries: int = DEFAULT_LLM_VALIDATION_RETRIES  # instructor re-asks after a malformed or invalid answer
    backoff_seconds: float = DEFAULT_LLM_BACKOFF  # first backoff; doubles each retry
    backoff_max_seconds: float = DEFAULT_LLM_BACKOFF_MAX  # cap on any wait, Retry-After included
    mode: str = DEFAULT_LLM_MODE
    entity_types: tuple[str, ...] = DEFAULT_ENTITY_TYPES
    breaker_failures: int = DEFAULT_LLM_BREAKER_FAILURES  # consecutive failed calls that open the breaker; 0: none
    breaker_cooldown_seconds: float = DEFAULT_LLM_BREAKER_COOLDOWN  # open this long, then one probe call
    breaker_cooldown_max_seconds: float = DEFAULT_LLM_BREAKER_COOLDOWN_MAX  # cap on the doubled cool-down

    @property
    def enabled(self) -> bool:
        """An endpoint is configured (a base URL, or an API key for the default OpenAI endpoint)."""
        return bool(self.base_url or self.api_key)

    @classmethod
    def from_settings(cls, settings: Settings) -> "LLMConfig":
        """The endpoint, model, key, entity types and the client's patience of these settings (checked there)."""
        return cls(base_url=settings.llm_base_url or None, model=settings.llm_model,
                   api_key=settings.llm_api_key or None, timeout_seconds=settings.llm_timeout,
                   max_retries=settings.llm_max_retries, validation_retries=settings.llm_validation_retries,
                   backoff_seconds=settings.llm_backoff, backoff_max_seconds=settings.llm_backoff_max,
                   mode=settings.llm_mode, entity_types=tuple(settings.entity_types),
                   breaker_failures=settings.llm_breaker_failures,
                   breaker_cooldown_seconds=settings.llm_breaker_cooldown,
                   breaker_cooldown_max_seconds=settings.llm_breaker_cooldown_max)

    def validate(self) -> None:
        """The client's patience checked as Settings checks it, for a config built by hand (the client calls this;
        the endpoint, model and entity types of a config from settings were checked there)."""
        try:
            check_llm_client(self.timeout_seconds, self.max_retries, self.validation_retries, self.backoff_seconds,
                             self.backoff_max_seconds, self.mode, self.breaker_failures, self.breaker_cooldown_seconds,
                             self.breaker_cooldown_max_seconds)
        except SettingsError as error:
            raise LLMConfigError(str(error)) from None
