"""The extraction cache: one JSON file per (chunk content, model, prompt version), kept with the index.

Layout: ``<root>/<model-slug>/<prompt_version>/<content_hash>.json``. The model slug is readable
and carries a short hash of the exact model id, so two ids that slug alike stay apart. A file is
written to a temporary name and renamed into place, so a reader sees a whole entry or none; an
entry that cannot be read or does not match its key (a torn copy, a hand edit) is a miss, with a
warning, and is overwritten by the next ``put``.

A model or prompt change gives a new key, so old entries are simply not found: nothing is
invalidated in place, and switching back finds the old entries again.

Only an LLM's own validated answer is stored: the extraction stage never puts a fallback (the offline
extraction a chunk keeps when its call failed, or was refused by the open circuit breaker) under the
LLM's key, so such a chunk is a miss and is sent again by the next run, while every chunk that
succeeded stays a hit and is never paid for twice. An entry is written right after its call (and
its cost-ledger row), so a run killed afterwards still finds it.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

from pydantic import ValidationError

from lexgraph.atomic_json import write_json
from lexgraph.extract.schemas import ChunkExtraction
from lexgraph.ids import content_hash, short_hash

FORMAT = 1
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_HEX = re.compile(r"[0-9a-f]{16,64}")
_VERSION = re.compile(r"[A-Za-z0-9._-]{1,64}")


class CacheWarning(UserWarning):
    """A cache entry that could not be used; it counts as a miss."""


class CacheKey(NamedTuple):
    content_hash: str
    model: str
    prompt_version: str


def key_for(text: str, model: str, prompt_version: str) -> CacheKey:
    """The key of ``text`` (what is extracted from: the chunk text, with its heading path if the prompt
    carries it) under a model id and a prompt version."""
    if not model:
        raise ValueError("an extraction cache key needs a model id")
    if not _VERSION.fullmatch(prompt_version or ""):
        raise ValueError(f"prompt version must be 1-64 characters of [A-Za-z0-9._-], got {prompt_version!r}")
    return CacheKey(content_hash(text), model, prompt_version)


def model_slug(model: str) -> str:
    readable = _UNSAFE.sub("-", model.lower()).strip("-.")[:48] or "model"
    return f"{readable}-{short_hash(model, 8)}"


class ExtractionCache:
    """Cached extractions under ``root`` (usually a folder of the index)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: CacheKey) -> Path:
        if not _HEX.fullmatch(key.content_hash):
            raise ValueError(f"content hash must be hex, got {key.content_hash!r}")
        if not _VERSION.fullmatch(key.prompt_version):
            raise ValueError(f"bad prompt version {key.prompt_version!r}")
        return self.root / model_slug(key.model) / key.prompt_version / f"{key.content_hash}.json"

    def get(self, key: CacheKey) -> ChunkExtraction | None:
        entry = self.entry(key)
        return None if entry is None else entry[0]

    def entry(self, key: CacheKey) -> tuple[ChunkExtraction, dict[str, Any]] | None:
        """The cached extraction and the metadata stored with it, or None on a miss."""
        path = self.path(key)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            warnings.warn(f"extraction cache: unreadable entry {path} ({error}); treated as a miss",
                          CacheWarning, stacklevel=3)
            return None
        stored = payload.get("key") if isinstance(payload, dict) else None
        if stored != list(key):
            warnings.warn(f"extraction cache: entry {path} is for key {stored!r}, not {list(key)!r}; "
                          "treated as a miss", CacheWarning, stacklevel=3)
            return None
        try:
            # Stored answers were validated when written; re-validate without re-mapping entity types.
            extraction = ChunkExtraction.model_validate(payload["extraction"],
                                                        context={"entity_types": payload.get("entity_types")})
        except (KeyError, ValidationError) as error:
            warnings.warn(f"extraction cache: entry {path} does not validate ({error}); treated as a miss",
                          CacheWarning, stacklevel=3)
            return None
        return extraction, dict(payload.get("meta") or {})

    def put(self, key: CacheKey, extraction: ChunkExtraction, meta: Mapping[str, Any] | None = None) -> Path:
        """Store ``extraction`` under ``key`` atomically (the last writer wins; both wrote the same answer's key)."""
        path = self.path(key)
        types = sorted({entity.type for entity in extraction.entities})
        payload = {"format": FORMAT, "key": list(key), "entity_types": types or None,
                   "extraction": extraction.model_dump(mode="json"), "meta": dict(meta or {})}
        write_json(path, payload, ensure_ascii=False, sort_keys=True)
        return path

    def __contains__(self, key: CacheKey) -> bool:
        return self.path(key).is_file()

    def items(self) -> Iterator[tuple[CacheKey, dict[str, Any]]]:
        """Every readable entry's key and metadata (for audits and tests: what has been paid for)."""
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob("*/*/*.json")):
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
                key = CacheKey(*payload["key"])
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
                continue
            yield key, dict(payload.get("meta") or {})
