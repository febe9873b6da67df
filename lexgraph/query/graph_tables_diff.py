"""The graph tables (lexgraph.query.lance_graph_tables) kept current by difference.

When the lexical graph was last updated by difference (lexical_diff) from the graph the tables hold, only what the
rewritten documents touch is written again (corpus/lexical_changes.json names them, and the entities the diff
added, removed or changed):

- their statements are deleted and their new ones added under new row numbers; their topics and bridging nodes
  lose the old statements and gain the new (a node or topic left with none is deleted);
- their mention and relation rows are replaced, and every entity they name, before or after, is made again from
  all its mention and relation rows (lance_graph_tables.entity_link_rows, as a whole write makes it);
- the names table loses the rewritten documents' surface forms and the changed entities' names, and gains the new.

A rewritten document's chunks belong to it alone, so the counts a query needs (an entity's chunks, a node's
statements and chunks) change by what leaves and what comes. The corpus figures (chunks, statements, the smallest
counts, the bridging pairs) are recorded again; the idfs are computed from them at query time.

The new rows are read as the memory graph reads them (graph_channels), over the rewritten documents' chunks, with
their names' splits by type taken from every document's entity rows (the lexical graph's saved state), as a whole
load resolves them. Anything the diff cannot follow (another format, a lexical rebuild, a lexical graph the tables
do not hold, too many documents) makes the caller write the tables whole; so does an error, after the tables were
marked as being written (a crash in between makes the next run write them whole).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from lexgraph.faults import GRAPH_TABLES_DIFF, crash_point
from lexgraph.indexing.corpus_state import CorpusFiles, read_json
from lexgraph.indexing.lexical_diff import rewrite_is_cheaper
from lexgraph.indexing.lexical_state import KEY, saved_rows
from lexgraph.indexing.pipeline import ENTITIES as ENTITY_ROWS
from lexgraph.query import graph_channels
from lexgraph.query import lance_graph_tables as gt
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.vector_store import CHUNKS, ENTITIES, VectorStore, _in_list

IN_BATCH = 500  # values per IN list


def try_diff(files: CorpusFiles, store: VectorStore, extract: ExtractStore, state: dict,
             lexical_inputs: str | None) -> tuple[dict | None, str]:
    """The tables updated by difference -> (the figures to record, ""), or (None, why they must be written whole)."""
    if not state:
        return None, "no graph tables of this format"
    if state.get("member_cap") != gt.MEMBER_CAP:
        return None, "the tables were written with another member cap"
    if any(name not in store.table_names() for name in (gt.GRAPH_ENTITIES, gt.GRAPH_STATEMENTS)):
        return None, "a graph table is missing"
    chunks = store.count(CHUNKS)
    if state.get("lexical_inputs") == lexical_inputs and lexical_inputs is not None:
        return {**_figures(state), "chunks": chunks}, ""  # the lexical graph did not change: only the corpus size
    changes = read_json(files.lexical_changes)
    if changes.get("mode") != "diff" or changes.get("to") != lexical_inputs:
        return None, "the lexical graph was rebuilt, or its changes are not recorded"
    if changes.get("from") != state.get("lexical_inputs"):
        return None, "the tables hold another lexical graph than the one the last lexical diff started from"
    documents = list(changes.get("documents") or [])
    total = len(store.indexed_hashes())
    if rewrite_is_cheaper(len(documents), max(total, 1)):
        return None, f"{len(documents)} of {total} documents changed: writing whole is cheaper"
    gt.mark_writing(files, state)
    try:
        return TableDiff(store, extract, files, state, documents, changes.get("entities") or {}).run(chunks), ""
    except Exception as error:  # noqa: BLE001 - the tables are marked as being written: the caller writes them whole
        return None, f"the diff failed ({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''})"


def _figures(state: dict) -> dict:
    keys = ("chunks", "statements", "entity_df_min", "link_df_min", "bridge_pairs", "entity_mentions",
            "entity_relations", "next", "counts")
    return {k: state[k] for k in keys}


def _where(column: str, values: list) -> str:
    if isinstance(values[0], str):
        return _in_list(column, values)
    return f"{column} IN ({', '.join(str(int(v)) for v in values)})"


def _batches(values: list, size: int = IN_BATCH):
    for start in range(0, len(values), size):
        yield values[start:start + size]


class TableDiff:
    """One update of the graph tables by difference (see the module's doc)."""

    def __init__(self, store: VectorStore, extract: ExtractStore, files: CorpusFiles, state: dict,
                 documents: list[str], entities: dict):
        self.store, self.extract, self.files = store, extract, files
        self.figures = _figures(state)
        self.next = dict(state["next"])
        self.documents = documents
        self.entity_changes = {k: list(entities.get(k) or []) for k in ("gone", "new", "updated")}

    # --- reading ------------------------------------------------------------------------------------------------

    def _table(self, name: str):
        return self.store.db.open_table(name) if name in self.store.table_names() else None

    def _read(self, name: str, column: str, values: list, columns: list[str], row_ids: bool = False) -> pl.DataFrame:
        """Rows of a table whose `column` is one of `values` (batched IN lists); with LanceDB's _rowid when asked."""
        table = self._table(name)
        parts = []
        if table is not None:
            for part in _batches(sorted(set(values), key=str)):
                query = table.search().where(_where(column, part)).select(columns).limit(None)
                parts.append(pl.from_arrow((query.with_row_id(True) if row_ids else query).to_arrow()))
        return pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame()

    def _delete(self, name: str, column: str, values: list, extra: str = "") -> None:
        table = self._table(name)
        if table is None:
            return
        for part in _batches(sorted(set(values), key=str)):
            table.delete(extra + _where(column, part))

    def _add(self, name: str, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        table = self._table(name)
        if table is None:
            gt._write(self.store, name, frame, vectors=name in (gt.GRAPH_ENTITIES, gt.GRAPH_STATEMENTS))
        else:
            table.add(gt.to_arrow(frame.select(table.schema.names)))

    def _allocate(self, kind: str, count: int) -> np.ndarray:
        rows = np.arange(self.next[kind], self.next[kind] + count, dtype=np.int64)
        self.next[kind] += count
        return rows

    # --- the update ---------------------------------------------------------------------------------------------

    def run(self, chunks: int) -> dict:
        frame = self.store.scan(CHUNKS, ["chunk_id", "doc_id"], _in_list("doc_id", self.documents)) \
            if self.documents else pl.DataFrame(schema={"chunk_id": pl.Utf8, "doc_id": pl.Utf8})
        self.doc_of = dict(zip(frame["chunk_id"].to_list(), frame["doc_id"].to_list()))
        present = sorted(set(self.doc_of.values()))
        position = {c: i for i, c in enumerate(self.doc_of)}
        mentions = None
        if present:
            raw = graph_channels._extract_table(self.extract, "entities", graph_channels.MENTION_COLUMNS,
                                                list(position), present)
            mentions = graph_channels.resolved_mentions(raw, self._senses(raw))
        if self.documents:
            self._statements(graph_channels._load_statements(self.store, self.extract, position, mentions, present)
                             if present else None)
            crash_point(GRAPH_TABLES_DIFF)
            self._entities(mentions, present, position)
        self.figures["chunks"] = chunks
        self.figures["next"] = self.next
        self.figures["counts"] = {name: self._table(name).count_rows() for name in gt.GRAPH_TABLE_NAMES
                                  if self._table(name) is not None}
        self.figures["statements"] = self.figures["counts"].get(gt.GRAPH_STATEMENTS, 0)
        self.figures["entity_mentions"] = self.figures["counts"].get(gt.GRAPH_MENTIONS, 0)
        self.figures["entity_relations"] = self.figures["counts"].get(gt.GRAPH_RELATIONS, 0)
        self.figures["entity_df_min"] = self._min(gt.GRAPH_ENTITIES, "chunk_count")
        self.figures["link_df_min"] = self._min(gt.GRAPH_LINKS, "member_count")
        return self.figures

    def _min(self, name: str, column: str) -> int:
        values = self.store.scan(name, [column]) if name in self.store.table_names() else pl.DataFrame()
        return max(1, int(values[column].min())) if values.height else 1

    def _senses(self, raw: pl.DataFrame | None):
        """The splits by type of the names these rows hold, from every document's rows of those names (as a whole
        load resolves them); None (from these rows alone) without a saved lexical state."""
        from lexgraph.indexing.entity_resolution import entity_senses
        from lexgraph.indexing.name_keys import normalise_entity_name

        rows = saved_rows(self.files.lexical_state, ENTITY_ROWS)
        if raw is None or rows is None:
            return None
        keys = {normalise_entity_name(n) for n in raw["entity_name"].drop_nulls().unique().to_list()}
        every = rows.filter(pl.col(KEY).is_in(list(keys))).select(graph_channels.MENTION_COLUMNS).unique()
        return entity_senses(every)

    # statements, topics and bridging nodes

    def _statements(self, graph) -> None:
        old = self._read(gt.GRAPH_STATEMENTS, "doc_id", self.documents, ["row", "topic_row", "links", "chunk_id"])
        removed_links, removed_topics = [], []
        if old.height:
            exploded = old.select("row", "chunk_id", "links").explode("links").drop_nulls("links")
            removed_links = exploded.select(pl.col("links").alias("member_of"), "row", "chunk_id")
            removed_topics = old.select(pl.col("topic_row").alias("member_of"), "row", "chunk_id")
        added_links = added_topics = None
        new = pl.DataFrame()
        if graph is not None and graph.size:
            rows = self._allocate("statement", graph.size)
            node_rows = self._keyed_rows(gt.GRAPH_LINKS, "node_id", "node", graph.link_ids, "node")
            topic_rows = self._keyed_rows(gt.GRAPH_TOPICS, "topic_id", "topic_row", graph.topic_ids, "topic")
            chunk_ids = list(self.doc_of)
            statement_chunks = [chunk_ids[r] for r in graph.chunk_rows]
            links = [node_rows[gt._rows_of(graph.links, s)].tolist() for s in range(graph.size)]
            new = gt.statement_frame(graph, np.arange(graph.size), rows, topic_rows[graph.topic], statement_chunks,
                                     [self.doc_of[c] for c in statement_chunks], links)
            added_links = new.select("row", "chunk_id", "links").explode("links").drop_nulls("links") \
                .select(pl.col("links").alias("member_of"), "row", "chunk_id")
            added_topics = new.select(pl.col("topic_row").alias("member_of"), "row", "chunk_id")
            self.new_node_ids = dict(zip(node_rows.tolist(), graph.link_ids))
            self.new_topic_ids = dict(zip(topic_rows.tolist(), graph.topic_ids))
        else:
            self.new_node_ids, self.new_topic_ids = {}, {}
        self._delete(gt.GRAPH_STATEMENTS, "doc_id", self.documents)
        self._add(gt.GRAPH_STATEMENTS, new)
        self._members(gt.GRAPH_LINKS, "node", "node_id", removed_links, added_links, self.new_node_ids, "links")
        self._members(gt.GRAPH_TOPICS, "topic_row", "topic_id", removed_topics, added_topics, self.new_topic_ids,
                      "topic_row")

    def _keyed_rows(self, name: str, id_column: str, row_column: str, ids: list[str], kind: str) -> np.ndarray:
        """The row of each id: its row in the table, or a new one."""
        found = self._read(name, id_column, ids, [id_column, row_column]) if ids else pl.DataFrame()
        known = dict(zip(found[id_column].to_list(), found[row_column].to_list())) if found.height else {}
        missing = [i for i in ids if i not in known]
        known.update(zip(missing, self._allocate(kind, len(missing)).tolist()))
        return np.array([known[i] for i in ids], dtype=np.int64)

    def _members(self, name: str, row_column: str, id_column: str, removed, added, new_ids: dict[int, str],
                 statement_column: str) -> None:
        """A node's or topic's members: the old minus the removed statements, plus the added (a hub past MEMBER_CAP
        read again from the statements table when it falls back under it); its chunk count (nodes) likewise."""
        parts = [f for f in (removed, added) if isinstance(f, pl.DataFrame) and f.height]
        if not parts:
            return
        affected = sorted(set(pl.concat([p.select("member_of") for p in parts])["member_of"].to_list()))
        columns = [row_column, id_column, "members", "member_count"] + (["chunk_count"] if name == gt.GRAPH_LINKS else [])
        old = self._read(name, row_column, affected, columns)
        old_of = {r[row_column]: r for r in old.iter_rows(named=True)} if old.height else {}

        def grouped(frame):
            if not isinstance(frame, pl.DataFrame) or not frame.height:
                return {}
            return {m: (set(rows), len(set(chunks))) for m, rows, chunks in frame.group_by("member_of").agg(
                pl.col("row"), pl.col("chunk_id")).iter_rows()}

        gone, come = grouped(removed), grouped(added)
        out, hubs = [], []
        for member_of in affected:
            before = old_of.get(member_of)
            if before is None and member_of not in new_ids:
                continue  # a row the table does not hold: nothing to take from
            lost, lost_chunks = gone.get(member_of, (set(), 0))
            got, got_chunks = come.get(member_of, (set(), 0))
            count = (before["member_count"] if before else 0) - len(lost) + len(got)
            if name == gt.GRAPH_LINKS:  # the node's chunk pairs, before and after (none when it is deleted)
                was = before["chunk_count"] if before else 0
                now = was - lost_chunks + got_chunks if count > 0 else 0
                self.figures["bridge_pairs"] += now * (now - 1) - was * (was - 1)
            if count <= 0:
                continue
            members = (before["members"] or []) if before else []
            complete = before is None or len(members) == before["member_count"]
            row = {row_column: member_of, id_column: before[id_column] if before else new_ids[member_of],
                   "member_count": count,
                   "members": sorted((set(members) - lost) | got) if complete and count <= gt.MEMBER_CAP else []}
            if name == gt.GRAPH_LINKS:
                row["chunk_count"] = now
            if not complete and count <= gt.MEMBER_CAP:
                hubs.append(member_of)
            out.append(row)
        if hubs:  # back under the cap: every member read from the statements (already updated)
            members = self._hub_members(statement_column, hubs)
            for row in out:
                if row[row_column] in members:
                    row["members"] = members[row[row_column]]
        self._delete(name, row_column, affected)
        self._add(name, pl.DataFrame(out, schema=gt.SCHEMAS[name]) if out else pl.DataFrame())

    def _hub_members(self, statement_column: str, hubs: list[int]) -> dict[int, list[int]]:
        table = self._table(gt.GRAPH_STATEMENTS)
        members: dict[int, list[int]] = {h: [] for h in hubs}
        for part in _batches(hubs):
            values = ", ".join(str(int(h)) for h in part)
            where = f"array_has_any(links, [{values}])" if statement_column == "links" else f"topic_row IN ({values})"
            found = pl.from_arrow(table.search().where(where).select(["row", statement_column]).limit(None).to_arrow())
            if statement_column == "links":
                found = found.explode("links").filter(pl.col("links").is_in(part)).rename({"links": "of"})
            else:
                found = found.rename({"topic_row": "of"})
            for of, rows in found.group_by("of").agg(pl.col("row").sort()).iter_rows():
                members[int(of)] = rows
        return members

    # entities, their mentions, relations and names

    def _entities(self, mentions: pl.DataFrame | None, present: list[str], position: dict[str, int]) -> None:
        changes = self.entity_changes
        old_mentions = self._read(gt.GRAPH_MENTIONS, "doc_id", self.documents, ["entity_row"])
        old_relations = self._read(gt.GRAPH_RELATIONS, "doc_id", self.documents, ["a", "b"])
        # the new rows, of the entities the entities table holds
        raw = graph_channels._extract_table(self.extract, "relations", graph_channels.RELATION_COLUMNS,
                                            list(position), present) if present else None
        relations = graph_channels.relation_rows(raw, mentions, None)
        named = set(mentions["entity_id"].to_list()) if mentions is not None else set()
        known = self._known(named | set(relations["a"]) | set(relations["b"]) | set(changes["new"])
                            | set(changes["updated"]))
        relations = relations.filter(pl.col("a").is_in(list(known)) & pl.col("b").is_in(list(known)))
        mentions = mentions.filter(pl.col("entity_id").is_in(list(known))) if mentions is not None else None
        row_of = self._entity_rows(sorted(known))
        gone_rows = list(self._entity_rows_of("entity_id", changes["gone"]).values())
        self._delete(gt.GRAPH_MENTIONS, "doc_id", self.documents)
        self._delete(gt.GRAPH_RELATIONS, "doc_id", self.documents)
        if gone_rows:
            self._delete(gt.GRAPH_MENTIONS, "entity_row", gone_rows)
        # the new mentions with their entity's row and document: the mention rows and the surface forms
        placed = pl.DataFrame(schema={"row": pl.Int64, "entity_id": pl.Utf8, "entity_name": pl.Utf8,
                                      "chunk_id": pl.Utf8, "doc_id": pl.Utf8})
        if mentions is not None and mentions.height:
            placed = mentions.select(pl.col("entity_id").replace_strict(row_of, return_dtype=pl.Int64).alias("row"),
                                     "entity_id", "entity_name", "chunk_id",
                                     pl.col("chunk_id").replace_strict(self.doc_of).alias("doc_id"))
        self._add(gt.GRAPH_MENTIONS, placed.select(pl.col("row").alias("entity_row"), "chunk_id", "doc_id").unique())
        self._add(gt.GRAPH_RELATIONS, relations.select(
            pl.col("a").replace_strict(row_of, return_dtype=pl.Int64), pl.col("b").replace_strict(row_of, return_dtype=pl.Int64),
            "weight", pl.col("chunk_id").replace_strict(self.doc_of).alias("doc_id")))
        # every entity named before or now, and every new or changed one, made again whole
        affected = set(row_of.values()) | set(old_mentions["entity_row"].to_list() if old_mentions.height else [])
        if old_relations.height:
            affected |= set(old_relations["a"].to_list()) | set(old_relations["b"].to_list())
        affected -= set(gone_rows)
        by_row = {**{r: e for e, r in self._entity_rows_of("row", sorted(affected - set(row_of.values()))).items()},
                  **{r: e for e, r in row_of.items()}}
        self._delete(gt.GRAPH_ENTITIES, "row", sorted(affected | set(gone_rows)))
        if by_row:
            rows = sorted(by_row)
            all_mentions = self._read(gt.GRAPH_MENTIONS, "entity_row", rows, ["entity_row", "chunk_id"])
            # a relation between two of them is read once by each end: LanceDB's row id keeps it once
            all_relations = pl.concat([self._read(gt.GRAPH_RELATIONS, column, rows, ["a", "b", "weight"], row_ids=True)
                                       for column in ("a", "b")], how="vertical_relaxed")
            if not all_mentions.height:
                all_mentions = pl.DataFrame(schema={"entity_row": pl.Int64, "chunk_id": pl.Utf8})
            all_relations = all_relations.unique("_rowid") if all_relations.height else \
                pl.DataFrame(schema={"a": pl.Int64, "b": pl.Int64, "weight": pl.Float64})
            base = self._entity_base({e: r for r, e in by_row.items()})
            links = gt.entity_link_rows(rows, all_mentions, all_relations)
            self._add(gt.GRAPH_ENTITIES, base.join(links, on="row").sort("row"))
        # names: the rewritten documents' surface forms and the gone or changed entities' names and parts
        changed_rows = gone_rows + [row_of[e] for e in changes["new"] + changes["updated"] if e in row_of]
        self._delete(gt.GRAPH_NAMES, "doc_id", self.documents)
        self._delete(gt.GRAPH_NAMES, "row", changed_rows, extra="doc_id = '' AND ")
        self._delete(gt.GRAPH_NAMES, "row", gone_rows)
        fresh = [e for e in changes["new"] + changes["updated"] if e in row_of]
        entities = self._entity_base({e: row_of[e] for e in fresh}) \
            if fresh else pl.DataFrame(schema={"row": pl.Int64, "entity_id": pl.Utf8, "name": pl.Utf8})
        self._add(gt.GRAPH_NAMES, gt.name_rows(entities.select("row", "entity_id", "name"), placed))

    def _entity_base(self, rows: dict[str, int]) -> pl.DataFrame:
        """lance_graph_tables.entity_base_rows, read by batches of ids (never the whole vector table)."""
        ids = sorted(rows)
        return pl.concat([gt.entity_base_rows(self.store, {e: rows[e] for e in part}, _in_list("entity_id", part))
                          for part in _batches(ids)], how="vertical_relaxed")

    def _known(self, ids) -> set[str]:
        """The ids among these that the entities vector table holds."""
        ids = sorted(i for i in ids if i)
        if not ids or ENTITIES not in self.store.table_names():
            return set()
        found = self._read(ENTITIES, "entity_id", ids, ["entity_id"]) if len(ids) <= 20 * IN_BATCH else \
            self.store.scan(ENTITIES, ["entity_id"]).filter(pl.col("entity_id").is_in(ids))
        return set(found["entity_id"].to_list()) if found.height else set()

    def _entity_rows_of(self, column: str, values: list) -> dict[str, int]:
        """entity id -> row of the graph_entities rows whose `column` is one of `values`."""
        found = self._read(gt.GRAPH_ENTITIES, column, values, ["entity_id", "row"]) if values else pl.DataFrame()
        return dict(zip(found["entity_id"].to_list(), found["row"].to_list())) if found.height else {}

    def _entity_rows(self, ids: list[str]) -> dict[str, int]:
        """Each entity's row: its row in the table, or a new one."""
        return dict(zip(ids, self._keyed_rows(gt.GRAPH_ENTITIES, "entity_id", "row", ids, "entity").tolist()))
