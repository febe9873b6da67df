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
MIN_KNN_K, MAX_KNN_K = 1, 200


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
                values[f.name] = _parse(cls.ENV[f.name], raw, f.default, environ)
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
        if (not self.collection or any(c in self.collection for c in '/\\\0')
                or self.collection in (".", "..")):
            raise SettingsError(f"LEXGRAPH_COLLECTION must be a plain folder name (no '/' or '\\', not '.' or "
                                f"'..'), got {self.collection!r}")
        _check_folder("LEXGRAPH_HOME", Path(self.home))
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


# What each numeric variable accepts, for messages about values that are not numbers at all.
_ALLOWED = {"LEXGRAPH_CHUNK_TOKENS": lambda env: f"from {MIN_CHUNK_TOKENS} to {_input_limit(_model(env), 254)}",
            "LEXGRAPH_KNN_K": lambda env: f"from {MIN_KNN_K} to {MAX_KNN_K}",
            "LEXGRAPH_BETA": lambda env: "from 0 to 1"}


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
