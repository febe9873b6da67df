"""The chunk KNN graph's inputs read ahead, on a background thread, while the same process ingests documents.

Why: adding one document to a large index in a fresh process spent seconds of chunk_knn_graph reading what
that document does not change: the saved KNN state, its HNSW file and every other document's vectors. An
ingest that will update the corpus index starts this read before its document runs, so it overlaps the
document's own steps; the corpus step then reads only what changed since.

What was read ahead is used only while it is still true: the saved state only if none of its files was
replaced since (name, size, modification time and inode of every `knn_*` file), a document's vectors only if
the catalog still holds that document with the content hash it had when the read began and the ingest did
not touch it. Anything else is read again, as without a read ahead. Each read ahead is used once.
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from lexgraph.indexing import corpus_state, knn_state

Signature = tuple[tuple[str, int, int, int], ...]
# Documents whose vectors are read by name beside a read ahead; more than this, and all are read again.
MAX_DOCUMENTS_READ = 500


def _signature(files: corpus_state.CorpusFiles) -> Signature:
    """Every KNN file of the corpus state as it stands: every write replaces a file, so any write changes this."""
    found = []
    for path in sorted(files.root.glob("knn_*")):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        found.append((path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(found)


@dataclass
class _ReadAhead:
    catalog: dict[str, str]  # doc_id -> content hash when the read began
    untouched: frozenset[str]  # documents this ingest neither adds, changes nor removes
    signature: Signature = ()
    loaded: tuple[knn_state.SavedKnn | None, str] | None = None
    chunks: pl.DataFrame | None = None
    vectors: np.ndarray | None = None
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)


_reads: dict[Path, _ReadAhead] = {}
_lock = threading.Lock()


def _key(files: corpus_state.CorpusFiles) -> Path:
    return Path(os.path.abspath(files.root))


def start(files: corpus_state.CorpusFiles, store, catalog: dict[str, str], touched: set[str]) -> bool:
    """Read the saved KNN state, its HNSW index and the vectors of the catalog's documents not in `touched`
    on a daemon thread. store: the index's VectorStore; catalog: doc_id -> content hash as indexed now.
    -> whether a read began (not when there is no saved state to read, or one is under way already)."""
    untouched = frozenset(catalog) - set(touched)
    if not untouched or not files.knn_state.exists():
        return False
    ahead = _ReadAhead(dict(catalog), untouched)
    with _lock:
        if _key(files) in _reads:
            return False
        _reads[_key(files)] = ahead

    def read() -> None:
        try:
            ahead.signature = _signature(files)
            saved, reason = knn_state.load_knn(files)
            if saved is not None and saved.settings.get("mode") == "approx":
                try:
                    saved.ann = knn_state.read_ann(files, saved.generation)
                except Exception:  # noqa: BLE001 (the update reads it again and says what is wrong)
                    saved.ann = None
            ahead.loaded = (saved, reason)
            chunks, vectors = store.chunk_vectors()
            if chunks.height:
                keep = chunks["doc_id"].is_in(list(untouched))
                ahead.chunks, ahead.vectors = chunks.filter(keep), vectors[keep.to_numpy()]
        except Exception as error:  # noqa: BLE001 (the step reads everything itself)
            ahead.error = f"{type(error).__name__}: {error}"
        finally:
            ahead.done.set()

    threading.Thread(target=read, name="lexgraph-knn-read-ahead", daemon=True).start()
    return True


@contextlib.contextmanager
def reading_ahead(files: corpus_state.CorpusFiles, store, catalog: dict[str, str], touched: set[str]):
    """start(), and the read ahead dropped when the block ends, used or not."""
    start(files, store, catalog, touched)
    try:
        yield
    finally:
        discard(files)


def discard(files: corpus_state.CorpusFiles) -> None:
    """Drop an unused read ahead (its memory) once the ingest is over."""
    with _lock:
        ahead = _reads.pop(_key(files), None)
    if ahead is not None:
        ahead.done.wait()


def _take(files: corpus_state.CorpusFiles) -> _ReadAhead | None:
    with _lock:
        ahead = _reads.pop(_key(files), None)
    if ahead is not None:
        ahead.done.wait()
    return ahead


@dataclass
class KnnInputs:
    chunks: pl.DataFrame  # chunk_id, doc_id of the catalog's chunks, aligned with vectors
    vectors: np.ndarray
    loaded: tuple[knn_state.SavedKnn | None, str]  # what load_knn gives
    read_ahead: str  # what was used from a read ahead, for the step's metadata


def knn_inputs(files: corpus_state.CorpusFiles, store, indexed: dict[str, str]) -> KnnInputs:
    """The catalog's chunks with their vectors and the saved KNN state: from a read ahead where it still holds,
    the rest read now (the saved state read beside the vectors). indexed: doc_id -> content hash."""
    ahead = _take(files)
    reused: set[str] = set()
    if ahead is not None and not ahead.error and ahead.chunks is not None:
        reused = {d for d in ahead.untouched if indexed.get(d) == ahead.catalog[d]}
        if len(indexed) - len(reused) > MAX_DOCUMENTS_READ:  # a long IN list: one read of all is simpler
            reused = set()
    state_current = ahead is not None and not ahead.error and _signature(files) == ahead.signature
    with ThreadPoolExecutor(1) as pool:
        loading = None if state_current else pool.submit(knn_state.load_knn, files)
        if reused:
            chunks, vectors = _with_vectors_of(store, ahead, reused, [d for d in indexed if d not in reused])
        else:
            chunks, vectors = catalog_chunks(store, indexed)
        loaded = ahead.loaded if state_current else loading.result()
    if ahead is None:
        note = "none"
    elif ahead.error:
        note = f"failed, everything read again: {ahead.error}"
    else:
        state = "used" if state_current else "read again (its files changed)"
        note = f"saved state {state}; vectors of {len(reused)} of {len(indexed)} documents used"
    return KnnInputs(chunks, vectors, loaded, note)


def _with_vectors_of(store, ahead: _ReadAhead, reused: set[str], others: list[str]) -> tuple[pl.DataFrame, np.ndarray]:
    """The read ahead's rows of the reused documents, then the other documents' rows read now."""
    chunks, vectors = ahead.chunks, ahead.vectors
    keep = chunks["doc_id"].is_in(list(reused))
    if not keep.all():
        chunks, vectors = chunks.filter(keep), vectors[keep.to_numpy()]
    if not others:
        return chunks, vectors
    more, more_vectors = store.chunk_vectors(doc_ids=others)
    if not more.height:
        return chunks, vectors
    return pl.concat([chunks, more.select(chunks.columns)]), np.concatenate([vectors, more_vectors])


def catalog_chunks(store, indexed: dict[str, str]) -> tuple[pl.DataFrame, np.ndarray]:
    """Chunk ids and vectors of the documents in the catalog (those whose graph load finished)."""
    if not indexed or not store.count("chunks"):
        empty = pl.DataFrame(schema={"chunk_id": pl.String, "doc_id": pl.String})
        return empty, np.zeros((0, store.vector_dimension() or 1), dtype=np.float32)
    chunks, matrix = store.chunk_vectors()
    loaded = chunks["doc_id"].is_in(list(indexed))
    if loaded.all():  # the usual case: no copy of every vector
        return chunks, matrix
    return chunks.filter(loaded), matrix[loaded.to_numpy()]
