"""Dagster resources: thin, configurable wrappers around lexgraph's clients.

Every field left empty means "as lexgraph.settings.Settings.from_env() says", and
orchestration.definitions fills them from one Settings object, so the CLI, the sensor and
`make dev` always agree on the index they use.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import dagster as dg

from lexgraph.indexing import lexical
from lexgraph.indexing.corpus_index import CorpusFiles
from lexgraph.extract.extraction_cache import ExtractionCache
from lexgraph.extract.schemas import Extractor
from lexgraph.ledger import CostLedger
from lexgraph.extract.embedder import Embedder
from lexgraph.ids import document_id
from lexgraph.inbox import iter_corpus_files
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore


class IndexResource(dg.ConfigurableResource):
    """Where the index lives and how it is built; empty or unset fields come from the environment."""

    home: str = ""
    collection: str = ""
    chunk_tokens: int = 0
    embed_model: str = ""
    embed_backend: str = ""
    knn_k: int = 0
    knn_mode: str = ""
    beta: float = -1.0
    # The extractor's endpoint and model (not secret). The API key is never a resource field: it would be shown
    # in the UI's resource config; it is read from LEXGRAPH_LLM_API_KEY / OPENAI_API_KEY where the run happens.
    llm_base_url: str = ""
    llm_model: str = ""
    pii_masking: str = ""
    entity_types: str = ""  # comma-separated
    query_backend: str = ""  # decides whether the corpus job builds LanceDB's search indexes
    lance_threshold: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> "IndexResource":
        return cls(home=str(settings.home), collection=settings.collection, chunk_tokens=settings.chunk_tokens,
                   embed_model=settings.embed_model, embed_backend=settings.embed_backend, knn_k=settings.knn_k,
                   knn_mode=settings.knn_mode, beta=settings.beta, llm_base_url=settings.llm_base_url,
                   llm_model=settings.llm_model, pii_masking=settings.pii_masking,
                   entity_types=",".join(settings.entity_types), query_backend=settings.query_backend,
                   lance_threshold=settings.lance_threshold)

    def settings(self) -> Settings:
        return Settings.from_env(
            home=self.home or None, collection=self.collection or None, chunk_tokens=self.chunk_tokens or None,
            embed_model=self.embed_model or None, embed_backend=self.embed_backend or None,
            knn_k=self.knn_k or None, knn_mode=self.knn_mode or None, beta=self.beta if self.beta >= 0 else None,
            llm_base_url=self.llm_base_url or None, llm_model=self.llm_model or None,
            pii_masking=self.pii_masking or None, entity_types=self.entity_types or None,
            query_backend=self.query_backend or None, lance_threshold=self.lance_threshold or None)

    def extract_store(self) -> ExtractStore:
        return ExtractStore(self.settings().extract_dir)

    def corpus_files(self) -> CorpusFiles:
        return CorpusFiles(self.settings().index_dir)

    def ledger(self) -> CostLedger:
        return CostLedger(self.settings().ledger_dir)

    def extraction_cache(self) -> ExtractionCache:
        return ExtractionCache(self.settings().extraction_cache_dir)


class EmbedderResource(dg.ConfigurableResource):
    """Sentence-transformers model, loaded once per process and shared by every asset in a run."""

    index: IndexResource
    device: str = "cpu"
    batch_size: int = 64

    def get(self) -> Embedder:
        settings = self.index.settings()  # the backend too: an index's vectors all come from one backend
        return Embedder.shared(settings.embed_model, self.device, self.batch_size, settings.embed_backend)


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


class ExtractorResource(dg.ConfigurableResource):
    """The lexical graph's extractors: `openai` (instructor over an OpenAI-compatible endpoint) when
    LEXGRAPH_LLM_BASE_URL (or OPENAI_BASE_URL) is set, else none; always the LLM-free spaCy one; and
    the PII masker when LEXGRAPH_PII_MASKING=on. Built from the index's settings."""

    index: IndexResource

    def llm(self) -> Extractor | None:
        return lexical.llm_extractor(self.index.settings())

    def offline(self) -> Extractor:
        return lexical.offline_extractor(self.index.settings())

    def masker(self):
        return lexical.pii_masker(self.index.settings())


class InboxResource(dg.ConfigurableResource):
    """The folder the sensor watches; files map to partition keys by their path inside it."""

    path: str = ""

    def root(self) -> Path:
        return Path(self.path) if self.path else Settings.from_env().inbox

    def files(self) -> dict[str, Path]:
        root = self.root()
        if not root.exists():
            return {}
        return {document_id(p.relative_to(root).as_posix()): p for p in iter_corpus_files(root)}
