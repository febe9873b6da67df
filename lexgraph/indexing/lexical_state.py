"""The lexical graph's saved state (`lexical_state/` under the corpus folder): what the load by difference
(:mod:`lexgraph.indexing.lexical_diff`) needs from earlier runs, how it is read and written, and the keyed rows and
global frames it holds.

- `documents`: per document the signature of its lexical tables (size and modification time of each file;
  every write replaces a file), the time its Source node was loaded (a reload deletes its statements, topics
  and the edges into its chunks), its statement vectors' signature and its share of the doc-scoped tables;
- the entity, fact and relation rows of every document with their resolution keys (:func:`keyed_rows`), so a
  key is resolved again from all its rows without reading other documents' files (:func:`touched_tables`);
- the resolved Entity and Fact nodes and the SUBJECT, OBJECT and RELATED edges (before anchoring), and the
  entity merges (:func:`global_frames`; a diff swaps the touched keys' rows in with :func:`splice_frames`).

Crash safety: `state.json` names the saved generation and says whether the stores hold it. It is marked
"not synced" (:func:`mark_writing`) before any store is written and "synced" (with the new generation,
:func:`save_state`) only after Kùzu, LanceDB and the new files are written, so a process killed in between
makes the next run rebuild everything.
"""
from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from lexgraph.atomic_json import write_json
from lexgraph.indexing.lexical_tables import COLUMNS, LEXICAL_STAGES, stage_frame
from lexgraph.indexing.pipeline import ENTITIES, FACTS, RELATIONS

STATE_FORMAT = 2  # 2: resolution by type; frames saved by format 1 merged a person and a place, so rebuild once
STATE_FILE = "state.json"
GLOBAL_NODES = ("Fact", "Entity")
GLOBAL_RELS = ("SUBJECT", "OBJECT", "RELATED")
KEY, PAIR = "_key", "_pair"
ROW_TABLES = (ENTITIES, FACTS, RELATIONS)
FRAMES = (*GLOBAL_NODES, *GLOBAL_RELS, "merges")


# --- resolution keys ----------------------------------------------------------------------------------------


def keyed_rows(tables: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Entity, fact and relation rows with the key resolution groups them by: an entity's normalised name, a
    fact's key, a relation's unordered pair of entity ids (null where resolution drops the row)."""
    from lexgraph.indexing.name_keys import entity_id_of_key, fact_key, normalise_entity_name

    entities, facts, relations = (tables[t].rechunk() for t in (ENTITIES, FACTS, RELATIONS))  # see concat_tables
    names = set(entities["entity_name"].drop_nulls().to_list())
    names |= set(relations["source"].drop_nulls().to_list()) | set(relations["target"].drop_nulls().to_list())
    keys = {name: normalise_entity_name(name) or None for name in names}
    entities = entities.with_columns(pl.col("entity_name").replace_strict(keys, default=None, return_dtype=pl.String)
                                     .alias(KEY))

    def key_of_fact(triple: tuple) -> str | None:
        try:
            return fact_key(*(part or "" for part in triple))
        except ValueError:
            return None

    triples = facts.select("subject", "predicate", "object").unique()
    triples = triples.with_columns(pl.Series(KEY, [key_of_fact(t) for t in triples.iter_rows()], dtype=pl.String))
    facts = facts.join(triples, on=["subject", "predicate", "object"], how="left", nulls_equal=True)

    ids = {name: entity_id_of_key(key) for name, key in keys.items() if key}
    pairs = relations.select(pl.col("source").replace_strict(ids, default=None, return_dtype=pl.String).alias("_a"),
                             pl.col("target").replace_strict(ids, default=None, return_dtype=pl.String).alias("_b"))
    pair = (pl.when(pl.col("_a").is_not_null() & pl.col("_b").is_not_null() & (pl.col("_a") != pl.col("_b")))
            .then(pair_of("_a", "_b")))
    relations = relations.with_columns(pairs.select(pair.alias(PAIR)).to_series())
    return {ENTITIES: entities, FACTS: facts, RELATIONS: relations}


def pair_of(a: str, b: str) -> pl.Expr:
    """The unordered pair of two id columns, as one string (a relation's resolution key)."""
    return pl.concat_str(pl.min_horizontal(a, b), pl.lit("|"), pl.max_horizontal(a, b))


def global_frames(nodes: dict[str, pl.DataFrame], edges: dict[str, pl.DataFrame], merges: pl.DataFrame) -> dict:
    return {"Entity": nodes["Entity"], "Fact": nodes["Fact"], **{rel: edges[rel] for rel in GLOBAL_RELS},
            "merges": merges}


def within(column: str | pl.Expr, values: pl.Series | list) -> pl.Expr:
    values = values if isinstance(values, pl.Series) else pl.Series(values, dtype=pl.String)
    return (pl.col(column) if isinstance(column, str) else column).is_in(values.implode())


# --- the saved state ------------------------------------------------------------------------------------------


@dataclass
class LexicalState:
    documents: pl.DataFrame  # doc_id, signature, loaded, statement_signature, statement_rows, one count per table
    rows: dict[str, pl.DataFrame]  # ENTITIES, FACTS, RELATIONS rows of every document, with their keys
    frames: dict[str, pl.DataFrame]  # Entity, Fact, SUBJECT, OBJECT, RELATED (before anchoring), merges
    generation: str = ""


def _read_marker(root: Path) -> dict:
    try:
        found = json.loads((root / STATE_FILE).read_text())
        return found if isinstance(found, dict) else {}
    except (FileNotFoundError, ValueError):
        return {}


def _write_marker(root: Path, marker: dict) -> None:
    write_json(root / STATE_FILE, marker)


def load_state(root: Path | None) -> tuple[LexicalState | None, str]:
    """The saved state when the stores are known to hold it; else None and why the build must be whole."""
    if root is None:
        return None, "no state folder given"
    folder, why = _synced_generation(Path(root))
    if folder is None:
        return None, why
    try:
        documents = _read_frame(folder, "documents")
        rows = {t: _read_frame(folder, f"rows_{t}") for t in ROW_TABLES}
        frames = {t: _read_frame(folder, t) for t in FRAMES}
    except (Exception, pl.exceptions.PanicException) as error:  # noqa: BLE001 - torn or garbage: rebuild
        return None, f"saved lexical state unreadable ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
    return LexicalState(documents, rows, frames, folder.name), ""


def _synced_generation(root: Path) -> tuple[Path | None, str]:
    """The folder of the saved generation the stores hold, or (None, why there is none)."""
    marker = _read_marker(root)
    if not marker:
        return None, "no saved lexical state (first build, or its state file is missing or unreadable)"
    if marker.get("format") != STATE_FORMAT:
        return None, f"saved lexical state of another format ({marker.get('format')!r})"
    if not marker.get("synced"):
        return None, "the last write of the lexical graph did not finish (state not marked as written)"
    return root / str(marker.get("generation")), ""


def _read_frame(folder: Path, name: str) -> pl.DataFrame:
    """Arrow IPC; a generation saved before that is Parquet and still read (no rebuild for a format change)."""
    path = folder / f"{name}.arrow"
    return pl.read_ipc(path) if path.exists() else pl.read_parquet(folder / f"{name}.parquet")


def mark_writing(root: Path | None) -> None:
    """Before any store is written: a process killed from here until save_state makes the next run rebuild."""
    if root is not None:
        marker = _read_marker(Path(root))
        _write_marker(Path(root), {**marker, "format": STATE_FORMAT, "synced": False})


def save_state(root: Path | None, state: LexicalState) -> str:
    """Write the state as a new generation, then mark it as what the stores hold; older generations go last."""
    if root is None:
        return ""
    root = Path(root)
    generation = uuid.uuid4().hex
    folder = root / generation
    folder.mkdir(parents=True, exist_ok=True)
    # uncompressed Arrow IPC: written on every run, so its speed counts more than its size (a fifth of Parquet
    # lz4's time at 100k chunks, three times the bytes)
    for name, frame in {"documents": state.documents, **{f"rows_{t}": f for t, f in state.rows.items()},
                        **state.frames}.items():
        frame.write_ipc(folder / f"{name}.arrow", compression="uncompressed")
    _write_marker(root, {"format": STATE_FORMAT, "generation": generation, "synced": True})
    for old in root.iterdir():
        if old.is_dir() and old.name != generation:
            shutil.rmtree(old, ignore_errors=True)
    return generation


def empty_tables() -> dict[str, pl.DataFrame]:
    return {stage: stage_frame(stage, []) for stage in LEXICAL_STAGES if stage in COLUMNS}


def concat_tables(parts: list[dict[str, pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    tables = empty_tables()
    for stage in tables:
        frames = [p[stage] for p in parts if p[stage].height]
        if frames:
            # one chunk, not one per document: polars' replace_strict builds its mapping once per chunk, which
            # at 3,327 documents took 40 s and 16 GB in keyed_rows (the combined dev corpora's rebuild)
            tables[stage] = pl.concat(frames, how="diagonal_relaxed", rechunk=True).select(list(COLUMNS[stage]))
    return tables


def touched_tables(rows: dict[str, pl.DataFrame], entity_keys: set, fact_keys: set, pairs: set) -> dict[str, pl.DataFrame]:
    """Every document's rows of the touched keys (statements and topics empty): what resolving them again needs."""
    tables = empty_tables()
    tables[ENTITIES] = rows[ENTITIES].filter(within(KEY, list(entity_keys))).select(tables[ENTITIES].columns)
    tables[FACTS] = rows[FACTS].filter(within(KEY, list(fact_keys))).select(tables[FACTS].columns)
    tables[RELATIONS] = rows[RELATIONS].filter(within(PAIR, list(pairs))).select(tables[RELATIONS].columns)
    return tables


def splice_frames(old: dict, touched: dict, entity_ids: set, fact_ids: set, pairs: set) -> dict:
    """The old global frames with every row of a touched key replaced by the rows resolved again (the ids given
    are every id those keys can resolve to: see _variants)."""
    def swap(frame: pl.DataFrame, drop: pl.Expr, new: pl.DataFrame) -> pl.DataFrame:
        return pl.concat([frame.filter(~drop), new.select(frame.columns)], how="vertical_relaxed")

    entity_ids, fact_ids, pairs = list(entity_ids), list(fact_ids), list(pairs)
    return {
        "Entity": swap(old["Entity"], within("id", entity_ids), touched["Entity"]).sort("id"),
        "Fact": swap(old["Fact"], within("id", fact_ids), touched["Fact"]).sort("id"),
        "SUBJECT": swap(old["SUBJECT"], within("to", fact_ids), touched["SUBJECT"]).sort("to", "from"),
        "OBJECT": swap(old["OBJECT"], within("to", fact_ids), touched["OBJECT"]).sort("to", "from"),
        "RELATED": swap(old["RELATED"], within(pair_of("from", "to"), pairs), touched["RELATED"]).sort("from", "to"),
        "merges": swap(old["merges"], within("entity_id", entity_ids), touched["merges"])
        .sort("entity_id", "surface_form", "reason"),
    }


def saved_rows(root: Path | None, table: str) -> pl.DataFrame | None:
    """One table of every document's keyed rows (ROW_TABLES) as last saved, when the stores hold that state."""
    folder = _synced_generation(Path(root))[0] if root is not None else None
    if folder is None:
        return None
    try:
        return _read_frame(folder, f"rows_{table}")
    except (Exception, pl.exceptions.PanicException):  # noqa: BLE001 - torn or garbage: the caller rewrites whole
        return None
