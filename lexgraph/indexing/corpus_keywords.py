"""The keyword_index step: the corpus keyword index (each keyword's vector sum and sentence count over every
document) kept current by adding and subtracting documents' stats, saved as a base and a delta, and
written to the graph's Keyword nodes and KEYWORD_IN edges and LanceDB's keyword vectors by their
difference.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from lexgraph.atomic_json import write_json
from lexgraph.extract import keywords as kw
from lexgraph.faults import KEYWORD_INDEX, crash_point
from lexgraph.ids import content_hash
from lexgraph.indexing.corpus_state import CorpusFiles, read_json, unreadable
from lexgraph.indexing.lexical_diff import rewrite_is_cheaper
from lexgraph.indexing.pipeline import KEYWORD_STATS, KEYWORDS
from lexgraph.storage.extract_store import ExtractStore

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
    _record_touched(result, base, start, delta, touched)
    result.generation = _contributions_digest(hashes)
    return result


def _record_touched(result: KeywordIndexResult, base: pl.DataFrame, start: pl.DataFrame, delta: pl.DataFrame,
                    touched: set[str]) -> None:
    """What the update changed among the keywords its documents touched (from the delta it started with,
    `start`, to `delta`): the keywords whose rows moved, those that appeared or went, and the count after."""
    keys = pl.DataFrame({"keyword": sorted(touched)}, schema={"keyword": pl.String})
    before, after = _keyword_rows(base, start, keys), _keyword_rows(base, delta, keys)
    result.touched = _changed_keywords(before, after, touched)
    result.touched_rows = after.filter(pl.col("keyword").is_in(result.touched)).sort("keyword")
    was, now = set(before["keyword"].to_list()), set(after["keyword"].to_list())
    result.keywords_appeared, result.keywords_gone = sorted(now - was), sorted(was - now)
    result.keyword_count = result.previous_keyword_count + len(now - was) - len(was - now)


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
        return _untrusted(dimension, f"the keyword index is unusable: {unreadable(error)}")
    if included is None:
        return _untrusted(dimension, "the keyword index lists no contributions")
    try:
        delta_table = _read_arrow(delta_path)
    except FileNotFoundError:
        return SavedKeywords(base, empty, included, link_counts, base_id)
    except (Exception, pl.exceptions.PanicException) as error:
        return _untrusted(dimension, f"the keyword index delta is unusable: {unreadable(error)}")
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
        return _untrusted(dimension, f"the keyword index delta is unusable: {unreadable(error)}")
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
    synced = read_json(files.keywords_synced).get("generation")
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
