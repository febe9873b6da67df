"""Where an index lives and which settings define its version."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lexgraph.embedder import DEFAULT_MODEL
from lexgraph.ids import short_hash

# Bump when chunking output changes for the same input, so a new index version is built.
CHUNKER_VERSION = "1"
DEFAULT_CHUNK_TOKENS = 200


@dataclass(frozen=True)
class Settings:
    """Everything that locates an index. Stores of different versions never share files."""

    home: Path = field(default_factory=lambda: Path(os.environ.get("LEXGRAPH_HOME", ".lexgraph")))
    collection: str = field(default_factory=lambda: os.environ.get("LEXGRAPH_COLLECTION", "default"))
    embed_model: str = field(default_factory=lambda: os.environ.get("LEXGRAPH_EMBED_MODEL", DEFAULT_MODEL))
    chunk_tokens: int = field(default_factory=lambda: int(os.environ.get("LEXGRAPH_CHUNK_TOKENS", DEFAULT_CHUNK_TOKENS)))

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
