"""Corpus-wide KET-RAG indexing kept current incrementally: chunk KNN graph, PageRank, β-skeleton,
and the keyword index. State lives as Parquet under the index version's `corpus/` folder, so each
update starts from the previous one and touches only what added or removed chunks affect.
"""
from __future__ import annotations

import functools
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from lexgraph.atomic_json import write_json
from lexgraph.extract import keywords as kw
from lexgraph.faults import KEYWORD_INDEX, crash_point
from lexgraph.ids import content_hash
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import SIMILAR_SCHEMA
from lexgraph.indexing.lexical_diff import rewrite_is_cheaper
from lexgraph.indexing.knn import (DEFAULT_K, EDGE_KINDS, EDGE_SCHEMA, LEXICAL, SEMANTIC, AnnIndex, AnnIndexError,
                                EdgeRows, KnnUpdate, SavedLists, WordMatrix, append_in_order, edge_changes,
                                edge_rows_of, lexical_knn, lists_from_frame, position_map, semantic_knn, word_matrix)
from lexgraph.indexing.pagerank import pagerank_of_positions, positions_of
from lexgraph.indexing.pipeline import ENTITIES, FACTS, KEYWORD_STATS, KEYWORDS, RELATIONS, STATEMENTS, TOPICS
from lexgraph.indexing.skeleton import DEFAULT_BETA, SelectionDiff, frame_selection_diff, skeleton_mask, skeleton_size

# Exact neighbours up to this many chunks (incremental == rebuild); HNSW candidates beyond it.
EXACT_KNN_LIMIT = 20_000


def knn_mode(requested: str, n_chunks: int) -> str:
    if requested not in ("auto", "exact", "approx"):
        raise ValueError(f"knn mode must be auto, exact or approx, got {requested!r}")
    if requested != "auto":
        return requested
    return "exact" if n_chunks <= EXACT_KNN_LIMIT else "approx"


# The corpus assets, in the order the corpus job runs them; each records the catalog it was built from.
CORPUS_STEPS = ("chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "search_indexes",
                "lexical_graph")
# The step that loads the lexical graph; re-extraction without a catalog change makes only it out of step.
LEXICAL_GRAPH = "lexical_graph"
# LanceDB's search indexes; a changed LEXGRAPH_LANCE_THRESHOLD or query backend makes only it out of step.
SEARCH_INDEXES = "search_indexes"
# Steps nothing else reads: when only they are out of step, they run alone (not the whole corpus job).
SOLO_STEPS = (SEARCH_INDEXES, LEXICAL_GRAPH)
LEXICAL_TABLES = (STATEMENTS, TOPICS, FACTS, ENTITIES, RELATIONS)


# Prefix of a recorded digest whose documents were reloaded since (their corpus edges went with them).
RELOADED = "reloaded:"


# Key suffix, in built_from.json, of the settings a step was built with.
WITH = "@settings"


def step_settings(step: str, settings) -> str:
    """The settings a corpus step's output depends on: changing one makes that step out of step, so
    `lexgraph ingest` and the corpus sensor rebuild it (the catalog alone would not show the change)."""
    knn = f"knn_k={settings.knn_k} knn_mode={settings.knn_mode}"
    search = f"query_backend={settings.query_backend} lance_threshold={settings.lance_threshold}"
    return {"chunk_knn_graph": knn, "chunk_pagerank": knn, "skeleton_selection": f"{knn} beta={settings.beta}",
            SEARCH_INDEXES: search}.get(step, "")


def solo_steps(stale: list[str]) -> list[str] | None:
    """The steps to run alone when only SOLO_STEPS are out of step, else None (the whole corpus job)."""
    return list(stale) if stale and set(stale) <= set(SOLO_STEPS) else None


def catalog_digest(indexed: dict[str, str]) -> str:
    """One hash of the indexed state (doc_id -> content hash of every document in the catalog)."""
    return content_hash("\n".join(f"{doc}={digest}" for doc, digest in sorted(indexed.items())))


class CorpusFiles:
    """Paths of the corpus-wide state of one index version."""

    def __init__(self, index_dir: str | Path):
        self.root = Path(index_dir) / "corpus"
        self.knn_corpus = self.root / "knn_corpus.parquet"  # chunk_id, doc_id, vector_digest, word_ids, ann_id
        self.knn_state = self.root / "knn_state.parquet"  # directed top-K lists, both kinds, as row positions
        self.knn_vocabulary = self.root / "knn_vocabulary.parquet"  # the lexical lists' words
        self.edges = self.root / "knn_edges.parquet"
        self.similar_synced = self.root / "similar_synced.json"  # the edges generation the graph holds
        self.keywords_synced = self.root / "keywords_synced.json"  # the keyword index the stores hold
        self.pagerank = self.root / "pagerank.parquet"
        self.skeleton = self.root / "skeleton.parquet"
        self.skeleton_diff = self.root / "skeleton_diff.json"
        # Arrow IPC, uncompressed: read memory-mapped and written in a fraction of Parquet's time (at 100k chunks
        # 350 MB of vector sums, rewritten by every update: 0.005 s + 0.19 s against 2.5 s + 1.1 s)
        self.keyword_index = self.root / "keyword_index.arrow"
        self.keyword_index_parquet = self.root / "keyword_index.parquet"  # before: read once, then replaced
        self.keyword_contrib = self.root / "keyword_contrib"  # each document's stats as added
        self.built_from = self.root / "built_from.json"  # step -> catalog digest it was built from
        self.entity_merges = self.root / "entity_merges.parquet"  # every surface form folded into an entity, and why
        self.reextracted = self.root / "reextracted.json"  # the selection diff whose re-extraction is done
        self.lexical_inputs = self.root / "lexical_inputs.json"  # the lexical tables the lexical graph was built from
        self.lexical_state = self.root / "lexical_state"  # what the lexical graph's diff needs (lexical_diff)

    def ann_index(self, generation: str) -> Path:
        """The saved faiss HNSW index of one KNN save (approximate mode only)."""
        return self.root / f"knn_hnsw.{generation}.faiss"

    def ann_journal(self, generation: str) -> Path:
        """A KNN save's HNSW index as the vectors appended to an earlier save's index (instead of a whole file)."""
        return self.root / f"knn_hnsw_journal.{generation}.parquet"

    def record_built(self, step: str, digest: str, settings) -> None:
        """Written last by each corpus step, so a crash before it leaves the step out of date."""
        built = self._read_built()
        built[step] = digest
        built[step + WITH] = step_settings(step, settings)
        self._write_built(built)

    def _write_built(self, built: dict[str, str]) -> None:
        write_json(self.built_from, built, indent=1, sort_keys=True)

    def forget_built(self) -> None:
        """Reloading a document deletes its chunks' SIMILAR and KEYWORD_IN edges, even when its content (so
        the catalog digest) is unchanged: every step is marked out of step, while PageRank and the skeleton
        can still inherit what the KNN graph was built from."""
        built = self._read_built()
        if built:
            self._write_built({step: d if d.startswith(RELOADED) or step.endswith(WITH) else RELOADED + d
                               for step, d in built.items()})

    def lexical_inputs_digest(self, doc_ids) -> str:
        """One hash of the lexical tables the lexical graph is built from (each file's size and modification
        time; every write replaces a file), so re-extracted documents make it out of step although the
        catalog did not change. Taken before the build reads them: a write during the build is not missed."""
        extract = self.root.parent / "extract"
        lines = []
        for doc_id in sorted(doc_ids):
            for stage in LEXICAL_TABLES:
                try:
                    stat = (extract / stage / f"{doc_id}.parquet").stat()
                    lines.append(f"{doc_id}|{stage}|{stat.st_size}|{stat.st_mtime_ns}")
                except FileNotFoundError:
                    lines.append(f"{doc_id}|{stage}|-")
        return content_hash("\n".join(lines))

    def record_lexical_inputs(self, digest: str) -> None:
        write_json(self.lexical_inputs, {"digest": digest})

    def recorded_lexical_inputs(self) -> str | None:
        try:
            return json.loads(self.lexical_inputs.read_text()).get("digest")
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    def built_digests(self) -> dict[str, str]:
        """Step -> the catalog digest it was built from."""
        return {step: d for step, d in self._read_built().items() if not step.endswith(WITH)}

    def _read_built(self) -> dict[str, str]:
        try:
            return json.loads(self.built_from.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def stale_steps(self, indexed: dict[str, str], settings) -> list[str]:
        """Corpus steps not built from this catalog with these settings: the corpus index must be updated
        when any is."""
        digest = catalog_digest(indexed)
        built = self._read_built()
        stale = [step for step in CORPUS_STEPS
                 if built.get(step) != digest or built.get(step + WITH, "") != step_settings(step, settings)]
        if LEXICAL_GRAPH not in stale and self.lexical_inputs_digest(indexed) != self.recorded_lexical_inputs():
            stale.append(LEXICAL_GRAPH)  # documents were re-extracted since it was built
        return stale

    def write(self, path: Path, frame: pl.DataFrame) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        frame.write_parquet(partial)
        partial.replace(path)


@dataclass(frozen=True)
class AnnBase:
    """A whole saved HNSW file and the batches of vectors (sizes, in order) appended to it since: a save's
    index is either a file of its own or (journal) its base's file plus those vectors, re-added on load."""
    generation: str  # of the save that wrote the whole file
    total: int  # vectors in that file
    batches: tuple[int, ...] = ()


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


# Saved with the KNN corpus. Format 3 keeps the lists as positions and the lexical corpus as word ids;
# a format-2 save (lists by chunk id, words as strings) is read the slow way once and saved as format 3.
KNN_FORMAT = 3
_MIGRATED_FORMATS = (2,)


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
        _write_knn, files, frame, {SEMANTIC: semantic.lists(), LEXICAL: lexical.lists()}, lexical.word_matrix(),
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
    ann, problem, base = _load_ann(files, saved, keep) if mode == "approx" else (None, None, None)
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
    return f"{name} {_unreadable(error)}"


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


def _load_ann(files: CorpusFiles, saved: SavedKnn, keep: np.ndarray) -> tuple[AnnIndex | None, str | None, AnnBase | None]:
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


def _write_knn(files: CorpusFiles, frame: pl.DataFrame, lists: dict[str, SavedLists], words: WordMatrix,
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
    ann, _, _ = _load_ann(files, saved, np.ones(saved.corpus.height, dtype=bool))  # written whole
    edges = saved_edge_rows(saved)
    synced = synced_similar_generation(files) == saved.generation
    generation = _write_knn(files, saved.corpus.select("chunk_id", "doc_id", "vector_digest"), saved.lists,
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


EDGE_KEY = ["src", "dst", "kind"]


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
        return found if isinstance(found, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def synced_similar_generation(files: CorpusFiles) -> str | None:
    """The KNN save whose edges the graph's SIMILAR holds, or None. A record written for an older SIMILAR
    schema is void: the first writer to open such a graph recreated the table empty (GraphStore)."""
    record = _read_json(files.similar_synced)
    return record.get("generation") if record.get("similar_schema") == SIMILAR_SCHEMA else None


def record_similar_synced(files: CorpusFiles, generation: str | None) -> None:
    """Name the save the graph's SIMILAR edges now hold (None: clear the record before writing them)."""
    write_json(files.similar_synced, {} if generation is None else {"generation": generation,
                                                                    "similar_schema": SIMILAR_SCHEMA})


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


def compute_pagerank(files: CorpusFiles, chunks: pl.DataFrame, edges: EdgeRows) -> pl.DataFrame:
    """PageRank over both kinds of similarity edge; chunk_id, doc_id, pagerank. chunks: the save's chunks, in
    the order the edges' positions count them."""
    if chunks.height != len(edges.chunk_ids) or (chunks.height and (chunks["chunk_id"][0], chunks["chunk_id"][-1])
                                                  != (edges.chunk_ids[0], edges.chunk_ids[-1])):
        raise ValueError("the saved edges are not of these chunks")
    scores = pagerank_of_positions(chunks.height, edges.src, edges.dst, edges.weight)
    frame = chunks.select("chunk_id", "doc_id").with_columns(pl.Series("pagerank", scores))
    files.write(files.pagerank, frame)
    return frame


@dataclass
class SkeletonResult:
    selection: pl.DataFrame  # chunk_id, doc_id, pagerank, selected
    diff: SelectionDiff
    size: int
    coverage: pl.DataFrame = field(default_factory=pl.DataFrame)  # per document: chunks, selected, share


def select(files: CorpusFiles, ranks: pl.DataFrame, beta: float = DEFAULT_BETA) -> SkeletonResult:
    """Top ⌊β·n⌋ chunks by PageRank, and the diff against the previous selection (saved for re-extraction)."""
    selection = ranks.with_columns(pl.Series("selected", skeleton_mask(ranks["chunk_id"], ranks["pagerank"], beta)))
    previous = (pl.read_parquet(files.skeleton, columns=["chunk_id", "selected"]).filter("selected")["chunk_id"]
                if files.skeleton.exists() else pl.Series("chunk_id", [], dtype=pl.String))
    diff = frame_selection_diff(previous, selection.filter("selected")["chunk_id"], ranks.select("chunk_id", "doc_id"))
    # The diff first: killed between the two writes, the next update diffs against the same previous
    # selection and publishes the same diff again.
    write_json(files.skeleton_diff, {"beta": beta, **diff.to_dict()}, indent=1)
    files.write(files.skeleton, selection)
    coverage = (selection.group_by("doc_id").agg(pl.len().alias("chunks"), pl.col("selected").sum().alias("selected"))
                .with_columns((pl.col("selected") / pl.col("chunks")).alias("share")).sort("doc_id"))
    return SkeletonResult(selection, diff, skeleton_size(ranks.height, beta), coverage)


def read_selection_diff(files: CorpusFiles) -> dict:
    """The last published selection diff, for downstream re-extraction."""
    return json.loads(files.skeleton_diff.read_text()) if files.skeleton_diff.exists() else {}


@dataclass
class KeywordIndexResult:
    added: list[str]
    removed: list[str]
    updated: list[str]
    keyword_count: int = 0  # keywords in the index after the update
    previous_keyword_count: int = 0  # in the index this update started from
    keywords_appeared: list[str] = field(default_factory=list)  # in the index now, not before
    keywords_gone: list[str] = field(default_factory=list)  # in the index before, not now
    touched: list[str] = field(default_factory=list)  # keywords (still in the index) whose sums or counts changed
    touched_rows: pl.DataFrame | None = None  # their rows (keyword, vector_sum, sentence_count)
    dimension: int = 0  # components of the vectors
    links: pl.DataFrame | None = None  # keyword→chunk links of `link_docs`, read for this update
    link_docs: list[str] = field(default_factory=list)  # added and updated documents
    link_counts: dict[str, int] = field(default_factory=dict)  # doc_id -> its keyword→chunk links, every document
    docs_read: int = 0  # documents whose stats or links were read
    generation: str = ""  # of the saved index (a digest of the contributions it includes)
    previous_generation: str | None = None  # None when the update started from nothing
    rebuild_reason: str | None = None  # why a saved index was not used (None: used, or there was none)
    base: pl.DataFrame | None = field(default=None, repr=False)  # the saved base file's rows
    delta: pl.DataFrame | None = field(default=None, repr=False)  # rows that replace the base's (count 0: removed)
    _index: pl.DataFrame | None = field(default=None, repr=False)

    @property
    def index(self) -> pl.DataFrame:
        """The whole index (keyword, vector_sum, sentence_count), sorted: built from the base and the delta
        on first use, which only a whole rewrite of the stores (and tests) needs."""
        if self._index is None:
            self._index = self.base if not self.delta.height else kw.apply_keyword_rows(self.base, self.delta)
        return self._index


def update_keyword_index(files: CorpusFiles, store: ExtractStore, doc_ids: list[str], dimension: int) -> KeywordIndexResult:
    """Add the stats of new or changed documents and subtract those of changed or removed ones.

    Each document's stats are kept as they were added (keyword_contrib/<doc>.<signature>.parquet), so a
    removed document can be subtracted after its own files are gone. A document counts as changed when
    its stats file's size or modification time did (every write replaces the file), so unchanged ones
    are not read. Crash-safe and idempotent: the index file lists the contributions it holds (in its
    Parquet metadata, with each document's number of keyword links) and is replaced atomically,
    contributions are written before it and deleted only after it, so a process killed anywhere leaves
    an index that agrees with its list, and the next update does exactly what is still missing.

    The index is saved as a base file and a delta file (keyword_index.delta.arrow) of the rows that
    replace the base's, each replaced atomically; the delta names the base it extends (a random id in the
    base's metadata) and carries the list of contributions, which is then the index's. An update reads and
    writes only the rows of the keywords its documents touch (and the delta); it folds the delta into a new
    base once the delta holds more rows than KEYWORD_DELTA_SHARE of the base's (or the base is small, or in
    an older format without an id), then deletes the delta. A delta naming another base is what a fold
    killed before that delete leaves: the new base holds it already, so it is ignored. An unreadable base
    or delta, or a delta without its base, is rebuilt (`rebuild_reason` says why).
    """
    current = sorted(set(doc_ids) & set(store.doc_ids(KEYWORD_STATS)))
    hashes = {d: _stats_signature(store.path(KEYWORD_STATS, d)) for d in current}
    saved = _load_keyword_state(files, dimension)
    base, delta, included, link_counts = saved.base, saved.delta, saved.included, saved.link_counts
    reason = saved.reason
    missing = None if included is None else next(
        (d for d in sorted(included) if included[d] != hashes.get(d) and not _contribution(files, d, included[d]).exists()),
        None)
    if included is None or missing is not None:
        # no index, an index without its list, or a contribution to subtract is gone: start over
        if missing is not None:
            reason = f"the keyword stats {missing} was added with are gone"
        base, delta = kw.empty_keyword_index(dimension), kw.empty_keyword_index(dimension)
        included, link_counts, base_id, previous_generation = {}, {}, None, None
    else:
        base_id, previous_generation = saved.base_id, _contributions_digest(included)
    result = KeywordIndexResult([], [], [], previous_generation=previous_generation, rebuild_reason=reason,
                                dimension=dimension, previous_keyword_count=_keyword_count(base, delta))
    start = delta
    touched: set[str] = set()
    for doc_id in sorted(set(included) | set(hashes)):
        old, new = included.get(doc_id), hashes.get(doc_id)
        if old == new:
            continue
        if old is not None:
            contribution = pl.read_parquet(_contribution(files, doc_id, old))
            delta = _apply_document(base, delta, contribution, -1)
            touched.update(contribution["keyword"].to_list())
        if new is not None:
            stats = store.read(KEYWORD_STATS, doc_id)
            delta = _apply_document(base, delta, stats, +1)
            touched.update(stats["keyword"].to_list())
            files.write(_contribution(files, doc_id, new), stats)
        (result.updated if old is not None and new is not None else result.added if new is not None
         else result.removed).append(doc_id)
    # links are read for changed documents, and for any whose count an older index did not keep
    result.link_docs = sorted(set(result.added) | set(result.updated) | (set(current) - set(link_counts)))
    per_doc = {d: keyword_chunk_links(store, [d]) for d in result.link_docs}
    result.links = pl.concat(per_doc.values()) if per_doc else keyword_chunk_links(store, [])
    result.link_counts = {d: per_doc[d].height if d in per_doc else int(link_counts[d]) for d in current}
    result.docs_read = len(result.link_docs)
    crash_point(KEYWORD_INDEX)
    if base_id is None or base.height < KEYWORD_DELTA_MIN_BASE or delta.height > KEYWORD_DELTA_SHARE * base.height:
        folded = kw.apply_keyword_rows(base, delta) if delta.height else base
        _write_keyword_index(files, folded, hashes, result.link_counts)
        result.base, result.delta = folded, kw.empty_keyword_index(dimension)
    else:
        _write_keyword_delta(files, delta, base_id, hashes, result.link_counts)
        result.base, result.delta = base, delta
    keep = {_contribution(files, d, h).name for d, h in hashes.items()}
    for path in files.keyword_contrib.glob("*"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
    keys = pl.DataFrame({"keyword": sorted(touched)}, schema={"keyword": pl.String})
    before, after = _keyword_rows(base, start, keys), _keyword_rows(base, delta, keys)
    result.touched = _changed_keywords(before, after, touched)
    result.touched_rows = after.filter(pl.col("keyword").is_in(result.touched)).sort("keyword")
    was, now = set(before["keyword"].to_list()), set(after["keyword"].to_list())
    result.keywords_appeared, result.keywords_gone = sorted(now - was), sorted(was - now)
    result.keyword_count = result.previous_keyword_count + len(now - was) - len(was - now)
    result.generation = _contributions_digest(hashes)
    return result


# The delta is folded into a new base once it holds more rows than this share of the base's, and always while
# the base has fewer rows than KEYWORD_DELTA_MIN_BASE (rewriting a small base costs less than keeping a delta).
KEYWORD_DELTA_SHARE = 0.1
KEYWORD_DELTA_MIN_BASE = 20_000


def _keyword_delta_path(files: CorpusFiles) -> Path:
    return files.root / "keyword_index.delta.arrow"


def _keyword_rows(base: pl.DataFrame, delta: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """The index's rows (base with delta) of these keywords, those still in it: the delta's where it has them."""
    in_delta = delta.join(keys, on="keyword", how="semi")
    rest = keys.join(in_delta.select("keyword"), on="keyword", how="anti")
    return pl.concat([in_delta.filter(pl.col("sentence_count") > 0), base.join(rest, on="keyword", how="semi")])


def _apply_document(base: pl.DataFrame, delta: pl.DataFrame, stats: pl.DataFrame, sign: int) -> pl.DataFrame:
    """The delta with one document's stats added or subtracted: only its keywords' rows are read and made."""
    rows = kw.updated_keyword_rows(_keyword_rows(base, delta, stats.select("keyword")), stats, sign)
    return pl.concat([delta.join(rows.select("keyword"), on="keyword", how="anti"), rows]).sort("keyword")


def _keyword_count(base: pl.DataFrame, delta: pl.DataFrame) -> int:
    """Keywords in the index: the base's, less those the delta replaces, plus the delta's still there."""
    if not delta.height:
        return base.height
    replaced = delta.join(base.select("keyword"), on="keyword", how="semi").height
    return base.height - replaced + int((delta["sentence_count"] > 0).sum())


def _changed_keywords(before: pl.DataFrame, after: pl.DataFrame, touched: set[str]) -> list[str]:
    """Keywords of `after` among `touched` whose sum or count differs from `before` (or that are new):
    a document changed elsewhere subtracts and adds back the same sums for its other keywords."""
    pick = lambda frame: frame.filter(pl.col("keyword").is_in(sorted(touched)))  # noqa: E731
    joined = pick(after).join(pick(before), on="keyword", how="left", suffix="_before")
    differs = (pl.col("sentence_count_before").is_null() | (pl.col("sentence_count") != pl.col("sentence_count_before"))
               | (pl.col("vector_sum") != pl.col("vector_sum_before")))
    return sorted(joined.filter(differs)["keyword"].to_list())


# Arrow metadata keys of the keyword index: {doc_id: signature of the stats it includes} and
# {doc_id: number of keyword→chunk links} (in the delta when there is one, else in the base); the base's
# random id, which its delta names under KEYWORD_DELTA_OF.
KEYWORD_CONTRIBUTIONS = b"lexgraph.keyword_contributions"
KEYWORD_LINKS = b"lexgraph.keyword_links"
KEYWORD_BASE = b"lexgraph.keyword_base"
KEYWORD_DELTA_OF = b"lexgraph.keyword_delta_of"


def _stats_signature(path: Path) -> str:
    """Size and modification time of a stats file: cheap, and every write replaces the file."""
    stat = path.stat()
    return content_hash(f"{stat.st_size}|{stat.st_mtime_ns}")[:16]


def _contributions_digest(included: dict[str, str]) -> str:
    return content_hash(json.dumps(included, sort_keys=True))[:16]


def _contribution(files: CorpusFiles, doc_id: str, digest: str) -> Path:
    return files.keyword_contrib / f"{doc_id}.{digest}.parquet"


@dataclass
class SavedKeywords:
    """The saved keyword index: base rows, delta rows, and the list of what they include (None: not to be trusted)."""
    base: pl.DataFrame
    delta: pl.DataFrame
    included: dict[str, str] | None
    link_counts: dict[str, int]
    base_id: str | None = None  # None: no base, or one in a format before deltas (folded on the next update)
    reason: str | None = None  # why it is not to be trusted, when it was there


def _read_arrow(path: Path):
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _keyword_frame(table, dimension: int, what: str) -> pl.DataFrame:
    frame = pl.from_arrow(table.replace_schema_metadata(None))
    expected = kw.empty_keyword_index(dimension).schema
    if frame.schema != expected:
        if frame.height and "vector_sum" in frame.columns and isinstance(frame.schema["vector_sum"], pl.Array):
            raise ValueError(f"the {what} holds vectors of {frame.schema['vector_sum'].shape[0]} components, not {dimension}")
        if frame.height or set(frame.columns) != set(expected):
            raise ValueError(f"the {what} has columns {frame.schema}, not {expected}")
        frame = kw.empty_keyword_index(dimension)  # an empty index of another width: nothing to combine
    return frame


def _unreadable(error: BaseException) -> str:
    return f"unreadable ({(str(error).splitlines() or [type(error).__name__])[0][:120]})"


def _untrusted(dimension: int, reason: str | None) -> SavedKeywords:
    """Nothing to build on: the caller rebuilds, and says why (None: nothing had been saved)."""
    empty = kw.empty_keyword_index(dimension)
    return SavedKeywords(empty, empty, None, {}, reason=reason)


def _load_keyword_state(files: CorpusFiles, dimension: int) -> SavedKeywords:
    """The saved base and delta with the list of contributions they include; the list is None (with a reason,
    unless nothing was saved) when they cannot be trusted: the caller then rebuilds."""
    empty = kw.empty_keyword_index(dimension)
    delta_path = _keyword_delta_path(files)
    try:
        if files.keyword_index.exists() or not files.keyword_index_parquet.exists():
            table = _read_arrow(files.keyword_index)
        else:
            table = pq.read_table(files.keyword_index_parquet)  # the format before Arrow: folded on the next update
        listed = table.schema.metadata or {}
        included = json.loads(listed[KEYWORD_CONTRIBUTIONS]) if KEYWORD_CONTRIBUTIONS in listed else None
        link_counts = json.loads(listed[KEYWORD_LINKS]) if KEYWORD_LINKS in listed else {}
        base_id = listed[KEYWORD_BASE].decode() if KEYWORD_BASE in listed else None
        base = _keyword_frame(table, dimension, "keyword index")
    except FileNotFoundError:
        reason = "the keyword index is missing but its delta is there" if delta_path.exists() else None
        return _untrusted(dimension, reason)
    except (Exception, pl.exceptions.PanicException) as error:  # a damaged file is rebuilt, not trusted
        return _untrusted(dimension, f"the keyword index is unusable: {_unreadable(error)}")
    if included is None:
        return _untrusted(dimension, "the keyword index lists no contributions")
    try:
        delta_table = _read_arrow(delta_path)
    except FileNotFoundError:
        return SavedKeywords(base, empty, included, link_counts, base_id)
    except (Exception, pl.exceptions.PanicException) as error:
        return _untrusted(dimension, f"the keyword index delta is unusable: {_unreadable(error)}")
    listed = delta_table.schema.metadata or {}
    if base_id is None or listed.get(KEYWORD_DELTA_OF, b"").decode() != base_id:
        return SavedKeywords(base, empty, included, link_counts, base_id)  # left by a fold: its base holds it
    try:
        delta = _keyword_frame(delta_table, dimension, "keyword index delta")
        included = json.loads(listed[KEYWORD_CONTRIBUTIONS])
        link_counts = json.loads(listed[KEYWORD_LINKS])
        if not delta["keyword"].is_unique().all():
            raise ValueError("it lists a keyword twice")
    except (Exception, pl.exceptions.PanicException) as error:
        return _untrusted(dimension, f"the keyword index delta is unusable: {_unreadable(error)}")
    return SavedKeywords(base, delta.sort("keyword"), included, link_counts, base_id)


def _load_keyword_index(files: CorpusFiles, dimension: int) -> tuple[pl.DataFrame, dict[str, str] | None, dict[str, int]]:
    """The saved index (base with delta), the contributions it includes and each document's link count; None
    for the contributions when it cannot be trusted."""
    saved = _load_keyword_state(files, dimension)
    index = kw.apply_keyword_rows(saved.base, saved.delta) if saved.delta.height else saved.base
    return index, saved.included, saved.link_counts


def _arrow_write(path: Path, frame: pl.DataFrame, metadata: dict[bytes, bytes]) -> None:
    """Atomic write of an uncompressed Arrow IPC file with these schema metadata."""
    table = frame.to_arrow()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    partial.replace(path)


def _write_keyword_index(files: CorpusFiles, index: pl.DataFrame, included: dict[str, str],
                         link_counts: dict[str, int]) -> None:
    """Write the whole index as a new base (a new id), then delete the delta: until then the delta names the
    base before, so it is ignored."""
    _arrow_write(files.keyword_index, index,
                 {**_keyword_listing(included, link_counts), KEYWORD_BASE: uuid.uuid4().hex.encode()})
    _keyword_delta_path(files).unlink(missing_ok=True)
    files.keyword_index_parquet.unlink(missing_ok=True)  # the format before: the Arrow file replaces it


def _write_keyword_delta(files: CorpusFiles, delta: pl.DataFrame, base_id: str, included: dict[str, str],
                         link_counts: dict[str, int]) -> None:
    """Replace the delta: the rows that differ from the base `base_id` and the list of the whole index."""
    _arrow_write(_keyword_delta_path(files), delta,
                 {**_keyword_listing(included, link_counts), KEYWORD_DELTA_OF: base_id.encode()})


def _keyword_listing(included: dict[str, str], link_counts: dict[str, int]) -> dict[bytes, bytes]:
    """The metadata that makes a file the index's list: the contributions it includes, each document's links."""
    return {KEYWORD_CONTRIBUTIONS: json.dumps(included, sort_keys=True).encode(),
            KEYWORD_LINKS: json.dumps(link_counts, sort_keys=True).encode()}


def keyword_chunk_links(store: ExtractStore, doc_ids: list[str]) -> pl.DataFrame:
    """keyword→chunk edges of the given documents (keyword, chunk_id, sentence_count)."""
    frames = [store.read(KEYWORDS, d, query=kw.keyword_chunk_edges_query)
              for d in doc_ids if store.exists(KEYWORDS, d)]
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={"keyword": pl.String, "chunk_id": pl.String, "sentence_count": pl.Int32})


def write_keyword_index(files: CorpusFiles, store: ExtractStore, graph, vectors, result: KeywordIndexResult) -> dict:
    """Bring the graph's Keyword nodes and KEYWORD_IN edges and the LanceDB keyword vectors to `result`,
    writing only what changed: keywords that appeared or went, the links of added and changed documents,
    the vectors of keywords whose sums moved. Documents reloaded since (a reload deletes their chunks'
    links) are found by their link counts and written again. Everything is written instead when the
    stores are not known to hold the previous index (first build, a crash between the save and the
    writes), when more than a quarter of the documents changed (a restored backup with new file times, say)
    or when the counts disagree afterwards. Returns what was written, for run metadata."""
    synced = _read_json(files.keywords_synced).get("generation")
    figures = {"keywords_added": 0, "keywords_removed": 0, "keyword_links_written": 0, "keyword_links_deleted": 0,
               "keyword_vectors_written": 0, "keyword_vectors_deleted": 0, "keyword_docs_read": result.docs_read,
               "keywords_rewritten": False}
    if result.rebuild_reason is not None:
        figures["keyword_index_rebuilt"] = result.rebuild_reason
    changed = len(result.link_docs) + len(result.removed)
    if result.previous_generation is not None and synced == result.previous_generation \
            and not rewrite_is_cheaper(changed, len(result.link_counts) + len(result.removed)) \
            and _keyword_graph_diff(store, graph, result, figures) \
            and _keyword_vector_diff(vectors, result, figures):
        write_json(files.keywords_synced, {"generation": result.generation})
        return figures
    before_links, before_vectors = graph.count("KEYWORD_IN"), vectors.count("keywords")
    links = keyword_chunk_links(store, sorted(result.link_counts))
    graph.replace_keywords(result.index["keyword"], links)
    vectors.replace_keywords(kw.keyword_vectors(result.index))
    figures.update(keywords_added=result.index.height, keywords_removed=result.previous_keyword_count,
                   keyword_links_written=links.height, keyword_links_deleted=before_links,
                   keyword_vectors_written=result.index.height, keyword_vectors_deleted=before_vectors,
                   keyword_docs_read=len(result.link_counts), keywords_rewritten=True)
    write_json(files.keywords_synced, {"generation": result.generation})
    return figures


def _keyword_graph_diff(store: ExtractStore, graph, result: KeywordIndexResult, figures: dict) -> bool:
    """Write the graph's share of the difference; False when the graph does not add up afterwards."""
    deleted = graph.delete_keywords(result.keywords_gone)
    graph.add_keywords(result.keywords_appeared)
    deleted += graph.delete_keyword_links(result.link_docs + result.removed)
    graph.add_keyword_links(result.links)
    written = result.links.height
    expected = sum(result.link_counts.values())
    in_graph = graph.count("KEYWORD_IN")  # the whole table: the check is over every document's links
    if in_graph != expected:
        # documents reloaded since the last update lost their chunks' links: find them and write them again
        held = graph.keyword_links_per_document()
        short = sorted(d for d, n in result.link_counts.items() if held.get(d, 0) != n)
        graph.delete_keyword_links(short)
        again = keyword_chunk_links(store, short)
        graph.add_keyword_links(again)
        written += again.height
        figures["keyword_docs_read"] += len(short)
        figures["keyword_docs_restored"] = len(short)
        in_graph = graph.count("KEYWORD_IN")
    figures.update(keywords_added=len(result.keywords_appeared), keywords_removed=len(result.keywords_gone),
                   keyword_links_written=written, keyword_links_deleted=deleted)
    return in_graph == expected and graph.count("Keyword") == result.keyword_count


def _keyword_vector_diff(vectors, result: KeywordIndexResult, figures: dict) -> bool:
    """Upsert the vectors of keywords whose sums changed and delete those that went; False when the table
    is missing, of another width, or does not add up afterwards."""
    if vectors.keyword_dimension() != result.dimension:
        return False
    changed = result.touched_rows
    vectors.upsert_keywords(kw.keyword_vectors(changed), result.keywords_gone)
    figures.update(keyword_vectors_written=changed.height, keyword_vectors_deleted=len(result.keywords_gone))
    return vectors.count("keywords") == result.keyword_count
