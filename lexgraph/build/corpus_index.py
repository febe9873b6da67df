"""Corpus-wide KET-RAG indexing kept current incrementally: chunk KNN graph, PageRank, β-skeleton,
and the keyword index. State lives as Parquet under the index version's `corpus/` folder, so each
update starts from the previous one and touches only what added or removed chunks affect.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from lexgraph.extract import keywords as kw
from lexgraph.faults import KEYWORD_INDEX, crash_point
from lexgraph.ids import content_hash
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.build.knn import DEFAULT_K, KnnGraph, KnnUpdate, lexical_knn, semantic_knn
from lexgraph.build.pagerank import pagerank
from lexgraph.build.pipeline import ENTITIES, FACTS, KEYWORD_STATS, KEYWORDS, RELATIONS, STATEMENTS, TOPICS
from lexgraph.build.skeleton import DEFAULT_BETA, SelectionDiff, select_skeleton, selection_diff, skeleton_size

# Exact neighbours up to this many chunks (incremental == rebuild); HNSW candidates beyond it.
EXACT_KNN_LIMIT = 20_000


def knn_mode(requested: str, n_chunks: int) -> str:
    if requested not in ("auto", "exact", "approx"):
        raise ValueError(f"knn mode must be auto, exact or approx, got {requested!r}")
    if requested != "auto":
        return requested
    return "exact" if n_chunks <= EXACT_KNN_LIMIT else "approx"


# The corpus assets, in the order the corpus job runs them; each records the catalog it was built from.
CORPUS_STEPS = ("chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "lexical_graph")
# The step that loads the lexical graph; re-extraction without a catalog change makes only it out of step.
LEXICAL_GRAPH = "lexical_graph"
LEXICAL_TABLES = (STATEMENTS, TOPICS, FACTS, ENTITIES, RELATIONS)


# Prefix of a recorded digest whose documents were reloaded since (their corpus edges went with them).
RELOADED = "reloaded:"


# Key suffix, in built_from.json, of the settings a step was built with.
WITH = "@settings"


def step_settings(step: str, settings) -> str:
    """The settings a corpus step's output depends on: changing one makes that step out of step, so
    `lexgraph ingest` and the corpus sensor rebuild it (the catalog alone would not show the change)."""
    knn = f"knn_k={settings.knn_k} knn_mode={settings.knn_mode}"
    return {"chunk_knn_graph": knn, "chunk_pagerank": knn, "skeleton_selection": f"{knn} beta={settings.beta}"}.get(step, "")


def catalog_digest(indexed: dict[str, str]) -> str:
    """One hash of the indexed state (doc_id -> content hash of every document in the catalog)."""
    return content_hash("\n".join(f"{doc}={digest}" for doc, digest in sorted(indexed.items())))


class CorpusFiles:
    """Paths of the corpus-wide state of one index version."""

    def __init__(self, index_dir: str | Path):
        self.root = Path(index_dir) / "corpus"
        self.knn_corpus = self.root / "knn_corpus.parquet"  # chunk_id, doc_id, vector, words
        self.knn_state = self.root / "knn_state.parquet"  # directed top-K lists, both kinds
        self.edges = self.root / "knn_edges.parquet"
        self.pagerank = self.root / "pagerank.parquet"
        self.skeleton = self.root / "skeleton.parquet"
        self.skeleton_diff = self.root / "skeleton_diff.json"
        self.keyword_index = self.root / "keyword_index.parquet"
        self.keyword_contrib = self.root / "keyword_contrib"  # each document's stats as added
        self.built_from = self.root / "built_from.json"  # step -> catalog digest it was built from
        self.entity_merges = self.root / "entity_merges.parquet"  # every surface form folded into an entity, and why
        self.reextracted = self.root / "reextracted.json"  # the selection diff whose re-extraction is done
        self.lexical_inputs = self.root / "lexical_inputs.json"  # the lexical tables the lexical graph was built from

    def record_built(self, step: str, digest: str, settings) -> None:
        """Written last by each corpus step, so a crash before it leaves the step out of date."""
        built = self._read_built()
        built[step] = digest
        built[step + WITH] = step_settings(step, settings)
        self._write_built(built)

    def _write_built(self, built: dict[str, str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.built_from.with_suffix(".tmp")
        partial.write_text(json.dumps(built, indent=1, sort_keys=True))
        partial.replace(self.built_from)

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
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.lexical_inputs.with_suffix(".tmp")
        partial.write_text(json.dumps({"digest": digest}))
        partial.replace(self.lexical_inputs)

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

    def write_arrow(self, path: Path, table) -> None:
        """Atomic write of an Arrow table, keeping its schema metadata."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        pq.write_table(table, partial)
        partial.replace(path)


@dataclass
class KnnResult:
    edges: pl.DataFrame
    chunks: pl.DataFrame  # chunk_id, doc_id of the current corpus
    semantic: KnnUpdate | None
    lexical: KnnUpdate | None
    rebuilt: bool


def chunk_words(store: ExtractStore, chunk_ids: pl.Series) -> pl.DataFrame:
    """Each chunk's distinct keywords (content words and proper-noun phrases), for the lexical kind."""
    scan = store.scan(KEYWORDS)
    empty = pl.DataFrame({"chunk_id": chunk_ids}).with_columns(pl.lit([], dtype=pl.List(pl.String)).alias("words"))
    if scan is None:
        return empty
    words = (scan.select("chunk_id", "keyword").unique().group_by("chunk_id")
             .agg(pl.col("keyword").sort().alias("words")).collect())
    return (pl.DataFrame({"chunk_id": chunk_ids}).join(words, on="chunk_id", how="left")
            .with_columns(pl.col("words").fill_null(pl.lit([], dtype=pl.List(pl.String)))))


def update_knn(files: CorpusFiles, chunks: pl.DataFrame, vectors: np.ndarray, words: pl.DataFrame,
               k: int = DEFAULT_K, mode: str = "exact") -> KnnResult:
    """Bring the KNN graphs from the saved corpus to `chunks` by removing and adding chunks only.

    chunks: chunk_id, doc_id aligned with `vectors` rows and `words` rows.
    A change of k or mode, or missing state, rebuilds from scratch.
    """
    words = chunks.select("chunk_id").join(words, on="chunk_id", how="left")
    current = chunks.with_columns(pl.Series("vector", vectors, dtype=pl.Array(pl.Float32, vectors.shape[1])),
                                  words["words"].fill_null(pl.lit([], dtype=pl.List(pl.String))).alias("words"))
    previous, state, settings = _load_knn(files)
    if previous is None or settings != {"k": k, "mode": mode}:
        semantic = semantic_knn(current["chunk_id"].to_list(), vectors, k, mode=mode)
        lexical = lexical_knn(current["chunk_id"].to_list(), current["words"].to_list(), k)
        result = KnnResult(pl.DataFrame(), chunks, None, None, rebuilt=True)
    else:
        semantic = semantic_knn(previous["chunk_id"].to_list(), _matrix(previous), k, mode=mode, state=state)
        lexical = lexical_knn(previous["chunk_id"].to_list(), previous["words"].to_list(), k, state=state)
        gone = previous.join(current, on="chunk_id", how="anti")["chunk_id"].to_list()
        new = current.join(previous, on="chunk_id", how="anti")
        sem_updates = [semantic.remove(gone)] if gone else []
        lex_updates = [lexical.remove(gone)] if gone else []
        if new.height:
            sem_updates.append(semantic.add(new["chunk_id"].to_list(), _matrix(new)))
            lex_updates.append(lexical.add(new["chunk_id"].to_list(), new["words"].to_list()))
        result = KnnResult(pl.DataFrame(), chunks, _merge(sem_updates), _merge(lex_updates), rebuilt=False)
    result.edges = pl.concat([semantic.edges(), lexical.edges()])
    _save_knn(files, current, semantic, lexical, {"k": k, "mode": mode})
    files.write(files.edges, result.edges)
    return result


def _matrix(frame: pl.DataFrame) -> np.ndarray:
    return frame["vector"].to_numpy().astype(np.float32, copy=False)


def _merge(updates: list[KnnUpdate]) -> KnnUpdate:
    return KnnUpdate(*(sum(getattr(u, name) for u in updates) for name in ("added", "removed", "recomputed", "changed")))


def _load_knn(files: CorpusFiles) -> tuple[pl.DataFrame | None, pl.DataFrame | None, dict]:
    """The saved corpus and lists; nothing (so a rebuild) unless both files are whole and of one save."""
    try:
        generations = {_generation(files.knn_state), _generation(files.knn_corpus)}
        state = pl.read_parquet(files.knn_state)
        corpus = pl.read_parquet(files.knn_corpus)
    except FileNotFoundError:
        return None, None, {}
    except (Exception, pl.exceptions.PanicException):  # a damaged file: rebuild rather than trust it
        return None, None, {}
    if len(generations) != 1 or None in generations:
        return None, None, {}  # killed between writing the two files: they do not belong together
    settings = json.loads(corpus.select(pl.col("settings").first()).item()) if corpus.height else {}
    return corpus.drop("settings"), state, settings


# Parquet metadata key shared by the two KNN files of one save.
KNN_GENERATION = b"lexgraph.knn_generation"


def _generation(path: Path) -> str | None:
    value = (pq.read_schema(path).metadata or {}).get(KNN_GENERATION)
    return value.decode() if value else None


def _save_knn(files: CorpusFiles, current: pl.DataFrame, semantic: KnnGraph, lexical: KnnGraph, settings: dict) -> None:
    """Two files, one save: both carry the same generation, so a pair torn by a crash is recognised."""
    generation = uuid.uuid4().hex.encode()
    for path, frame in ((files.knn_state, pl.concat([semantic.state_frame(), lexical.state_frame()])),
                        (files.knn_corpus, current.with_columns(pl.lit(json.dumps(settings)).alias("settings")))):
        table = frame.to_arrow()
        files.write_arrow(path, table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                              KNN_GENERATION: generation}))


def compute_pagerank(files: CorpusFiles, chunks: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """PageRank over both kinds of similarity edge; chunk_id, doc_id, pagerank."""
    scores = pagerank(chunks["chunk_id"], edges["src"], edges["dst"], edges["weight"])
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
    chosen = set(select_skeleton(ranks["chunk_id"].to_numpy(), ranks["pagerank"].to_numpy(), beta).tolist())
    previous = (pl.read_parquet(files.skeleton).filter("selected")["chunk_id"].to_list()
                if files.skeleton.exists() else [])
    selection = ranks.with_columns(pl.col("chunk_id").is_in(list(chosen)).alias("selected"))
    diff = selection_diff(previous, chosen, dict(zip(ranks["chunk_id"], ranks["doc_id"])))
    # The diff first: killed between the two writes, the next update diffs against the same previous
    # selection and publishes the same diff again.
    partial = files.skeleton_diff.with_suffix(".tmp")
    partial.write_text(json.dumps({"beta": beta, **diff.to_dict()}, indent=1))
    partial.replace(files.skeleton_diff)
    files.write(files.skeleton, selection)
    coverage = (selection.group_by("doc_id").agg(pl.len().alias("chunks"), pl.col("selected").sum().alias("selected"))
                .with_columns((pl.col("selected") / pl.col("chunks")).alias("share")).sort("doc_id"))
    return SkeletonResult(selection, diff, skeleton_size(ranks.height, beta), coverage)


def read_selection_diff(files: CorpusFiles) -> dict:
    """The last published selection diff, for downstream re-extraction."""
    return json.loads(files.skeleton_diff.read_text()) if files.skeleton_diff.exists() else {}


@dataclass
class KeywordIndexResult:
    index: pl.DataFrame  # keyword, vector_sum, sentence_count
    added: list[str]
    removed: list[str]
    updated: list[str]


def update_keyword_index(files: CorpusFiles, store: ExtractStore, doc_ids: list[str], dimension: int) -> KeywordIndexResult:
    """Add the stats of new or changed documents and subtract those of changed or removed ones.

    Each document's stats are kept as they were added (keyword_contrib/<doc>.<hash>.parquet), so a
    removed document can be subtracted after its own files are gone. Crash-safe and idempotent: the
    index file lists the contributions it holds (in its Parquet metadata) and is replaced atomically,
    contributions are written before it and deleted only after it, so a process killed anywhere leaves
    an index that agrees with its list, and the next update does exactly what is still missing.
    """
    current = sorted(set(doc_ids) & set(store.doc_ids(KEYWORD_STATS)))
    hashes = {d: _file_hash(store.path(KEYWORD_STATS, d)) for d in current}
    index, included = _load_keyword_index(files, dimension)
    if included is None or any(included[d] != hashes.get(d) and not _contribution(files, d, included[d]).exists()
                               for d in included):
        # no index, an index without its list, or a contribution to subtract is gone: start over
        index, included = kw.empty_keyword_index(dimension), {}
    added, removed, updated = [], [], []
    for doc_id in sorted(set(included) | set(hashes)):
        old, new = included.get(doc_id), hashes.get(doc_id)
        if old == new:
            continue
        if old is not None:
            index = kw.subtract_keyword_stats(index, pl.read_parquet(_contribution(files, doc_id, old)))
        if new is not None:
            stats = store.read(KEYWORD_STATS, doc_id)
            index = kw.add_keyword_stats(index, stats)
            files.write(_contribution(files, doc_id, new), stats)
        (updated if old is not None and new is not None else added if new is not None else removed).append(doc_id)
    crash_point(KEYWORD_INDEX)
    _write_keyword_index(files, index, hashes)
    keep = {_contribution(files, d, h).name for d, h in hashes.items()}
    for path in files.keyword_contrib.glob("*"):
        if path.name not in keep:
            path.unlink(missing_ok=True)
    return KeywordIndexResult(index, added, removed, updated)


# Parquet metadata key of the keyword index: {doc_id: hash of the stats it includes}.
KEYWORD_CONTRIBUTIONS = b"lexgraph.keyword_contributions"


def _file_hash(path: Path) -> str:
    return content_hash(path.read_bytes())[:16]


def _contribution(files: CorpusFiles, doc_id: str, digest: str) -> Path:
    return files.keyword_contrib / f"{doc_id}.{digest}.parquet"


def _load_keyword_index(files: CorpusFiles, dimension: int) -> tuple[pl.DataFrame, dict[str, str] | None]:
    """The saved index and the contributions it includes; None for those when it cannot be trusted."""
    try:
        listed = pq.read_schema(files.keyword_index).metadata or {}
        included = json.loads(listed[KEYWORD_CONTRIBUTIONS]) if KEYWORD_CONTRIBUTIONS in listed else None
        index = pl.read_parquet(files.keyword_index)
    except FileNotFoundError:
        return kw.empty_keyword_index(dimension), None
    except (Exception, pl.exceptions.PanicException):  # a damaged file is rebuilt, not trusted
        return kw.empty_keyword_index(dimension), None
    if included is not None and index.height and index["vector_sum"].dtype.shape[0] != dimension:
        included = None  # another embedding width: the sums cannot be combined
    return index, included


def _write_keyword_index(files: CorpusFiles, index: pl.DataFrame, included: dict[str, str]) -> None:
    table = index.to_arrow()
    files.write_arrow(files.keyword_index, table.replace_schema_metadata(
        {**(table.schema.metadata or {}), KEYWORD_CONTRIBUTIONS: json.dumps(included, sort_keys=True).encode()}))


def keyword_chunk_links(store: ExtractStore, doc_ids: list[str]) -> pl.DataFrame:
    """keyword→chunk edges of the given documents (keyword, chunk_id, sentence_count)."""
    frames = [kw.keyword_chunk_edges(store.read(KEYWORDS, d)) for d in doc_ids if store.exists(KEYWORDS, d)]
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={"keyword": pl.String, "chunk_id": pl.String, "sentence_count": pl.Int32})
