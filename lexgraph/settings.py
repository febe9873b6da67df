"""The one configuration: every documented variable is read here, from the environment, into one Settings
object. The CLI, `lexgraph serve` and the Dagster resources are built from it and hand it down (to the stores, the
embedder, the extractors and the LLM client, the HTTP server), so no two commands disagree about the index and no
other module reads a variable. The defaults are in lexgraph.defaults, below this module."""
from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping
from urllib.parse import urlparse

from lexgraph.defaults import (DEFAULT_BETA, DEFAULT_CHUNK_TOKENS, DEFAULT_EMBED_BACKEND, DEFAULT_EMBED_MODEL,
                               DEFAULT_ENTITY_TYPES, DEFAULT_KNN_K, DEFAULT_LANCE_THRESHOLD, DEFAULT_LLM_BACKOFF,
                               DEFAULT_LLM_BACKOFF_MAX, DEFAULT_LLM_BREAKER_COOLDOWN, DEFAULT_LLM_BREAKER_COOLDOWN_MAX,
                               DEFAULT_LLM_BREAKER_FAILURES, DEFAULT_LLM_MAX_RETRIES, DEFAULT_LLM_MODE,
                               DEFAULT_LLM_MODEL, DEFAULT_LLM_TIMEOUT, DEFAULT_LLM_VALIDATION_RETRIES,
                               DEFAULT_QUESTIONS, DEFAULT_SERVE_TORCH_THREADS, EMBED_BACKENDS, KNN_MODES, LLM_MODES,
                               PII_MASKING, QUERY_BACKENDS, TORCH, GRAPH_BACKENDS)
from lexgraph.embedding_model import model_input_limit
from lexgraph.ids import short_hash

# Bump when chunking output changes for the same input, so a new index version is built.
CHUNKER_VERSION = "3"
MIN_CHUNK_TOKENS = 16
MIN_KNN_K, MAX_KNN_K = 1, 200
MIN_LANCE_THRESHOLD = 1


class SettingsError(ValueError):
    """A setting with an invalid value; the message names the variable and what it accepts."""


class _NotANumber(ValueError):
    """A numeric variable whose text is not a number; args[0] says what it must be ("a whole number", ...)."""


def _whole(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise _NotANumber("a whole number") from None


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise _NotANumber("a number") from None


def _seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise _NotANumber("a number of seconds") from None


# What LEXGRAPH_PII_MASKING accepts besides on and off.
_SWITCH = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


def _switch(raw: str) -> str:
    return _SWITCH.get(raw.lower(), raw.lower())


def _names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip().casefold() for part in raw.split(","))


def _paths(raw: str) -> tuple[Path, ...]:
    return tuple(Path(part.strip()) for part in raw.split(",") if part.strip())


def _variable(name: str, default: Any, parse: Callable[[str], Any] | None = None, *, fallback: str | None = None,
              secret: bool = False) -> Any:
    """A setting read from the environment variable `name` (then `fallback`, when that is unset or empty), its text
    parsed by `parse` (by default by the default's type). A secret is never in the repr nor in to_env()."""
    if parse is None:
        parse = Path if isinstance(default, Path) else {int: _whole, float: _number, str: str}[type(default)]
    return field(default=default, repr=not secret,
                 metadata={"variable": name, "fallback": fallback, "parse": parse, "secret": secret})


@dataclass(frozen=True)
class Settings:
    """Every setting: where the index lives and how it is built, the LLM endpoint and the client's patience, the
    query side and the HTTP server. Build it once, with Settings.from_env(), and hand it down."""

    home: Path = _variable("LEXGRAPH_HOME", Path(".lexgraph"))
    collection: str = _variable("LEXGRAPH_COLLECTION", "default")
    embed_model: str = _variable("LEXGRAPH_EMBED_MODEL", DEFAULT_EMBED_MODEL)
    # torch, onnx or onnx-int8 (lexgraph.extract.embedder): part of the index version, vectors never mix
    embed_backend: str = _variable("LEXGRAPH_EMBED_BACKEND", DEFAULT_EMBED_BACKEND, str.lower)
    chunk_tokens: int = _variable("LEXGRAPH_CHUNK_TOKENS", DEFAULT_CHUNK_TOKENS)
    inbox: Path = _variable("LEXGRAPH_INBOX", Path("sample/corpus"))
    knn_k: int = _variable("LEXGRAPH_KNN_K", DEFAULT_KNN_K)
    knn_mode: str = _variable("LEXGRAPH_KNN_MODE", "auto")
    beta: float = _variable("LEXGRAPH_BETA", DEFAULT_BETA)
    # The LLM extractor: an OpenAI-compatible endpoint; none means the offline NLP extractor (spaCy).
    llm_base_url: str = _variable("LEXGRAPH_LLM_BASE_URL", "", fallback="OPENAI_BASE_URL")
    llm_model: str = _variable("LEXGRAPH_LLM_MODEL", DEFAULT_LLM_MODEL)
    # Never shown: not in repr, never in metadata, never a plain value in a Dagster resource's config.
    llm_api_key: str = _variable("LEXGRAPH_LLM_API_KEY", "", fallback="OPENAI_API_KEY", secret=True)
    pii_masking: str = _variable("LEXGRAPH_PII_MASKING", "off", _switch)
    entity_types: tuple[str, ...] = _variable("LEXGRAPH_ENTITY_TYPES", tuple(DEFAULT_ENTITY_TYPES), _names)
    # The query router's own labelled questions (JSON lists of {question, route}), beside the shipped ones.
    router_exemplars: tuple[Path, ...] = _variable("LEXGRAPH_ROUTER_EXEMPLARS", (), _paths)
    query_backend: str = _variable("LEXGRAPH_QUERY_BACKEND", "auto", str.lower)
    graph_backend: str = _variable("LEXGRAPH_GRAPH_BACKEND", "kuzu", str.lower)
    lance_threshold: int = _variable("LEXGRAPH_LANCE_THRESHOLD", DEFAULT_LANCE_THRESHOLD)
    # The LLM client's patience (lexgraph.extract.llm_client): transport retries with backoff, re-asks after a
    # malformed answer, and the circuit breaker (docs/RELIABILITY.md).
    llm_timeout: float = _variable("LEXGRAPH_LLM_TIMEOUT", DEFAULT_LLM_TIMEOUT, _seconds)
    llm_max_retries: int = _variable("LEXGRAPH_LLM_MAX_RETRIES", DEFAULT_LLM_MAX_RETRIES)
    llm_validation_retries: int = _variable("LEXGRAPH_LLM_VALIDATION_RETRIES", DEFAULT_LLM_VALIDATION_RETRIES)
    llm_backoff: float = _variable("LEXGRAPH_LLM_BACKOFF", DEFAULT_LLM_BACKOFF, _seconds)
    llm_backoff_max: float = _variable("LEXGRAPH_LLM_BACKOFF_MAX", DEFAULT_LLM_BACKOFF_MAX, _seconds)
    llm_mode: str = _variable("LEXGRAPH_LLM_MODE", DEFAULT_LLM_MODE, str.lower)
    llm_breaker_failures: int = _variable("LEXGRAPH_LLM_BREAKER_FAILURES", DEFAULT_LLM_BREAKER_FAILURES)
    llm_breaker_cooldown: float = _variable("LEXGRAPH_LLM_BREAKER_COOLDOWN", DEFAULT_LLM_BREAKER_COOLDOWN, _seconds)
    llm_breaker_cooldown_max: float = _variable("LEXGRAPH_LLM_BREAKER_COOLDOWN_MAX", DEFAULT_LLM_BREAKER_COOLDOWN_MAX,
                                                _seconds)
    # `lexgraph serve` (lexgraph.query.http_api): the bearer token it requires (--token wins), and torch's threads.
    serve_token: str = _variable("LEXGRAPH_SERVE_TOKEN", "", secret=True)
    serve_torch_threads: int = _variable("LEXGRAPH_SERVE_TORCH_THREADS", DEFAULT_SERVE_TORCH_THREADS)
    # The questions file of the retrieval_benchmark asset (its run config's `questions` wins).
    questions: Path = _variable("LEXGRAPH_QUESTIONS", Path(DEFAULT_QUESTIONS))

    # Each field's environment variable, as documented in docs/SETTINGS.md; the variables read when the
    # LEXGRAPH_ one is unset or empty; and the fields that are secrets.
    ENV: ClassVar[Mapping[str, str]]
    FALLBACK_ENV: ClassVar[Mapping[str, str]]
    SECRETS: ClassVar[tuple[str, ...]]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Settings from the LEXGRAPH_* variables of `environ` (default: the process's), explicit overrides
        winning (None: not overridden; text is parsed as the variable's would be), validated."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            for variable in (f.metadata["variable"], f.metadata["fallback"]):
                raw = environ.get(variable, "").strip() if variable else ""
                if raw:
                    values[f.name] = _parse(f, variable, raw, environ)
                    break
        by_name = {f.name: f for f in fields(cls)}
        for name, value in overrides.items():
            if value is None:
                continue
            if name not in by_name:
                raise TypeError(f"Settings has no setting {name!r}")
            f = by_name[name]
            if isinstance(value, str) and not isinstance(f.default, str):
                value = _parse(f, f.metadata["variable"], value, environ)
            elif isinstance(f.default, Path):
                value = Path(value)
            values[name] = value
        settings = cls(**values)
        settings.validate()
        return settings

    def to_env(self) -> dict[str, str]:
        """The variables that give these settings, the secrets left out: Settings.from_env(s.to_env()) is s
        without its secrets. The form a Dagster resource carries them in (resources.IndexResource)."""
        return {f.metadata["variable"]: _format(getattr(self, f.name)) for f in fields(self)
                if not f.metadata["secret"]}

    def with_(self, **changes) -> "Settings":
        settings = replace(self, **changes)
        settings.validate()
        return settings

    def validate(self) -> None:
        if (not self.collection or any(c in self.collection for c in '/\\\0')
                or self.collection in (".", "..")):
            raise SettingsError(f"LEXGRAPH_COLLECTION must be a plain folder name (no '/' or '\\', not '.' or "
                                f"'..'), got {self.collection!r}")
        _check_folder("LEXGRAPH_HOME", Path(self.home))
        if self.embed_backend not in EMBED_BACKENDS:
            raise SettingsError(f"LEXGRAPH_EMBED_BACKEND must be one of {', '.join(EMBED_BACKENDS)}, "
                                f"got {self.embed_backend!r}")
        limit = _input_limit(self.embed_model)
        if not MIN_CHUNK_TOKENS <= self.chunk_tokens <= limit:
            raise SettingsError(f"LEXGRAPH_CHUNK_TOKENS must be a whole number from {MIN_CHUNK_TOKENS} to {limit} "
                                f"(the input limit of {self.embed_model} in word pieces), got {self.chunk_tokens}")
        if not MIN_KNN_K <= self.knn_k <= MAX_KNN_K:
            raise SettingsError(f"LEXGRAPH_KNN_K must be a whole number from {MIN_KNN_K} to {MAX_KNN_K}, "
                                f"got {self.knn_k}")
        if self.knn_mode not in KNN_MODES:
            raise SettingsError(f"LEXGRAPH_KNN_MODE must be one of {', '.join(KNN_MODES)}, got {self.knn_mode!r}")
        if not 0.0 <= self.beta <= 1.0:  # also refuses nan
            raise SettingsError(f"LEXGRAPH_BETA must be a number from 0 to 1 (the share of chunks selected "
                                f"for extraction), got {self.beta}")
        if self.llm_base_url:
            url = urlparse(self.llm_base_url)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise SettingsError(f"LEXGRAPH_LLM_BASE_URL (or OPENAI_BASE_URL) must be an http(s) URL of an "
                                    f"OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1, got "
                                    f"{self.llm_base_url!r}")
        if not self.llm_model.strip() or any(c.isspace() for c in self.llm_model):
            raise SettingsError(f"LEXGRAPH_LLM_MODEL must be a model id without spaces, got {self.llm_model!r}")
        if self.pii_masking not in PII_MASKING:
            raise SettingsError(f"LEXGRAPH_PII_MASKING must be one of {', '.join(PII_MASKING)}, "
                                f"got {self.pii_masking!r}")
        if self.graph_backend not in GRAPH_BACKENDS:
            raise SettingsError(f"LEXGRAPH_GRAPH_BACKEND must be one of {', '.join(GRAPH_BACKENDS)}, "
                                f"got {self.graph_backend!r}")
        if self.query_backend not in QUERY_BACKENDS:
            raise SettingsError(f"LEXGRAPH_QUERY_BACKEND must be one of {', '.join(QUERY_BACKENDS)}, "
                                f"got {self.query_backend!r}")
        if self.lance_threshold < MIN_LANCE_THRESHOLD:
            raise SettingsError(f"LEXGRAPH_LANCE_THRESHOLD must be a whole number of chunks from "
                                f"{MIN_LANCE_THRESHOLD} on, got {self.lance_threshold}")
        for path in self.router_exemplars:
            if not Path(path).is_file():
                raise SettingsError(f"LEXGRAPH_ROUTER_EXEMPLARS names {str(path)!r}, which is not a file (a "
                                    "comma-separated list of JSON files of {question, route} records)")
        if (not self.entity_types or any(not t.strip() or "," in t for t in self.entity_types)
                or len(set(self.entity_types)) != len(self.entity_types)):
            raise SettingsError("LEXGRAPH_ENTITY_TYPES must be a comma-separated list of distinct, non-empty "
                                f"entity types, e.g. {','.join(DEFAULT_ENTITY_TYPES)}, got "
                                f"{','.join(self.entity_types)!r}")
        check_llm_client(self.llm_timeout, self.llm_max_retries, self.llm_validation_retries, self.llm_backoff,
                         self.llm_backoff_max, self.llm_mode, self.llm_breaker_failures, self.llm_breaker_cooldown,
                         self.llm_breaker_cooldown_max)
        if not 1 <= self.serve_torch_threads <= 256:
            raise SettingsError(f"LEXGRAPH_SERVE_TORCH_THREADS must be a whole number from 1 to 256, "
                                f"got {self.serve_torch_threads}")

    @property
    def index_version(self) -> str:
        # torch adds nothing, so indexes built before the backend was a setting keep their version
        backend = "" if self.embed_backend == TORCH else f"|{self.embed_backend}"
        # Kùzu adds nothing either; another graph database is another index (its graph is built from the start)
        graph = "" if self.graph_backend == "kuzu" else f"|graph={self.graph_backend}"
        return "v" + short_hash(f"{CHUNKER_VERSION}|{self.embed_model}|{self.chunk_tokens}{backend}{graph}", 8)

    @property
    def index_dir(self) -> Path:
        return Path(self.home) / self.collection / self.index_version

    @property
    def extract_dir(self) -> Path:
        return self.index_dir / "extract"

    @property
    def lance_uri(self) -> str:
        return str(self.index_dir / "lance")

    @property
    def graph_path(self) -> str:
        return str(self.index_dir / ("graph.lbug" if self.graph_backend == "ladybug" else "graph.kuzu"))

    @property
    def ledger_dir(self) -> Path:
        """The cost ledger: one row per model call (embeddings and LLM), kept with the index."""
        return self.index_dir / "ledger"

    @property
    def extraction_cache_dir(self) -> Path:
        """LLM extractions by (chunk content hash, model, prompt version), kept with the index."""
        return self.index_dir / "extraction_cache"

    @property
    def extractor(self) -> str:
        """`openai` when an endpoint is configured, else the LLM-free `nlp` extractor (spaCy)."""
        return "openai" if self.llm_base_url else "nlp"

    @property
    def pii_masking_enabled(self) -> bool:
        return self.pii_masking == "on"

    def uses_lance(self, chunk_count: int) -> bool:
        """Whether queries go through LanceDB's ANN and full-text indexes for an index of this many chunks."""
        if self.query_backend == "auto":
            return chunk_count >= self.lance_threshold
        return self.query_backend == "lance"


Settings.ENV = MappingProxyType({f.name: f.metadata["variable"] for f in fields(Settings)})
Settings.FALLBACK_ENV = MappingProxyType({f.name: f.metadata["fallback"] for f in fields(Settings)
                                          if f.metadata["fallback"]})
Settings.SECRETS = tuple(f.name for f in fields(Settings) if f.metadata["secret"])

def check_llm_client(timeout: float, max_retries: int, validation_retries: int, backoff: float, backoff_max: float,
                     mode: str, breaker_failures: int, breaker_cooldown: float, breaker_cooldown_max: float) -> None:
    """The LLM client's settings (Settings.llm_timeout and the rest, lexgraph.extract.llm_config.LLMConfig's
    fields), checked; a bad one raises SettingsError naming its variable."""
    def check(ok: bool, name: str, message: str) -> None:
        if not ok:
            raise SettingsError(f"{Settings.ENV[name]} {message}")

    check(0 < timeout <= 3600, "llm_timeout", f"must be seconds, more than 0 and at most 3600, got {timeout}")
    check(0 <= max_retries <= 20, "llm_max_retries", f"must be a whole number from 0 to 20, got {max_retries}")
    check(0 <= validation_retries <= 10, "llm_validation_retries",
          f"must be a whole number from 0 to 10, got {validation_retries}")
    check(0 <= backoff <= 600, "llm_backoff", f"must be seconds from 0 to 600, got {backoff}")
    check(0 <= backoff_max <= 3600, "llm_backoff_max", f"must be seconds from 0 to 3600, got {backoff_max}")
    check(mode in LLM_MODES, "llm_mode", f"must be one of {', '.join(LLM_MODES)}, got {mode!r}")
    check(0 <= breaker_failures <= 1000, "llm_breaker_failures",
          f"must be a whole number from 0 (no breaker) to 1000, got {breaker_failures}")
    check(0 <= breaker_cooldown <= 86400, "llm_breaker_cooldown",
          f"must be seconds from 0 to 86400, got {breaker_cooldown}")
    check(breaker_cooldown <= breaker_cooldown_max <= 86400, "llm_breaker_cooldown_max",
          f"must be seconds from the cool-down ({breaker_cooldown:g}) to 86400, got {breaker_cooldown_max}")


# What each numeric variable accepts, for messages about values that are not numbers at all.
_ALLOWED = {"LEXGRAPH_CHUNK_TOKENS": lambda env: f"from {MIN_CHUNK_TOKENS} to {_input_limit(_model(env), 254)}",
            "LEXGRAPH_KNN_K": lambda env: f"from {MIN_KNN_K} to {MAX_KNN_K}",
            "LEXGRAPH_BETA": lambda env: "from 0 to 1",
            "LEXGRAPH_LANCE_THRESHOLD": lambda env: f"from {MIN_LANCE_THRESHOLD} on (chunks)",
            "LEXGRAPH_SERVE_TORCH_THREADS": lambda env: "from 1 to 256"}


def _model(environ: Mapping[str, str]) -> str:
    return environ.get("LEXGRAPH_EMBED_MODEL", "").strip() or DEFAULT_EMBED_MODEL


def _input_limit(model: str, fallback: int | None = None) -> int:
    try:
        return model_input_limit(model)
    except (ValueError, OSError) as error:
        if fallback is not None:
            return fallback
        raise SettingsError(f"LEXGRAPH_EMBED_MODEL must be {DEFAULT_EMBED_MODEL} (bundled) or a local folder holding "
                            f"a sentence-transformers model: {error}") from None


def _check_folder(variable: str, path: Path) -> None:
    """The folder need not exist yet, but neither it nor any parent may be a file."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "it is a file" if candidate == path else f"{candidate} is a file"
                raise SettingsError(f"{variable}={path} must be a folder for the index, but {where}")
            return


def _parse(f: Field, variable: str, raw: str, environ: Mapping[str, str]) -> Any:
    """A variable's text as its field's value; a number that is not one names the variable and what it accepts."""
    try:
        return f.metadata["parse"](raw)
    except _NotANumber as error:
        allowed = _ALLOWED[variable](environ) if variable in _ALLOWED else ""
        raise SettingsError(f"{variable} must be {error.args[0]}{' ' + allowed if allowed else ''}, "
                            f"got {raw!r}") from None


def _format(value: Any) -> str:
    """A value as its variable's text (to_env): lists comma-separated, numbers as Python writes them."""
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return repr(value) if isinstance(value, float) else str(value)
