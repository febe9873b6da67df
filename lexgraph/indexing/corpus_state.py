"""The corpus index's state: where its files are (:class:`CorpusFiles`), the corpus steps, and which of them
are out of step with the catalog and the settings.

The corpus-wide KET-RAG index (chunk KNN graph, PageRank, β-skeleton, keyword index, search indexes,
lexical graph) is kept current incrementally. Its state lives under the index version's `corpus/` folder,
so each update starts from the previous one and touches only what added or removed chunks affect. Each
step records, as its last action, the catalog digest and the settings it was built from
(:meth:`CorpusFiles.record_built`); what the corpus sensor and `lexgraph ingest` compare
(:meth:`CorpusFiles.stale_steps`).

The steps: :mod:`~lexgraph.indexing.knn_update` (chunk_knn_graph, its files in
:mod:`~lexgraph.indexing.knn_state`), :mod:`~lexgraph.indexing.corpus_skeleton` (chunk_pagerank,
skeleton_selection), :mod:`~lexgraph.indexing.corpus_keywords` (keyword_index); their inputs read ahead by
:mod:`~lexgraph.indexing.corpus_prefetch`.
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from lexgraph.atomic_json import write_json
from lexgraph.ids import content_hash
from lexgraph.indexing.pipeline import ENTITIES, FACTS, RELATIONS, STATEMENTS, TOPICS

# The corpus assets, in the order the corpus job runs them; each records the catalog it was built from.
CORPUS_STEPS = ("chunk_knn_graph", "chunk_pagerank", "skeleton_selection", "keyword_index", "search_indexes",
                "lexical_graph", "graph_tables")
# The step that loads the lexical graph; re-extraction without a catalog change makes only it out of step.
LEXICAL_GRAPH = "lexical_graph"
# LanceDB's search indexes; a changed LEXGRAPH_LANCE_THRESHOLD or query backend makes only it out of step.
SEARCH_INDEXES = "search_indexes"
# The lexical graph as LanceDB tables for the lance query backend (lexgraph.query.lance_graph_tables); it follows
# the lexical graph and the search settings.
GRAPH_TABLES = "graph_tables"
GRAPH_TABLES_FORMAT = 3  # the tables' layout: tables of another format are rewritten by the next corpus run
# Steps nothing else reads: when only they are out of step, they run alone (not the whole corpus job).
SOLO_STEPS = (SEARCH_INDEXES, LEXICAL_GRAPH, GRAPH_TABLES)
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
    # full_text=terms: the full-text index over search_text (lexgraph.terms); an index built over the raw text
    # before is out of step, so the next ingest rebuilds it
    return {"chunk_knn_graph": knn, "chunk_pagerank": knn, "skeleton_selection": f"{knn} beta={settings.beta}",
            SEARCH_INDEXES: f"{search} full_text=terms", GRAPH_TABLES: search}.get(step, "")


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
        self.graph_tables = self.root / "graph_tables.json"  # the lexical graph the lance graph tables hold
        self.entity_merges = self.root / "entity_merges.parquet"  # every surface form folded into an entity, and why
        self.reextracted = self.root / "reextracted.json"  # the selection diff whose re-extraction is done
        self.lexical_inputs = self.root / "lexical_inputs.json"  # the lexical tables the lexical graph was built from
        self.lexical_changes = self.root / "lexical_changes.json"  # the documents the last lexical build rewrote
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
        if GRAPH_TABLES not in stale and (LEXICAL_GRAPH in stale or self._graph_tables_behind()):
            stale.append(GRAPH_TABLES)  # written from another lexical graph than the one built last
        return stale

    def _graph_tables_behind(self) -> bool:
        """The graph tables were written (the lance backend's) from a lexical graph built before the last one."""
        state = read_json(self.graph_tables)
        return bool(state) and (state.get("format") != GRAPH_TABLES_FORMAT
                                or state.get("lexical_inputs") != self.recorded_lexical_inputs())

    def write(self, path: Path, frame: pl.DataFrame) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        frame.write_parquet(partial)
        partial.replace(path)


def read_json(path: Path) -> dict:
    """A JSON record of the corpus state; {} when it is missing, unreadable or not an object."""
    try:
        found = json.loads(path.read_text())
        return found if isinstance(found, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def unreadable(error: BaseException) -> str:
    """Why a saved file was refused, in a few words: the first line of the error reading it."""
    return f"unreadable ({(str(error).splitlines() or [type(error).__name__])[0][:120]})"
