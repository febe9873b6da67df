"""Dagster resources: thin, configurable wrappers around lexgraph's clients.

They all carry one lexgraph Settings (IndexResource), which orchestration.definitions builds once, from the
environment or as handed in, so the CLI, the sensor and `make dev` always agree on the index they use, and a
Settings handed to an ingest is the one its runs use, its API key included.
"""
# No `from __future__ import annotations`: Dagster reads the fields' annotations (a resource dependency) as types.
import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Mapping, Optional

import dagster as dg
from pydantic import PrivateAttr

from lexgraph.indexing import lexical_extraction
from lexgraph.indexing.corpus_state import CorpusFiles
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


class HandedSecret:
    """A secret handed in with a Settings object that no environment variable holds (an ingest's own API key), kept
    in memory as a resource dependency: never a config value, so never in the UI, a run's config or a snapshot."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "HandedSecret(***)"


class IndexResource(dg.ConfigurableResource):
    """The one lexgraph Settings, handed down to every asset, sensor and resource: where the index lives, how it is
    built, the LLM endpoint and the client's patience. Build with from_settings; read with settings().

    `variables` holds the settings' non-secret values as the LEXGRAPH_* variables that give them (Settings.to_env),
    so the UI shows them and a run's resource config can change them; nothing else comes from the environment.
    The LLM API key comes through dg.EnvVar (LEXGRAPH_LLM_API_KEY or OPENAI_API_KEY), as Dagster's own projects
    take their secrets; a key handed in with a Settings object that no variable holds travels in memory
    (`handed_api_key`). Neither is ever a plain value in the resource's config. `lexgraph serve`'s token is not a
    Dagster concern and is left out."""

    variables: dict[str, str]
    llm_api_key: str = ""
    handed_api_key: dg.ResourceDependency[Optional[HandedSecret]] = None
    _settings: Optional[Settings] = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> "IndexResource":
        """The resource carrying these settings; its key as the dg.EnvVar of the variable that holds it (in
        `environ`, default the process's), else handed in memory."""
        environ = os.environ if environ is None else environ
        key = settings.llm_api_key
        variable = next((name for name in (Settings.ENV["llm_api_key"], Settings.FALLBACK_ENV["llm_api_key"])
                         if key and environ.get(name, "").strip() == key), None)
        handed = {"handed_api_key": HandedSecret(key)} if key and not variable else {}
        resource = cls(variables=settings.to_env(), llm_api_key=dg.EnvVar(variable) if variable else "", **handed)
        if resource.settings() != replace(settings, serve_token=""):
            raise ValueError("these settings do not survive their variables (Settings.to_env): a value their "
                             "variable cannot give, such as an entity type in capitals")
        return resource

    def settings(self) -> Settings:
        """The settings, built once per resource instance (Dagster makes one per run) and checked."""
        if self._settings is None:
            key = self.llm_api_key.get_value() if isinstance(self.llm_api_key, dg.EnvVar) else self.llm_api_key
            if not (key or "").strip() and self.handed_api_key is not None:
                key = self.handed_api_key.value
            self._settings = Settings.from_env(self.variables, llm_api_key=(key or "").strip() or None)
        return self._settings

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
        return lexical_extraction.llm_extractor(self.index.settings())

    def offline(self) -> Extractor:
        return lexical_extraction.offline_extractor(self.index.settings())

    def masker(self):
        return lexical_extraction.pii_masker(self.index.settings())


class InboxResource(dg.ConfigurableResource):
    """The folder the sensor watches; files map to partition keys by their path inside it."""

    path: str  # the settings' inbox (orchestration.definitions)

    def root(self) -> Path:
        return Path(self.path)

    def files(self) -> dict[str, Path]:
        root = self.root()
        if not root.exists():
            return {}
        return {document_id(p.relative_to(root).as_posix()): p for p in iter_corpus_files(root)}
