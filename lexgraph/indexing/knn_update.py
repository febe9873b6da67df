"""The chunk_knn_graph step: the KNN graphs brought from the saved state to the current chunks by removing
and adding chunks only (:func:`update_knn`), and the graph store's SIMILAR edges brought to the result by
writing only the difference (:func:`write_similarity_edges`). The saved state is
:mod:`~lexgraph.indexing.knn_state`'s.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from lexgraph.extract import keywords as kw
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn import DEFAULT_K, KnnUpdate, edge_changes, lexical_knn, semantic_knn
from lexgraph.indexing.knn_edges import EDGE_SCHEMA, LEXICAL, SEMANTIC, EdgeRows, position_map
from lexgraph.indexing.knn_state import (KNN_FORMAT, AnnBase, SavedKnn, load_ann, load_knn, record_similar_synced,
                                         synced_similar_generation, write_knn)
from lexgraph.indexing.pipeline import KEYWORDS
from lexgraph.storage.extract_store import ExtractStore

# Exact neighbours up to this many chunks (incremental == rebuild); HNSW candidates beyond it.
EXACT_KNN_LIMIT = 20_000


def knn_mode(requested: str, n_chunks: int) -> str:
    if requested not in ("auto", "exact", "approx"):
        raise ValueError(f"knn mode must be auto, exact or approx, got {requested!r}")
    if requested != "auto":
        return requested
    return "exact" if n_chunks <= EXACT_KNN_LIMIT else "approx"


# A save keeps a journal of the vectors added since the last whole HNSW file while they are at most this
# share of it: rewriting the file (168 MB at 100k chunks) took each add 0.1-0.6 s, re-adding 1% of the
# vectors on load (500 took 0.06-0.1 s) ~0.2 s.
ANN_JOURNAL_SHARE = 100


@dataclass
class KnnResult:
    edge_rows: EdgeRows | None  # the graphs' edges as positions into the sorted chunk ids
    chunks: pl.DataFrame  # chunk_id, doc_id of the current corpus
    semantic: KnnUpdate | None
    lexical: KnnUpdate | None
    rebuilt: bool
    ann_index: str = "exact"  # "exact" (no ANN index), "loaded" (the saved one) or "rebuilt: <why>"
    words_read: int = 0  # chunks whose words were read from the extract store (the others came from the state)
    generation: str = ""  # of the files just saved
    # (removed, added, reweighted) edges since the previous save, to write only the difference; None when
    # there is no previous save whose edges file is whole
    edge_changes: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None = None
    previous_generation: str | None = None
    rebuild_reason: str = ""  # why the saved state was not used ("" when it was)
    isolated: int = 0  # chunks without an edge of either kind
    ann_base: AnnBase | None = None  # what the loaded HNSW index was made from, for a journal of this save
    pending_save: Callable[[], str] | None = None  # update_knn(save=False): the save, left to write_similarity_edges

    @functools.cached_property
    def edges(self) -> pl.DataFrame:
        """The edges named by chunk id (src < dst, kind, weight): built on first use, which an add that writes
        only a diff never makes."""
        return self.edge_rows.frame() if self.edge_rows is not None else pl.DataFrame(schema=EDGE_SCHEMA)


def chunk_words(store: ExtractStore, chunks: pl.DataFrame) -> pl.DataFrame:
    """Each chunk's distinct keywords (content words and proper-noun phrases), for the lexical kind.

    chunks: chunk_id, doc_id; only those documents' keyword files are read."""
    wanted = chunks.select("chunk_id")
    frames = [store.read(KEYWORDS, d, query=kw.chunk_keyword_pairs_query)
              for d in chunks["doc_id"].unique().sort().to_list() if store.exists(KEYWORDS, d)]
    if frames:
        words = (pl.concat(frames).group_by("chunk_id").agg(pl.col("keyword").sort().alias("words")))
        wanted = wanted.join(words, on="chunk_id", how="left")
    else:
        wanted = wanted.with_columns(pl.lit(None, dtype=pl.List(pl.String)).alias("words"))
    return wanted.with_columns(pl.col("words").fill_null(pl.lit([], dtype=pl.List(pl.String))))


def update_knn(files: CorpusFiles, chunks: pl.DataFrame, vectors: np.ndarray,
               words: pl.DataFrame | Callable[[pl.DataFrame], pl.DataFrame],
               k: int = DEFAULT_K, mode: str = "exact", *, loaded: tuple[SavedKnn | None, str] | None = None,
               save: bool = True) -> KnnResult:
    """Bring the KNN graphs from the saved corpus to `chunks` by removing and adding chunks only.

    chunks: chunk_id, doc_id aligned with `vectors` rows (the vectors of kept chunks come from here, not
    from a copy). words: chunk_id, words; or a function giving them for a frame of chunks, asked only
    for chunks the saved state does not hold. A chunk whose vector changed is removed and added again.
    A change of k or mode, or missing, torn or inconsistent state, rebuilds from scratch, and
    `rebuild_reason` says why. loaded: what load_knn(files) returned, for a caller that read it alongside
    the vectors. save=False leaves the save to write_similarity_edges (`pending_save`), which writes it
    while it writes the graph.
    """
    words_of = words if callable(words) else (lambda wanted: wanted.select("chunk_id").join(words, on="chunk_id", how="left"))
    current = (chunks.select("chunk_id", "doc_id").with_columns(pl.Series("vector_digest", vector_digests(vectors)))
               .with_row_index("row"))
    settings = {"k": k, "mode": mode, "format": KNN_FORMAT}
    saved, reason = loaded if loaded is not None else load_knn(files)
    if saved is not None and (saved.settings.get("k"), saved.settings.get("mode")) != (k, mode):
        saved, reason = None, (f"saved with k={saved.settings.get('k')} mode={saved.settings.get('mode')}, "
                               f"now k={k} mode={mode}")
    updated = None
    if saved is not None:
        try:
            updated = _update_saved(files, saved, current, vectors, words_of, k, mode)
        except ValueError as error:  # lists or words that do not fit the corpus: not trusted
            reason = f"saved state refused: {error}"
    if updated is None:
        current = current.join(_read_words(words_of, current), on="chunk_id", how="left")
        ids = current["chunk_id"].to_list()
        semantic = semantic_knn(ids, vectors, k, mode=mode)
        lexical = lexical_knn(ids, current["words"].to_list(), k)
        result = KnnResult(None, chunks, None, None, rebuilt=True, words_read=current.height,
                           rebuild_reason=reason)
    else:
        result, semantic, lexical = updated
        result.chunks = chunks
    if result.ann_index == "exact" or semantic.ann_status == "loaded":
        result.ann_index = semantic.ann_status
    if saved is not None and saved.edges_current and not result.rebuilt:
        to_new = position_map(saved.lists[SEMANTIC].chunk_ids, semantic.chunk_ids)  # the same for both kinds
        changes = [edge_changes(saved.lists[g.kind], g, to_new) for g in (semantic, lexical)]
        result.edge_changes = tuple(pl.concat(part) for part in zip(*changes))  # type: ignore[assignment]
    result.edge_rows = EdgeRows.concat([semantic.edge_rows(), lexical.edge_rows()])
    result.isolated = int(np.count_nonzero(~(semantic.linked() | lexical.linked())))
    frame = current.select("chunk_id", "doc_id", "vector_digest").sort("chunk_id")
    for graph in (semantic, lexical):
        if not frame["chunk_id"].equals(pl.Series(graph.chunk_ids, dtype=pl.String)):
            raise RuntimeError("the KNN graphs do not hold the current chunks")  # never saved: it would not load
    journal, appended = None, semantic.ann_appended()
    if result.ann_base is not None and appended is not None:
        batches = (*result.ann_base.batches, *(size for size in appended if size))
        if sum(batches) <= result.ann_base.total // ANN_JOURNAL_SHARE:
            journal = AnnBase(result.ann_base.generation, result.ann_base.total, batches)
    result.pending_save = functools.partial(
        write_knn, files, frame, {SEMANTIC: semantic.lists(), LEXICAL: lexical.lists()}, lexical.word_matrix(),
        semantic.ann_index(), settings, result.edge_rows, journal)
    if save:
        result.generation, result.pending_save = result.pending_save(), None
    return result


def _update_saved(files: CorpusFiles, saved: "SavedKnn", current: pl.DataFrame, vectors: np.ndarray,
                  words_of: Callable[[pl.DataFrame], pl.DataFrame], k: int, mode: str):
    """The saved graphs brought to `current`: chunks gone (or whose vector changed) removed, new ones added."""
    previous = saved.corpus  # sorted by chunk_id, the order of the saved lists
    matched = previous.select("chunk_id", "vector_digest").join(
        current.select("chunk_id", "vector_digest", "row"), on=["chunk_id", "vector_digest"], how="left",
        maintain_order="left")["row"]
    keep = matched.is_not_null().to_numpy()
    kept_rows = matched.drop_nulls().to_numpy()
    ids = saved.lists[SEMANTIC].chunk_ids
    gone = ids[~keep]
    is_new = np.ones(current.height, dtype=bool)
    is_new[kept_rows] = False
    new = current.filter(pl.Series(is_new))
    ann, problem, base = load_ann(files, saved, keep) if mode == "approx" else (None, None, None)
    # kept chunks usually sit in saved order at the front (the new ones appended): a view, not a copy of every vector
    in_order = len(kept_rows) == 0 or (int(kept_rows[-1]) == len(kept_rows) - 1
                                       and bool(np.all(kept_rows == np.arange(len(kept_rows)))))
    kept_vectors = vectors[:len(kept_rows)] if in_order else vectors[kept_rows]
    semantic = semantic_knn(ids[keep], kept_vectors, k, mode=mode, state=saved.lists[SEMANTIC], removed=gone,
                            ann_index=ann)
    lexical = lexical_knn(ids, saved.words, k, state=saved.lists[LEXICAL])
    sem_updates = [semantic.last_update] if len(gone) else []
    lex_updates = [lexical.remove(gone)] if len(gone) else []
    new = new.join(_read_words(words_of, new), on="chunk_id", how="left")
    if new.height:
        sem_updates.append(semantic.add(new["chunk_id"].to_list(), vectors[new["row"].to_numpy()]))
        lex_updates.append(lexical.add(new["chunk_id"].to_list(), new["words"].to_list()))
    result = KnnResult(None, pl.DataFrame(), _merge(sem_updates), _merge(lex_updates),
                       rebuilt=False, words_read=new.height, previous_generation=saved.generation, ann_base=base)
    if problem and semantic.ann_status.startswith("rebuilt"):
        result.ann_index = f"rebuilt: {problem}"
    return result, semantic, lexical


def _read_words(words_of: Callable[[pl.DataFrame], pl.DataFrame], chunks: pl.DataFrame) -> pl.DataFrame:
    found = words_of(chunks.select("chunk_id", "doc_id")) if chunks.height else pl.DataFrame(
        schema={"chunk_id": pl.String, "words": pl.List(pl.String)})
    return (chunks.select("chunk_id").join(found.select("chunk_id", "words"), on="chunk_id", how="left")
            .with_columns(pl.col("words").fill_null(pl.lit([], dtype=pl.List(pl.String)))))


def vector_digests(vectors: np.ndarray) -> np.ndarray:
    """One int64 per row that changes whenever any component's bits do (a weighted sum mod 2^64 with odd
    weights): how a kept chunk whose embedding changed is told apart without keeping a copy of the vectors."""
    bits = np.ascontiguousarray(vectors, dtype=np.float32).view(np.uint32)  # [n, d]; (0, d) when empty
    weights = np.random.default_rng(0x4C58).integers(1, 2**63, size=bits.shape[1], dtype=np.uint64) | np.uint64(1)
    digests = np.zeros(len(bits), dtype=np.uint64)
    for start in range(0, len(bits), 8192):
        digests[start:start + 8192] = bits[start:start + 8192].astype(np.uint64) @ weights  # wraps mod 2^64 like the sum
    return digests.view(np.int64)


def _merge(updates: list[KnnUpdate]) -> KnnUpdate:
    return KnnUpdate(*(sum(getattr(u, name) for u in updates) for name in ("added", "removed", "recomputed", "changed")))


EDGE_KEY = ["src", "dst", "kind"]


def edge_diff(before: pl.DataFrame, after: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(removed, added, reweighted) edges between two edge sets; reweighted rows carry the new weight."""
    joined = before.select(*EDGE_KEY, pl.col("weight").alias("old")).join(after, on=EDGE_KEY, how="full", coalesce=True)
    removed = joined.filter(pl.col("weight").is_null()).select(*EDGE_KEY, pl.col("old").alias("weight"))
    added = joined.filter(pl.col("old").is_null()).select(*EDGE_KEY, "weight")
    reweighted = joined.filter(pl.col("old").is_not_null() & pl.col("weight").is_not_null()
                               & (pl.col("old") != pl.col("weight"))).select(*EDGE_KEY, "weight")
    return removed, added, reweighted


def write_similarity_edges(files: CorpusFiles, graph, result: KnnResult) -> dict:
    """Bring the graph's SIMILAR edges to `result.edges`, writing only the difference from the edges it
    holds: the previous save's edges, less those of chunks reloaded since (a reload deletes a chunk with
    its edges). The whole set is written instead when the graph is not known to hold the previous save
    (first build, a crash between the save and the graph write, a torn save) or when the counts disagree
    afterwards. An update that left its save here (`pending_save`) is saved in a thread meanwhile: both
    writes release the GIL (0.5 s of files beside 2 s of Kùzu at 100k chunks). The sync record is cleared
    before them and names the new save only once both are done, so a crash in either leaves the next
    update writing the edges whole. Returns what was written, for run metadata."""
    synced = synced_similar_generation(files)
    if result.pending_save is None:
        figures = _similar_edges_to(graph, result, synced)
    else:
        record_similar_synced(files, None)
        with ThreadPoolExecutor(1) as pool:
            saving = pool.submit(result.pending_save)
            try:
                figures = _similar_edges_to(graph, result, synced)
            finally:
                result.generation, result.pending_save = saving.result(), None
    record_similar_synced(files, result.generation)
    return figures


def _similar_edges_to(graph, result: KnnResult, synced: str | None) -> dict:
    total = result.edge_rows.height if result.edge_rows is not None else 0
    figures = {"similar_edges_added": 0, "similar_edges_removed": 0, "similar_edges_updated": 0,
               "similar_edges_restored": 0, "similar_edges_rewritten": False}
    if result.edge_changes is not None and synced is not None and synced == result.previous_generation:
        removed, added, reweighted = result.edge_changes
        lost = graph.chunks_without_similar_edges()
        restored = added.clear()
        if lost:
            touches_lost = pl.col("src").is_in(lost) | pl.col("dst").is_in(lost)
            removed = removed.filter(~touches_lost)  # a lost chunk's edges are not there to delete or update
            reweighted = reweighted.filter(~touches_lost)
            restored = result.edge_rows.touching(lost).frame().join(added, on=EDGE_KEY, how="anti").join(
                reweighted, on=EDGE_KEY, how="anti")
        # fewer than asked when edges of chunks deleted with their document are gone already
        deleted = graph.delete_similarity_edges(pl.concat([removed, reweighted]).select(EDGE_KEY))
        graph.add_similarity_edges(pl.concat([added, reweighted, restored]))
        figures.update(similar_edges_added=added.height + restored.height, similar_edges_removed=deleted - reweighted.height,
                       similar_edges_updated=reweighted.height, similar_edges_restored=restored.height)
        if graph.count("SIMILAR") == total:
            return figures
        figures["similar_edges_mismatch"] = True  # the graph held something else: write it whole
    before = graph.count("SIMILAR")
    graph.replace_similarity_edges(result.edges)
    figures.update(similar_edges_added=total, similar_edges_removed=before, similar_edges_updated=0,
                   similar_edges_restored=0, similar_edges_rewritten=True)
    return figures
