"""Dagster resources: thin, configurable wrappers around lexgraph's clients."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import dagster as dg

from lexgraph.corpus_index import DEFAULT_BETA, CorpusFiles
from lexgraph.embedder import DEFAULT_MODEL, Embedder
from lexgraph.extract_store import ExtractStore
from lexgraph.graph_store import GraphStore
from lexgraph.ids import document_id
from lexgraph.knn import DEFAULT_K
from lexgraph.settings import DEFAULT_CHUNK_TOKENS, Settings
from lexgraph.sources import iter_corpus_files
from lexgraph.vector_store import VectorStore


class IndexResource(dg.ConfigurableResource):
    """Where the index lives; the chunking settings and embedder name fix its version."""

    home: str = os.environ.get("LEXGRAPH_HOME", ".lexgraph")
    collection: str = "default"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    embed_model: str = DEFAULT_MODEL
    knn_k: int = int(os.environ.get("LEXGRAPH_KNN_K", DEFAULT_K))
    knn_mode: str = os.environ.get("LEXGRAPH_KNN_MODE", "auto")
    beta: float = float(os.environ.get("LEXGRAPH_BETA", DEFAULT_BETA))

    def settings(self) -> Settings:
        return Settings(home=Path(self.home), collection=self.collection, embed_model=self.embed_model,
                        chunk_tokens=self.chunk_tokens)

    def extract_store(self) -> ExtractStore:
        return ExtractStore(self.settings().extract_dir)

    def corpus_files(self) -> CorpusFiles:
        return CorpusFiles(self.settings().index_dir)


class EmbedderResource(dg.ConfigurableResource):
    """Sentence-transformers model, loaded once per process and shared by every asset in a run."""

    model_name: str = DEFAULT_MODEL
    device: str = "cpu"
    batch_size: int = 64

    def get(self) -> Embedder:
        return Embedder.shared(self.model_name, self.device, self.batch_size)


class LanceDBResource(dg.ConfigurableResource):
    """LanceDB vectors; empty uri means the index version's own folder."""

    index: IndexResource
    uri: str = ""

    def get(self) -> VectorStore:
        return VectorStore(self.uri or self.index.settings().lance_uri)


class KuzuResource(dg.ConfigurableResource):
    """Embedded Kùzu graph; writer() holds the cross-process single-writer lock."""

    index: IndexResource
    path: str = ""

    def graph_path(self) -> str:
        return self.path or self.index.settings().graph_path

    @contextmanager
    def writer(self) -> Iterator[GraphStore]:
        with GraphStore.writer(self.graph_path()) as graph:
            yield graph


class InboxResource(dg.ConfigurableResource):
    """The folder the sensor watches; files map to partition keys by their path inside it."""

    path: str = os.environ.get("LEXGRAPH_INBOX", "sample/corpus")

    def root(self) -> Path:
        return Path(self.path)

    def files(self) -> dict[str, Path]:
        root = self.root()
        if not root.exists():
            return {}
        return {document_id(p.relative_to(root).as_posix()): p for p in iter_corpus_files(root)}
