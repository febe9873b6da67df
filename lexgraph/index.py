"""The index facade: one object per Settings that the CLI, the Dagster resources and the bench
use to reach an index's stores, its model and its query side."""
from __future__ import annotations

from contextlib import contextmanager
from functools import cached_property
from typing import Iterator

from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore


class LexIndex:
    def __init__(self, settings: Settings):
        self.settings = settings

    @cached_property
    def extract_store(self) -> ExtractStore:
        return ExtractStore(self.settings.extract_dir)

    @cached_property
    def vectors(self) -> VectorStore:
        return VectorStore(self.settings.lance_uri)

    @cached_property
    def corpus_files(self) -> CorpusFiles:
        return CorpusFiles(self.settings.index_dir)

    @cached_property
    def ledger(self):
        """The cost ledger: a row per model call (embedding and LLM), kept with the index."""
        from lexgraph.ledger import CostLedger

        return CostLedger(self.settings.ledger_dir)

    @cached_property
    def extraction_cache(self):
        """LLM extractions by (chunk content hash, model, prompt version), kept with the index."""
        from lexgraph.extract.extraction_cache import ExtractionCache

        return ExtractionCache(self.settings.extraction_cache_dir)

    def llm_extractor(self):
        """The `openai` extractor when an endpoint is configured, else None (the offline NLP extraction only)."""
        from lexgraph.indexing.lexical_extraction import llm_extractor

        return llm_extractor(self.settings)

    def offline_extractor(self):
        from lexgraph.indexing.lexical_extraction import offline_extractor

        return offline_extractor(self.settings)

    def embedder(self):
        from lexgraph.extract.embedder import Embedder

        return Embedder.shared(self.settings.embed_model, backend=self.settings.embed_backend)

    @contextmanager
    def graph_writer(self) -> Iterator[GraphStore]:
        with GraphStore.writer(self.settings.graph_path) as graph:
            yield graph

    @contextmanager
    def graph_reader(self) -> Iterator[GraphStore]:
        graph = GraphStore(self.settings.graph_path)
        try:
            yield graph
        finally:
            graph.close()

    def index_loader(self):
        """How queries read this index (retrieval.index_loader): (load function, True when it queries LanceDB's
        search indexes); retrieval.EmptyIndexError when there is nothing to query."""
        from lexgraph.query.retrieval import index_loader

        return index_loader(self.settings, self.vectors)

    def retriever(self, params=None):
        """A retriever over this index: loaded into memory, or querying LanceDB's search indexes."""
        from lexgraph.query.retrieval import Retriever

        load, _ = self.index_loader()
        embedder = self.embedder()
        # Queries over the model's input limit are windowed and pooled (chunks never are: they are refused).
        return Retriever(load(self.settings, params), embedder.embed_query, params, embedder.embed_queries)

    def search(self, text: str, k: int = 5, method: str = "hybrid"):
        """Top-k chunks for a query by one retrieval method (hybrid by default)."""
        if not text.strip():
            raise ValueError("the query is empty")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        return self.retriever().search(method, text, k)
