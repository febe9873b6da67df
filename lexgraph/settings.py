"""The one configuration: every documented setting is read here, from the environment, and both
the CLI and the Dagster resources are built from it, so no two commands disagree about the index."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

from lexgraph.indexing.knn import DEFAULT_K as DEFAULT_KNN_K
from lexgraph.indexing.skeleton import DEFAULT_BETA
from lexgraph.extract.embedder import DEFAULT_BACKEND, DEFAULT_MODEL, EMBED_BACKENDS, TORCH, model_input_limit
from lexgraph.extract.schemas import DEFAULT_ENTITY_TYPES
from lexgraph.ids import short_hash

# Bump when chunking output changes for the same input, so a new index version is built.
CHUNKER_VERSION = "3"
DEFAULT_CHUNK_TOKENS = 200
MIN_CHUNK_TOKENS = 16
KNN_MODES = ("auto", "exact", "approx")
MIN_KNN_K, MAX_KNN_K = 1, 200
PII_MASKING = ("off", "on")
# The query side: `memory` loads every chunk vector, BM25 and keyword link into the process (fastest on
# small corpora), `lance` queries LanceDB's ANN and full-text indexes, `auto` picks lance from
# LEXGRAPH_LANCE_THRESHOLD chunks on (the ingestion's search_indexes asset builds those indexes from there).
QUERY_BACKENDS = ("auto", "memory", "lance")
DEFAULT_LANCE_THRESHOLD = 20_000
MIN_LANCE_THRESHOLD = 1
# The chat model asked when an endpoint is configured without LEXGRAPH_LLM_MODEL.
DEFAULT_LLM_MODEL = "gpt-4o-mini"


class SettingsError(ValueError):
    """A setting with an invalid value; the message names the variable and what it accepts."""


@dataclass(frozen=True)
class Settings:
    """Everything that locates an index and shapes its build. Use Settings.from_env()."""

    home: Path = Path(".lexgraph")
    collection: str = "default"
    embed_model: str = DEFAULT_MODEL
    # torch, onnx or onnx-int8 (lexgraph.extract.embedder): part of the index version, vectors never mix
    embed_backend: str = DEFAULT_BACKEND
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    inbox: Path = Path("sample/corpus")
    knn_k: int = DEFAULT_KNN_K
    knn_mode: str = "auto"
    beta: float = DEFAULT_BETA
    # The LLM extractor: an OpenAI-compatible endpoint; none means the offline NLP extractor (spaCy).
    llm_base_url: str = ""
    llm_model: str = DEFAULT_LLM_MODEL
    # Never shown: not in repr, never in metadata, never in a Dagster resource's config.
    llm_api_key: str = field(default="", repr=False)
    pii_masking: str = "off"
    entity_types: tuple[str, ...] = tuple(DEFAULT_ENTITY_TYPES)
    # The query router's own labelled questions (JSON lists of {question, route}), beside the shipped ones.
    router_exemplars: tuple[Path, ...] = ()
    query_backend: str = "auto"
    lance_threshold: int = DEFAULT_LANCE_THRESHOLD

    # environment variable of each field, as documented in the README
    ENV = {"home": "LEXGRAPH_HOME", "collection": "LEXGRAPH_COLLECTION", "embed_model": "LEXGRAPH_EMBED_MODEL",
           "embed_backend": "LEXGRAPH_EMBED_BACKEND",
           "chunk_tokens": "LEXGRAPH_CHUNK_TOKENS", "inbox": "LEXGRAPH_INBOX", "knn_k": "LEXGRAPH_KNN_K",
           "knn_mode": "LEXGRAPH_KNN_MODE", "beta": "LEXGRAPH_BETA", "llm_base_url": "LEXGRAPH_LLM_BASE_URL",
           "llm_model": "LEXGRAPH_LLM_MODEL", "llm_api_key": "LEXGRAPH_LLM_API_KEY",
           "pii_masking": "LEXGRAPH_PII_MASKING", "entity_types": "LEXGRAPH_ENTITY_TYPES",
           "router_exemplars": "LEXGRAPH_ROUTER_EXEMPLARS", "query_backend": "LEXGRAPH_QUERY_BACKEND",
           "lance_threshold": "LEXGRAPH_LANCE_THRESHOLD"}
    # read when the LEXGRAPH_ variable is unset or empty
    FALLBACK_ENV = {"llm_base_url": "OPENAI_BASE_URL", "llm_api_key": "OPENAI_API_KEY"}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        """Settings from LEXGRAPH_* variables (explicit overrides win), validated."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for f in fields(cls):
            variable = cls.ENV[f.name]
            raw = environ.get(variable, "").strip()
            if not raw and f.name in cls.FALLBACK_ENV:
                variable = cls.FALLBACK_ENV[f.name]
                raw = environ.get(variable, "").strip()
            if raw:
                values[f.name] = _parse(variable, raw, f.default, environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for key in ("home", "inbox"):
            if key in values:
                values[key] = Path(values[key])
        if isinstance(values.get("entity_types"), str):
            values["entity_types"] = _parse("LEXGRAPH_ENTITY_TYPES", values["entity_types"], (), environ)
        settings = cls(**values)
        settings.validate()
        return settings

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

    @property
    def index_version(self) -> str:
        # torch adds nothing, so indexes built before the backend was a setting keep their version
        backend = "" if self.embed_backend == TORCH else f"|{self.embed_backend}"
        return "v" + short_hash(f"{CHUNKER_VERSION}|{self.embed_model}|{self.chunk_tokens}{backend}", 8)

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
        return str(self.index_dir / "graph.kuzu")

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


# What each numeric variable accepts, for messages about values that are not numbers at all.
_ALLOWED = {"LEXGRAPH_CHUNK_TOKENS": lambda env: f"from {MIN_CHUNK_TOKENS} to {_input_limit(_model(env), 254)}",
            "LEXGRAPH_KNN_K": lambda env: f"from {MIN_KNN_K} to {MAX_KNN_K}",
            "LEXGRAPH_BETA": lambda env: "from 0 to 1",
            "LEXGRAPH_LANCE_THRESHOLD": lambda env: f"from {MIN_LANCE_THRESHOLD} on (chunks)"}


# What LEXGRAPH_PII_MASKING accepts besides on and off (as lexgraph.extract.pii reads it).
_SWITCH = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


def _model(environ: Mapping[str, str]) -> str:
    return environ.get("LEXGRAPH_EMBED_MODEL", "").strip() or DEFAULT_MODEL


def _input_limit(model: str, fallback: int | None = None) -> int:
    try:
        return model_input_limit(model)
    except (ValueError, OSError) as error:
        if fallback is not None:
            return fallback
        raise SettingsError(f"LEXGRAPH_EMBED_MODEL must be {DEFAULT_MODEL} (bundled) or a local folder holding a "
                            f"sentence-transformers model: {error}") from None


def _check_folder(variable: str, path: Path) -> None:
    """The folder need not exist yet, but neither it nor any parent may be a file."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "it is a file" if candidate == path else f"{candidate} is a file"
                raise SettingsError(f"{variable}={path} must be a folder for the index, but {where}")
            return


def _parse(variable: str, raw: str, default, environ: Mapping[str, str]):
    """Parse a variable to its field's type; a bad value names the variable and what it accepts."""
    kind = type(default)
    if variable == "LEXGRAPH_QUERY_BACKEND":
        return raw.lower()
    if variable == "LEXGRAPH_PII_MASKING":
        word = raw.lower()
        return _SWITCH.get(word, word)
    if variable == "LEXGRAPH_EMBED_BACKEND":
        return raw.lower()
    if variable == "LEXGRAPH_ENTITY_TYPES":
        return tuple(part.strip().casefold() for part in raw.split(","))
    if variable == "LEXGRAPH_ROUTER_EXEMPLARS":
        return tuple(Path(part.strip()) for part in raw.split(",") if part.strip())
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        allowed = _ALLOWED[variable](environ) if variable in _ALLOWED else ""
        raise SettingsError(f"{variable} must be a {'whole number' if kind is int else 'number'} "
                            f"{allowed}, got {raw!r}".replace("  ", " ")) from None
    return raw
