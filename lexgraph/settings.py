"""The one configuration: every documented setting is read here, from the environment, and both
the CLI and the Dagster resources are built from it, so no two commands disagree about the index."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Mapping

from lexgraph.build.knn import DEFAULT_K as DEFAULT_KNN_K
from lexgraph.build.skeleton import DEFAULT_BETA
from lexgraph.extract.embedder import DEFAULT_MODEL, model_input_limit
from lexgraph.ids import short_hash

# Bump when chunking output changes for the same input, so a new index version is built.
CHUNKER_VERSION = "2"
DEFAULT_CHUNK_TOKENS = 200
MIN_CHUNK_TOKENS = 16
KNN_MODES = ("auto", "exact", "approx")


class SettingsError(ValueError):
    """A setting with an invalid value; the message names the variable and what it accepts."""


@dataclass(frozen=True)
class Settings:
    """Everything that locates an index and shapes its build. Use Settings.from_env()."""

    home: Path = Path(".lexgraph")
    collection: str = "default"
    embed_model: str = DEFAULT_MODEL
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    inbox: Path = Path("sample/corpus")
    knn_k: int = DEFAULT_KNN_K
    knn_mode: str = "auto"
    beta: float = DEFAULT_BETA

    # environment variable of each field, as documented in the README
    ENV = {"home": "LEXGRAPH_HOME", "collection": "LEXGRAPH_COLLECTION", "embed_model": "LEXGRAPH_EMBED_MODEL",
           "chunk_tokens": "LEXGRAPH_CHUNK_TOKENS", "inbox": "LEXGRAPH_INBOX", "knn_k": "LEXGRAPH_KNN_K",
           "knn_mode": "LEXGRAPH_KNN_MODE", "beta": "LEXGRAPH_BETA"}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        """Settings from LEXGRAPH_* variables (explicit overrides win), validated."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for f in fields(cls):
            raw = environ.get(cls.ENV[f.name], "").strip()
            if raw:
                values[f.name] = _parse(cls.ENV[f.name], raw, f.default)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for key in ("home", "inbox"):
            if key in values:
                values[key] = Path(values[key])
        settings = cls(**values)
        settings.validate()
        return settings

    def with_(self, **changes) -> "Settings":
        settings = replace(self, **changes)
        settings.validate()
        return settings

    def validate(self) -> None:
        if not self.collection or "/" in self.collection or self.collection in (".", ".."):
            raise SettingsError(f"LEXGRAPH_COLLECTION must be a plain folder name, got {self.collection!r}")
        if self.home.exists() and not self.home.is_dir():
            raise SettingsError(f"LEXGRAPH_HOME={self.home} is not a folder (it is a file); "
                                "point it at a folder for the index")
        try:
            limit = model_input_limit(self.embed_model)
        except ValueError as error:
            raise SettingsError(f"LEXGRAPH_EMBED_MODEL: {error}") from None
        if not MIN_CHUNK_TOKENS <= self.chunk_tokens <= limit:
            raise SettingsError(f"LEXGRAPH_CHUNK_TOKENS must be between {MIN_CHUNK_TOKENS} and {limit} (the input "
                                f"limit of {self.embed_model} in word pieces), got {self.chunk_tokens}")
        if not 1 <= self.knn_k <= 200:
            raise SettingsError(f"LEXGRAPH_KNN_K must be between 1 and 200, got {self.knn_k}")
        if self.knn_mode not in KNN_MODES:
            raise SettingsError(f"LEXGRAPH_KNN_MODE must be one of {', '.join(KNN_MODES)}, got {self.knn_mode!r}")
        if not 0.0 <= self.beta <= 1.0:
            raise SettingsError(f"LEXGRAPH_BETA must be a number between 0 and 1, got {self.beta}")

    @property
    def index_version(self) -> str:
        return "v" + short_hash(f"{CHUNKER_VERSION}|{self.embed_model}|{self.chunk_tokens}", 8)

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


def _parse(variable: str, raw: str, default):
    """Parse a variable to its field's type; a bad value names the variable."""
    kind = type(default)
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise SettingsError(f"{variable} must be a {'whole number' if kind is int else 'number'}, got {raw!r}") from None
    return raw
