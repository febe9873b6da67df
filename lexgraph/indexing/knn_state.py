"""The chunk KNN graphs' saved state: the files one save writes under `corpus/` (the chunks, both kinds'
lists, the lexical vocabulary, the edges and, in approximate mode, the HNSW index or its journal), how they
are read back and checked, and which save the graph's SIMILAR edges hold.

A save's files carry one generation, so a set torn by a crash is recognised and rebuilt rather than
trusted; format 3 keeps the lists as positions and the lexical corpus as word ids (a format-2 save is
read the slow way once and saved as format 3).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from lexgraph.atomic_json import write_json
from lexgraph.indexing.corpus_state import CorpusFiles, read_json, unreadable
from lexgraph.indexing.knn import lists_from_frame, word_matrix
from lexgraph.indexing.knn_edges import EDGE_KINDS, LEXICAL, SEMANTIC, EdgeRows, SavedLists, edge_rows_of
from lexgraph.indexing.knn_vectors import AnnIndex, AnnIndexError, append_in_order
from lexgraph.indexing.knn_words import WordMatrix
from lexgraph.indexing.pagerank import positions_of
from lexgraph.storage.graph_store import SIMILAR_SCHEMA

@dataclass(frozen=True)
class AnnBase:
    """A whole saved HNSW file and the batches of vectors (sizes, in order) appended to it since: a save's
    index is either a file of its own or (journal) its base's file plus those vectors, re-added on load."""
    generation: str  # of the save that wrote the whole file
    total: int  # vectors in that file
    batches: tuple[int, ...] = ()


# Saved with the KNN corpus. Format 3 keeps the lists as positions and the lexical corpus as word ids;
# a format-2 save (lists by chunk id, words as strings) is read the slow way once and saved as format 3.
KNN_FORMAT = 3
_MIGRATED_FORMATS = (2,)


@dataclass
class SavedKnn:
    corpus: pl.DataFrame  # chunk_id (sorted: the lists' positions), doc_id, vector_digest, ann_id
    lists: dict[str, SavedLists]  # kind -> directed lists
    words: WordMatrix  # the lexical corpus, rows in chunk_id order
    settings: dict
    generation: str
    edges_current: bool  # the edges file is of the same save (else no diff is offered against the graph)
    ann: tuple[object, AnnBase] | None = None  # its HNSW index when read ahead with it (read_ann)


# Parquet metadata key shared by the KNN files (and the edges) of one save.
KNN_GENERATION = b"lexgraph.knn_generation"
# knn_state.parquet: one row per chunk, in chunk_id order; neighbours are row numbers of this file (-1: none).
KNN_STATE_SCHEMA: dict[str, pl.DataType] = {
    "chunk_id": pl.String(),
    **{f"{kind}_{column}": pl.List(dtype) for kind in (SEMANTIC, LEXICAL)
       for column, dtype in (("neighbors", pl.Int32()), ("sims", pl.Float64()))},
}


def _generation(path: Path) -> str | None:
    # the file's key-value metadata: where both pyarrow and polars (which keeps no Arrow schema metadata) put it
    value = (pq.read_metadata(path).metadata or {}).get(KNN_GENERATION)
    return value.decode() if value else None


def _problem(name: str, error: BaseException) -> str:
    return f"{name} {unreadable(error)}"


def load_knn(files: CorpusFiles) -> tuple[SavedKnn | None, str]:
    """The saved corpus, lists and words; None and why unless the files are whole, of one save, and of a
    format this version reads."""
    if not files.knn_corpus.exists() and not files.knn_state.exists():
        return None, "no saved state"
    generations = {}
    for path in (files.knn_corpus, files.knn_state):
        try:
            generations[path] = _generation(path)
        except FileNotFoundError:
            return None, f"{path.name} missing"
        except (Exception, pl.exceptions.PanicException) as error:  # a damaged file: rebuild rather than trust it
            return None, _problem(path.name, error)
    if len(set(generations.values())) != 1 or None in generations.values():
        return None, "knn_corpus.parquet and knn_state.parquet are of different saves (torn by a crash)"
    [generation] = set(generations.values())
    try:
        corpus = pq.read_table(files.knn_corpus)
        settings = json.loads(corpus.column("settings")[0].as_py()) if corpus.num_rows else {}
    except (Exception, pl.exceptions.PanicException) as error:
        return None, _problem(files.knn_corpus.name, error)
    if not settings:
        return None, "the saved state holds no chunks"
    if settings.get("format") == KNN_FORMAT and not files.knn_vocabulary.exists():
        return None, f"{files.knn_vocabulary.name} missing"
    try:
        if settings.get("format") == KNN_FORMAT:
            saved = _read_saved(files, corpus, settings, generation)
        elif settings.get("format") in _MIGRATED_FORMATS:
            saved = _read_format_2(files, corpus, settings, generation)
        else:
            return None, f"saved in format {settings.get('format')}, this version reads {KNN_FORMAT} and {_MIGRATED_FORMATS}"
    except ValueError as error:
        return None, f"saved state refused: {error}"
    except (Exception, pl.exceptions.PanicException) as error:
        return None, _problem("saved state", error)
    if saved is None:
        return None, "knn_vocabulary.parquet is of another save (a crash between the writes)"
    try:
        saved.edges_current = _generation(files.edges) == generation
    except (Exception, pl.exceptions.PanicException):
        saved.edges_current = False
    return saved, ""


def _read_saved(files: CorpusFiles, corpus, settings: dict, generation: str) -> SavedKnn | None:
    """Format 3: arrays only, no per-string work beyond the chunk ids."""
    if _generation(files.knn_vocabulary) != generation:
        return None
    k = int(settings["k"])
    state = pq.read_table(files.knn_state)
    if not state.column("chunk_id").equals(corpus.column("chunk_id")):
        raise ValueError("knn_state.parquet and knn_corpus.parquet list different chunks")
    ids = corpus.column("chunk_id").to_numpy().astype(str)
    lists = {kind: SavedLists(ids, _list_column(state, f"{kind}_neighbors", k), _list_column(state, f"{kind}_sims", k))
             for kind in (SEMANTIC, LEXICAL)}
    word_ids = corpus.column("word_ids").combine_chunks()
    offsets = word_ids.offsets.to_numpy()
    vocabulary = pq.read_table(files.knn_vocabulary).column("word").to_pylist()
    incidence = sp.csr_matrix((np.ones(len(word_ids.flatten()), np.int32), word_ids.flatten().to_numpy(),
                               offsets - offsets[0]), shape=(len(ids), len(vocabulary)))
    frame = pl.from_arrow(corpus.select(["chunk_id", "doc_id", "vector_digest", "ann_id"]))
    return SavedKnn(frame, lists, WordMatrix(vocabulary, incidence), settings, generation, False)


def _list_column(table, name: str, k: int) -> np.ndarray:
    """A column of k-long lists as an [n, k] array."""
    column = table.column(name).combine_chunks()
    if column.null_count or not bool(np.all(np.diff(column.offsets.to_numpy()) == k)):
        raise ValueError(f"{name} does not hold {k} entries per chunk: saved with another k?")
    return column.flatten().to_numpy().reshape(len(column), k)


def _read_format_2(files: CorpusFiles, corpus, settings: dict, generation: str) -> SavedKnn:
    """Format 2 (lists by chunk id, words as strings): slow to read, so read once and saved as format 3."""
    frame = pl.from_arrow(corpus).sort("chunk_id")
    if not {"chunk_id", "doc_id", "vector_digest", "words", "ann_id"} <= set(frame.columns):
        raise ValueError("an older layout")
    state = pl.read_parquet(files.knn_state)
    ids = frame["chunk_id"].to_numpy().astype(str)
    lists = {kind: lists_from_frame(state.filter(pl.col("kind") == kind), ids, int(settings["k"]))
             for kind in (SEMANTIC, LEXICAL)}
    return SavedKnn(frame.select("chunk_id", "doc_id", "vector_digest", "ann_id"), lists,
                    word_matrix(frame["words"].to_list()), settings, generation, False)


def load_ann(files: CorpusFiles, saved: SavedKnn, keep: np.ndarray) -> tuple[AnnIndex | None, str | None, AnnBase | None]:
    """The saved HNSW index of this generation (its own file, or its journal replayed onto the file it
    names), the faiss id of each kept chunk and what the index was made from; None and why not when
    it is missing, unreadable or not of this save (semantic_knn then checks its vectors against the corpus)."""
    path, journal = files.ann_index(saved.generation), files.ann_journal(saved.generation)
    if not path.exists() and not journal.exists():
        return None, f"no saved index {path.name}", None
    ids = saved.corpus["ann_id"].filter(pl.Series(keep))
    if ids.null_count():
        return None, "the saved state has no faiss ids", None
    path = path if path.exists() else journal
    try:
        # read ahead with the state (corpus_prefetch), or now; either way used once, then changed by the update
        index, base = saved.ann if saved.ann is not None else read_ann(files, saved.generation)
        saved.ann = None
    except AnnIndexError as error:
        return None, f"{path.name} refused: {error}", None
    except Exception as error:  # truncated or garbage: rebuild
        return None, _problem(path.name, error), None
    return (index, ids.to_numpy()), None, base


def read_ann(files: CorpusFiles, generation: str) -> tuple[object, AnnBase]:
    """A save's HNSW index as written: its own file, or its journal replayed onto the file it names."""
    import faiss

    path = files.ann_index(generation)
    if path.exists():
        index = faiss.read_index(str(path))
        return index, AnnBase(generation, int(index.ntotal))
    return _replay_journal(files, files.ann_journal(generation), generation)


# Parquet metadata of a journal: the whole file it extends (generation) and that file's vector count.
ANN_BASE = b"lexgraph.ann_base"
ANN_BASE_TOTAL = b"lexgraph.ann_base_total"


def _replay_journal(files: CorpusFiles, journal: Path, generation: str) -> tuple[object, AnnBase]:
    """The index a journal describes: its base file with the journal's batches re-added in order (the
    same single-threaded adds that made the saved graph, hence the same graph). AnnIndexError when the
    journal is of another save or does not fit its base."""
    import faiss

    table = pq.read_table(journal)
    listed = table.schema.metadata or {}
    if listed.get(KNN_GENERATION) != generation.encode():
        raise AnnIndexError("a journal of another save")
    if ANN_BASE not in listed or ANN_BASE_TOTAL not in listed:
        raise AnnIndexError("a journal without its base")
    base = AnnBase(listed[ANN_BASE].decode(), int(listed[ANN_BASE_TOTAL]))
    path = files.ann_index(base.generation)
    if not path.exists():
        raise AnnIndexError(f"its base index {path.name} is missing")
    index = faiss.read_index(str(path))
    if int(index.ntotal) != base.total:
        raise AnnIndexError(f"its base index holds {index.ntotal} vectors, not {base.total}")
    batch = table.column("batch").to_numpy()
    vectors = table.column("vector").combine_chunks()
    if vectors.type.list_size != index.d or vectors.null_count:
        raise AnnIndexError(f"its vectors are not of the index's dimension {index.d}")
    if len(batch) and (int(batch[0]) != 0 or bool(np.any(np.diff(batch) < 0))):
        raise AnnIndexError("its batches are out of order")
    sizes = np.bincount(batch) if len(batch) else np.zeros(0, np.int64)
    if bool(np.any(sizes == 0)):
        raise AnnIndexError("its batches are out of order")
    flat = vectors.values.to_numpy(zero_copy_only=False).reshape(len(batch), index.d)
    for start, end in zip(np.r_[0, np.cumsum(sizes)[:-1]], np.cumsum(sizes)):
        append_in_order(index, flat[start:end])
    return index, AnnBase(base.generation, base.total, tuple(int(size) for size in sizes))


def _write_journal(files: CorpusFiles, generation: str, index, journal: AnnBase) -> None:
    """The vectors appended to the index since its base file, as stored in it, with their batches."""
    appended = int(index.ntotal) - journal.total
    if appended != sum(journal.batches):
        raise RuntimeError(f"the index holds {appended} vectors beyond its base, its batches {sum(journal.batches)}")
    vectors = index.reconstruct_n(journal.total, appended) if appended else np.zeros((0, index.d), np.float32)
    table = pa.table({"batch": pa.array(np.repeat(np.arange(len(journal.batches), dtype=np.int32), journal.batches)),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), index.d)})
    _write_table(files.ann_journal(generation), table.replace_schema_metadata(
        {KNN_GENERATION: generation.encode(), ANN_BASE: journal.generation.encode(),
         ANN_BASE_TOTAL: str(journal.total).encode()}))


def write_knn(files: CorpusFiles, frame: pl.DataFrame, lists: dict[str, SavedLists], words: WordMatrix,
               ann: AnnIndex | None, settings: dict, edges: EdgeRows, journal: AnnBase | None = None) -> str:
    """One save, several files: the HNSW index (approximate mode), the lists, the vocabulary, the corpus and
    the edges all carry the same generation, so a set torn by a crash is recognised. The index is written
    first under a name of its own (a whole file, or with `journal` the vectors appended since the whole
    file it names, which is kept) and the older ones deleted last, so a crash leaves the previous save whole.

    frame: chunk_id (sorted), doc_id, vector_digest; the rows of `lists`, `words` and ann's faiss ids."""
    generation = uuid.uuid4().hex
    ann_ids = pl.Series("ann_id", [None] * frame.height, dtype=pl.Int64)
    keep = {files.ann_index(generation).name}
    if ann is not None and journal is not None:
        _write_journal(files, generation, ann[0], journal)
        keep = {files.ann_journal(generation).name, files.ann_index(journal.generation).name}
        ann_ids = pl.Series("ann_id", np.asarray(ann[1], dtype=np.int64))
    elif ann is not None:
        import faiss

        path = files.ann_index(generation)
        partial = path.with_suffix(".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        faiss.write_index(ann[0], str(partial))
        partial.replace(path)
        ann_ids = pl.Series("ann_id", np.asarray(ann[1], dtype=np.int64))
    chunk_ids = frame["chunk_id"].to_arrow()
    state = pa.table({"chunk_id": chunk_ids, **{
        f"{kind}_{column}": _list_array(getattr(lists[kind], column).astype(dtype))
        for kind in (SEMANTIC, LEXICAL) for column, dtype in (("neighbors", np.int32), ("sims", np.float64))}})
    incidence = words.incidence
    word_ids = pa.ListArray.from_arrays(pa.array(incidence.indptr.astype(np.int32)),
                                        pa.array(incidence.indices.astype(np.int32)))
    corpus = frame.with_columns(ann_ids, pl.lit(json.dumps(settings)).alias("settings")).to_arrow()
    corpus = corpus.add_column(3, "word_ids", word_ids)
    vocabulary = pa.table({"word": pa.array(words.vocabulary, type=pa.string())})
    for path, table in ((files.knn_state, state), (files.knn_vocabulary, vocabulary), (files.knn_corpus, corpus)):
        _write_table(path, table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                          KNN_GENERATION: generation.encode()}))
    write_saved_edges(files.edges, edges, generation)
    for old in [*files.root.glob("knn_hnsw.*.faiss"), *files.root.glob("knn_hnsw.*.tmp"),
                *files.root.glob("knn_hnsw_journal.*")]:
        if old.name not in keep:  # older saves, and halves of writes killed midway
            old.unlink(missing_ok=True)
    return generation


def _list_array(matrix: np.ndarray) -> pa.ListArray:
    n, k = matrix.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * k), pa.array(matrix.ravel()))


def _write_table(path: Path, table) -> None:
    """Atomic Parquet write; lz4 without statistics: several times faster to write than the defaults for
    these files, which are always read whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    pq.write_table(table, partial, compression="lz4", write_statistics=False)
    partial.replace(path)


def resave_knn(files: CorpusFiles) -> str:
    """Rewrite a saved KNN state in the current format, unchanged: what the next update does by itself,
    for an index whose first update should not pay for reading an older format. The graph's SIMILAR
    edges stay those of the save (same lists), so its sync record follows the new generation."""
    saved, reason = load_knn(files)
    if saved is None:
        return f"nothing rewritten: {reason}"
    if saved.settings.get("format") == KNN_FORMAT:
        return "nothing rewritten: already in the current format"
    ann, _, _ = load_ann(files, saved, np.ones(saved.corpus.height, dtype=bool))  # written whole
    edges = saved_edge_rows(saved)
    synced = synced_similar_generation(files) == saved.generation
    generation = write_knn(files, saved.corpus.select("chunk_id", "doc_id", "vector_digest"), saved.lists,
                            saved.words, ann, {**saved.settings, "format": KNN_FORMAT}, edges)
    if synced:
        record_similar_synced(files, generation)
    return f"rewritten in format {KNN_FORMAT}: {saved.corpus.height} chunks, {edges.height} edges, generation {generation}"


def saved_edges(saved: SavedKnn) -> pl.DataFrame:
    """The SIMILAR edges of a save's lists, both kinds."""
    return saved_edge_rows(saved).frame()


def saved_edge_rows(saved: SavedKnn) -> EdgeRows:
    return EdgeRows.concat([edge_rows_of(saved.lists[kind], kind) for kind in EDGE_KINDS])


# knn_edges.parquet: src and dst are row numbers of knn_corpus.parquet of the same save; kind a position in
# the list of kind names EDGE_KINDS_KEY holds. Written by code before it: src and dst chunk ids, kind names.
SAVED_EDGE_SCHEMA: dict[str, pl.DataType] = {"src": pl.Int32(), "dst": pl.Int32(), "kind": pl.UInt8(),
                                             "weight": pl.Float64()}
EDGE_KINDS_KEY = b"lexgraph.edge_kinds"


def write_saved_edges(path: Path, edges: EdgeRows, generation: str) -> None:
    """The edges file of a save, atomically (polars writes these 2.65M rows at 100k chunks in a third of
    pyarrow's time; both put the metadata in the file's key-value store)."""
    partial = path.with_suffix(".tmp")
    pl.DataFrame({name: getattr(edges, name) for name in SAVED_EDGE_SCHEMA}, schema=SAVED_EDGE_SCHEMA).write_parquet(
        partial, compression="lz4", statistics=False,
        metadata={KNN_GENERATION.decode(): generation, EDGE_KINDS_KEY.decode(): ",".join(EDGE_KINDS)})
    partial.replace(path)


def read_edges(files: CorpusFiles) -> EdgeRows | None:
    """The saved edges, with the chunk ids their positions stand for; None when no save is whole: no edges
    file, or one of another save than knn_corpus.parquet (torn by a crash), whose positions would name the
    wrong chunks. An edges file of the format before positions is mapped to them."""
    try:
        listed = pq.read_metadata(files.edges).metadata or {}  # the footer once: the generation and the kinds
        generation = listed.get(KNN_GENERATION)
        if generation is None or generation.decode() != _generation(files.knn_corpus):
            return None
        edges, corpus = pq.read_table(files.edges), pq.read_table(files.knn_corpus, columns=["chunk_id"])
    except FileNotFoundError:
        return None
    chunk_ids = corpus.column("chunk_id").to_numpy(zero_copy_only=False).astype(str)
    if pa.types.is_string(edges.schema.field("src").type) or pa.types.is_large_string(edges.schema.field("src").type):
        named = pl.from_arrow(edges)
        ids = pl.Series("id", chunk_ids, dtype=pl.String)
        kinds = named["kind"].replace_strict({name: code for code, name in enumerate(EDGE_KINDS)}, return_dtype=pl.UInt8)
        return EdgeRows(chunk_ids, positions_of(ids, named["src"]), positions_of(ids, named["dst"]), kinds.to_numpy(),
                        named["weight"].to_numpy())
    names = listed.get(EDGE_KINDS_KEY, b"").decode().split(",")
    if tuple(names) != EDGE_KINDS:
        raise ValueError(f"{files.edges.name} names edge kinds {names}, this version knows {list(EDGE_KINDS)}")
    src, dst = (edges.column(name).to_numpy() for name in ("src", "dst"))
    if len(src) and (min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= len(chunk_ids)):
        raise ValueError(f"{files.edges.name} names rows beyond the {len(chunk_ids)} chunks of its save")
    return EdgeRows(chunk_ids, src, dst, edges.column("kind").to_numpy(), edges.column("weight").to_numpy())


def synced_similar_generation(files: CorpusFiles) -> str | None:
    """The KNN save whose edges the graph's SIMILAR holds, or None. A record written for an older SIMILAR
    schema is void: the first writer to open such a graph recreated the table empty (GraphStore)."""
    record = read_json(files.similar_synced)
    return record.get("generation") if record.get("similar_schema") == SIMILAR_SCHEMA else None


def record_similar_synced(files: CorpusFiles, generation: str | None) -> None:
    """Name the save the graph's SIMILAR edges now hold (None: clear the record before writing them)."""
    write_json(files.similar_synced, {} if generation is None else {"generation": generation,
                                                                    "similar_schema": SIMILAR_SCHEMA})
