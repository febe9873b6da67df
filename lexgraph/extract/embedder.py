"""Sentence-transformers embedder, loaded offline, that refuses to truncate silently.

Three backends give the same model's vectors: "torch" (sentence-transformers as shipped), "onnx" (the
same weights exported to ONNX once, run by onnxruntime: equal vectors, faster) and "onnx-int8" (that
export int8 dynamically quantised: fastest, but vectors move by about 0.01 in cosine, also with their
batch-mates; see lexgraph.extract.onnx_export and docs/BENCHMARKS.md). The backend is part of the index
version (Settings.index_version), so an index is always queried with the backend that built it.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from lexgraph import progress as report
# The model's defaults and its files are below the settings, which check them; named here for the embedder's callers.
from lexgraph.defaults import DEFAULT_EMBED_BACKEND as DEFAULT_BACKEND, DEFAULT_EMBED_MODEL as DEFAULT_MODEL
from lexgraph.defaults import EMBED_BACKENDS, ONNX, ONNX_INT8, TORCH  # noqa: F401
from lexgraph.embedding_model import ModelFilesError, model_input_limit, resolve_model_path  # noqa: F401

# Word pieces shared by neighbouring windows when a long query is embedded in windows and pooled.
QUERY_WINDOW_OVERLAP = 32
_CACHE: dict[tuple[str, str, str], "Embedder"] = {}
_CACHE_LOCK = threading.Lock()
# Inside reusing_recent_vectors(), the vectors of the texts embedded last in it, kept up to this size: a
# document's statements are, with the LLM-free extractor, its keyword sentences again, embedded minutes earlier in
# the same ingest (100 of 100 for a synthetic 20-chunk document, 1.2 s of its add at 100k chunks).
RECENT_VECTOR_BYTES = 64 << 20
# Padded word pieces per model call (batch rows x its longest text); see Embedder._batches.
BATCH_TOKEN_BUDGET = 2048

_reuse_scope: object | None = None  # the open reusing_recent_vectors() block, None outside one
_reuse_depth = 0


@contextmanager
def reusing_recent_vectors() -> Iterator[None]:
    """Within this block, an embedder does not embed again a text it embedded earlier in the block; its end
    drops those vectors. Scoped (one ingest opens it around its runs) so that what a step reports as embedded
    depends on that ingest alone, never on what the process did before."""
    global _reuse_scope, _reuse_depth
    with _CACHE_LOCK:
        _reuse_depth += 1
        if _reuse_depth == 1:
            _reuse_scope = object()
    try:
        yield
    finally:
        with _CACHE_LOCK:
            _reuse_depth -= 1
            if not _reuse_depth:
                _reuse_scope = None
                for embedder in _CACHE.values():
                    embedder.recent.clear()


class InputTooLongError(ValueError):
    """A text longer than the model's input limit: it would be truncated, so it is refused."""


def load_tokenizers(model_path: str | Path, max_seq_length: int):
    """The model's fast tokenizer read from its tokenizer.json with the tokenizers package alone (no
    transformers): (counting, feeding) copies, see configure_tokenizers. None when the folder has no
    tokenizer.json (the transformers tokenizer then builds one from the model's vocabulary)."""
    path = Path(model_path) / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    try:
        text = path.read_text(encoding="utf-8")
        counting, feeding = Tokenizer.from_str(text), Tokenizer.from_str(text)
    except Exception as error:  # the tokenizers package raises a bare Exception on a bad file
        raise ModelFilesError(f"{path}: unreadable tokenizer ({error})") from error
    return configure_tokenizers(counting, feeding, max_seq_length, _pad_token(Path(model_path), feeding), path)


def _pad_token(folder: Path, tokenizer) -> str:
    """The padding token as transformers picks it: tokenizer_config.json, special_tokens_map.json, then the
    tokenizer's own padding setting."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.exists():
            try:
                token = json.loads(path.read_text()).get("pad_token")
            except (OSError, ValueError, AttributeError) as error:
                raise ModelFilesError(f"{path}: unreadable tokenizer configuration ({error})") from error
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                return token
    return (tokenizer.padding or {}).get("pad_token") or "[PAD]"


def configure_tokenizers(counting, feeding, max_seq_length: int, pad_token: str, source):
    """Two copies of one tokenizer, configured explicitly (the file's own truncation and padding, 128 for
    all-MiniLM-L6-v2, are never used): counting truncates and pads nothing; feeding truncates at
    max_seq_length and pads to the batch's longest text, as the transformers tokenizer does when called
    with padding=True, truncation=True, max_length=max_seq_length."""
    pad_id = feeding.token_to_id(pad_token)
    if pad_id is None:
        raise ModelFilesError(f"{source}: the padding token {pad_token!r} is not in the tokenizer's vocabulary")
    counting.no_truncation()
    counting.no_padding()
    feeding.enable_truncation(max_length=max_seq_length, stride=0, strategy="longest_first", direction="right")
    feeding.enable_padding(direction="right", pad_id=pad_id, pad_type_id=0, pad_token=pad_token)
    return counting, feeding


@dataclass
class EmbeddingStats:
    texts: int = 0
    unique_texts: int = 0
    tokens: int = 0  # word pieces the model ran on (texts reused from RecentVectors are not counted again)
    reused_texts: int = 0


class RecentVectors:
    """The last texts' vectors, least recently used dropped first, up to max_bytes; thread-safe."""

    def __init__(self, max_bytes: int, dimension: int):
        self.capacity = max(0, max_bytes // max(1, dimension * 4))
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.scope: object | None = None  # the reusing_recent_vectors() block the vectors were kept in

    def clear(self, scope: object | None = None) -> None:
        with self._lock:
            self._vectors.clear()
            self.scope = scope

    def found(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            hits = {t: self._vectors[t] for t in texts if t in self._vectors}
            for text in hits:
                self._vectors.move_to_end(text)
        return hits

    def keep(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        if not self.capacity:
            return
        with self._lock:
            for text, vector in zip(texts[-self.capacity:], vectors[-self.capacity:]):
                self._vectors[text] = vector
                self._vectors.move_to_end(text)
            while len(self._vectors) > self.capacity:
                self._vectors.popitem(last=False)


class Embedder:
    """One loaded model: token counting for the chunker, batched normalised embeddings.

    With an onnx backend and a valid cached export, only the tokenizer (the tokenizers package) and the
    onnxruntime session are loaded: no torch, transformers or sentence-transformers, which take most of a
    fresh process's start. The sentence-transformers model (self.model) is loaded on first use: at once for
    the torch backend or to export a missing or damaged cache entry, else only if a caller asks for it."""

    def __init__(self, model_name: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64,
                 backend: str = DEFAULT_BACKEND, onnx_cache: str | Path | None = None):
        backend = backend or DEFAULT_BACKEND
        if backend not in EMBED_BACKENDS:
            raise ValueError(f"embedding backend must be one of {', '.join(EMBED_BACKENDS)}, got {backend!r}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

        self.model_name = model_name
        self.backend = backend
        self.batch_size = batch_size
        self.device = device
        self.model_path = resolve_model_path(model_name)
        self._model = None
        self._model_lock = threading.Lock()
        # The real limit comes from the model's own configuration, never from the tokenizer (whose
        # model_max_length sentence-transformers also uses as max_seq_length, i.e. as the truncation point).
        self.max_tokens = model_input_limit(model_name)
        # [CLS] and [SEP] take two of the model's positions; the model itself never sees more than this.
        self.max_seq_length = self.max_tokens + 2
        self.stats = EmbeddingStats()
        # Read first: a damaged tokenizer.json is reported as such, before anything else reads the folder.
        tokenizers = load_tokenizers(self.model_path, self.max_seq_length)
        self.session = None
        if backend in (ONNX, ONNX_INT8):
            from lexgraph.extract.onnx_export import cached_session, load_session

            quantised = backend == ONNX_INT8
            self.session = cached_session(self.model_path, quantised, onnx_cache)
            if self.session is None:  # no valid export yet: the model is loaded to export it
                self.session = load_session(self.model, self.model_path, quantised, onnx_cache)
        else:
            self.load_model()  # the torch backend embeds with it: loaded now, as before
        if tokenizers is None:
            from tokenizers import Tokenizer

            # A folder without tokenizer.json: the tokenizer transformers built from it, copied twice.
            text = self.model.tokenizer.backend_tokenizer.to_str()
            copies = Tokenizer.from_str(text), Tokenizer.from_str(text)
            tokenizers = configure_tokenizers(*copies, self.max_seq_length, self.model.tokenizer.pad_token,
                                              self.model_path)
        # Both are tokenizers.Tokenizer objects configured once and never changed, so threads can share them.
        # self.tokenizer counts (and gives offsets) with nothing truncated: counting long texts is deliberate.
        self.tokenizer, self._feeding_tokenizer = tokenizers
        self.dimension = self._dimension()
        self.recent = RecentVectors(RECENT_VECTOR_BYTES, self.dimension)

    @property
    def model(self):
        """The sentence-transformers model, loaded on first use (torch and transformers are imported then)."""
        return self.load_model()

    def load_model(self):
        if self._model is None:
            with self._model_lock:
                if self._model is None:
                    from sentence_transformers import SentenceTransformer
                    from transformers.utils import logging as transformers_logging

                    transformers_logging.disable_progress_bar()
                    model = SentenceTransformer(self.model_path, device=self.device)
                    model.max_seq_length = self.max_seq_length
                    self._model = model
        return self._model

    def _dimension(self) -> int:
        if self.session is not None:
            size = self.session.get_outputs()[0].shape[-1]
            if isinstance(size, int):
                return size
            return int(self._encode_batch(["dimension"]).shape[1])
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(dimension())

    @classmethod
    def shared(cls, model_name: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64,
               backend: str = DEFAULT_BACKEND) -> "Embedder":
        """One model per process and settings: runs in the same process never load it twice. The backend is the
        settings' (Settings.embed_backend), which callers hand in; without one, the default."""
        backend = backend or DEFAULT_BACKEND
        with _CACHE_LOCK:
            key = (model_name, device, backend)
            if key not in _CACHE:
                _CACHE[key] = cls(model_name, device, batch_size, backend)
            embedder = _CACHE[key]
            embedder.batch_size = batch_size
            return embedder

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word pieces of each text; a text repeated in the batch is tokenised once."""
        if not texts:
            return []
        distinct = list(dict.fromkeys(texts))
        encodings = self.tokenizer.encode_batch(distinct, add_special_tokens=False)
        counts = {text: len(encoding.ids) for text, encoding in zip(distinct, encodings)}
        return [counts[text] for text in texts]

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word piece, for cutting over-long text at token boundaries."""
        return [tuple(span) for span in self.tokenizer.encode(text, add_special_tokens=False).offsets]

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None,
              long: str = "refuse") -> np.ndarray:
        """L2-normalised float32 vectors; identical texts are embedded once, and inside
        reusing_recent_vectors() a text embedded earlier in that block is not embedded again.

        long="refuse" (chunks, sentences): a text over the model's input limit raises InputTooLongError,
        since the model would truncate it. long="pool" (queries only): such a text is embedded as
        overlapping windows of at most max_tokens word pieces whose vectors are averaged and normalised."""
        if long not in ("refuse", "pool"):
            raise ValueError(f"long must be 'refuse' or 'pool', got {long!r}")
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        every = list(dict.fromkeys(texts))
        scope = _reuse_scope
        if scope is not None and self.recent.scope is not scope:  # kept in an earlier block: not this one's
            self.recent.clear(scope)
        reused = self.recent.found(every) if scope is not None else {}
        unique = [t for t in every if t not in reused]  # each within the limit: only such texts are kept
        if progress and reused:
            progress(len(reused))
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
        within = [i for i, n in enumerate(lengths) if n <= self.max_tokens]  # a pooled vector is not the text's own
        if scope is not None:
            self.recent.keep([unique[i] for i in within], vectors[within])
        self.stats.texts += len(texts)
        self.stats.unique_texts += len(every)
        self.stats.reused_texts += len(reused)
        self.stats.tokens += tokens
        if reused:
            vectors = np.concatenate([vectors, np.stack(list(reused.values()))])
            unique = unique + list(reused)
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
        for rows in self._batches(order, lengths):
            vectors[rows] = self._encode_batch([texts[i] for i in rows])
            if progress:
                progress(len(rows))
        return vectors

    def _batches(self, order: np.ndarray, lengths: list[int]) -> Iterator[np.ndarray]:
        """At most batch_size texts a call, and at most BATCH_TOKEN_BUDGET padded word pieces: on 2 CPU cores
        chunk-length texts took 0.56-0.96x the time in calls of ~2,048 padded pieces that they took 64 a call
        (docs/decisions/embedder.md); short texts (keyword sentences) still go 64 a call."""
        start = 0
        while start < len(order):
            padded = lengths[order[start]] + 2  # the longest left, with [CLS] and [SEP]
            size = max(1, min(self.batch_size, BATCH_TOKEN_BUDGET // padded))
            yield order[start : start + size]
            start += size

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        if self.session is None:
            return self.model.encode(batch, batch_size=len(batch), normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        from lexgraph.extract.onnx_export import run_session

        return run_session(self.session, self.features(batch))

    def features(self, batch: list[str]) -> dict[str, np.ndarray]:
        """The model's inputs for a batch, as the transformers tokenizer gives them with padding=True,
        truncation=True, max_length=max_seq_length, return_tensors="np"."""
        encodings = self._feeding_tokenizer.encode_batch(batch)
        return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}

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
