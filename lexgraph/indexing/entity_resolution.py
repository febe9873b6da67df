"""One entity per name across documents, with types keeping a person and a place apart.

- :func:`resolve_entities` keeps one row per key (:func:`lexgraph.indexing.name_keys.normalise_entity_name`),
  with a content-hash id, and records every surface form it folded in and why
  (:func:`lexgraph.indexing.name_keys.merge_reasons`): the audit trail for each merge.
- Types keep a person and a place apart (:func:`entity_senses`): a key whose rows are typed both
  "person" and "location" (the person Jordan, the country Jordan) is split into one entity per
  family. The family with more typed mentions keeps the key's own id, so nothing that resolves a
  bare name (a query, a fact with no typed name beside it) loses its entity; the other family's id
  is derived from the key's id and the family. Rows of any other type ("other", "organization",
  ...) join the one family their chunk types the name as, else the larger family. Organization is
  deliberately not a family of its own: small NER models (en_core_web_sm) often label a person
  ORG, and that noise would cut real people in two. Each split leaves one row per side in the
  merges table, with mention_count 0 (nothing was folded in): reason "kept apart from the
  location Jordan (ent-...): types person vs location (2 vs 3 typed mentions)".
- The row helpers here (:func:`strings_of`, :func:`most_common`, ...) are shared with
  :mod:`lexgraph.indexing.fact_resolution`, which resolves facts and relations through the same splits.

Everything is deterministic: the same rows in any order give the same ids and the same frames.
A key that is not split resolves exactly as it did before types were used.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping

import polars as pl

from lexgraph.ids import short_hash
from lexgraph.indexing.name_keys import ID_LENGTH, entity_id_of_key, merge_reasons, normalise_entity_name

DESCRIPTION_SEPARATOR = "\n"
MAX_DESCRIPTION_CHARS = 2000
ENTITY_COLUMNS = ("entity_name", "entity_type", "description", "chunk_id", "doc_id")
PROVENANCE_COLUMNS = ("extractor", "model", "prompt_version")
_SPACE = re.compile(r"\s+")

_LIST = pl.List(pl.String)
ENTITY_SCHEMA: dict[str, pl.DataType] = {
    "entity_id": pl.String(), "entity_key": pl.String(), "name": pl.String(), "entity_type": pl.String(),
    "description": pl.String(), "surface_forms": _LIST, "doc_ids": _LIST, "chunk_ids": _LIST,
    "mention_count": pl.Int64(), "doc_count": pl.Int64(), "extractors": _LIST, "models": _LIST,
    "prompt_versions": _LIST,
}
MERGE_SCHEMA: dict[str, pl.DataType] = {
    "entity_id": pl.String(), "canonical_name": pl.String(), "surface_form": pl.String(), "reason": pl.String(),
    "mention_count": pl.Int64(), "doc_ids": _LIST,
}


# -- helpers ----------------------------------------------------------------------------------


def clean_text(value: object) -> str:
    return _SPACE.sub(" ", str(value)).strip() if value is not None else ""


def require_columns(frame: pl.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(f"{what} rows lack column(s) {', '.join(missing)}; they have {', '.join(frame.columns)}")


def most_common(counts: Counter) -> str:
    """The most frequent value; ties go to the longer, then the alphabetically first."""
    return min(counts.items(), key=lambda item: (-item[1], -len(item[0]), item[0]))[0]


def merged_descriptions(counts: Counter, limit: int = MAX_DESCRIPTION_CHARS) -> str:
    kept: list[str] = []
    used = 0
    for text, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if kept and used + len(DESCRIPTION_SEPARATOR) + len(text) > limit:
            break
        kept.append(text if kept or len(text) <= limit else text[: limit - 1] + "…")
        used += len(kept[-1]) + (len(DESCRIPTION_SEPARATOR) if len(kept) > 1 else 0)
    return DESCRIPTION_SEPARATOR.join(kept)


def _majority_type(counts: Counter) -> str:
    specific = Counter({kind: n for kind, n in counts.items() if kind not in ("", "other")})
    pool = specific or counts
    if not pool:
        return "other"
    return min(pool.items(), key=lambda item: (-item[1], item[0]))[0] or "other"


def strings_of(frame: pl.DataFrame, column: str) -> list[str]:
    if column not in frame.columns:
        return [""] * frame.height
    return ["" if value is None else str(value) for value in frame.get_column(column).to_list()]


# -- types: a person and a place of one name are two entities ----------------------------------

PERSON, LOCATION = "person", "location"
# The types one name is never one entity across. Not organization: see the module docstring.
FAMILIES: tuple[str, ...] = (LOCATION, PERSON)
KEPT_APART = "kept apart from the"
_SENSE = "\x1e"  # whitespace, so never inside a key: a family's id cannot be another name's


@dataclass(frozen=True)
class Split:
    """A name key typed both person and location: one entity per family."""

    major: str  # the family with more typed mentions (a tie: the first in FAMILIES); it keeps the key's id
    counts: Mapping[str, int]  # typed mentions per family
    chunks: Mapping[str, str]  # chunk_id -> the one family that chunk's rows of the name are typed as


def family_of(entity_type: str) -> str:
    """The family ("person" or "location") of an entity type; "" for every other type."""
    kind = clean_text(entity_type).casefold()
    return kind if kind in FAMILIES else ""


def entity_senses(frame: pl.DataFrame) -> dict[str, Split]:
    """The split keys among entity rows (``entity_name``, ``entity_type``, ``chunk_id``): key -> :class:`Split`.

    A key is split when its rows are typed in more than one family. It depends on all the key's rows, so
    pass them all (the diff passes every document's rows of the keys it resolves again).
    """
    families = {kind: family for kind in set(strings_of(frame, "entity_type")) if (family := family_of(kind))}
    if not families:
        return {}
    typed = frame.filter(pl.col("entity_type").is_in(list(families)))
    names, types, chunks = (strings_of(typed, column) for column in ("entity_name", "entity_type", "chunk_id"))
    keys: dict[str, str] = {}
    counts: dict[str, Counter] = defaultdict(Counter)
    by_chunk: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for row, name in enumerate(names):
        key = keys.get(name)
        if key is None:
            key = keys[name] = normalise_entity_name(name)
        if key:
            counts[key][families[types[row]]] += 1
            by_chunk[key][chunks[row]].add(families[types[row]])
    senses = {}
    for key, count in counts.items():
        if len(count) > 1:
            major = min(count, key=lambda family: (-count[family], FAMILIES.index(family)))
            chunk_family = {chunk: next(iter(found)) for chunk, found in sorted(by_chunk[key].items())
                            if chunk and len(found) == 1}
            senses[key] = Split(major, dict(sorted(count.items())), chunk_family)
    return senses


def sense_of(key: str, chunk: str, entity_type: str, senses: Mapping[str, Split]) -> str:
    """The family a mention of ``key`` resolves to when that is not the key's own entity; else "".

    A mention typed person or location is that family; any other goes with the family its chunk types
    the name as, else with the larger family (so a bare name in a fact finds the entity it most likely means).
    """
    split = senses.get(key)
    if split is None:
        return ""
    family = family_of(entity_type) or split.chunks.get(chunk, split.major)
    return "" if family == split.major else family


def sense_entity_id(base: str, family: str) -> str:
    """The id of the family split off the entity whose own id is ``base``."""
    return f"ent-{short_hash(base + _SENSE + family, ID_LENGTH)}"


def entity_id_of_sense(key: str, sense: str = "") -> str:
    """The id of a key's entity (sense "") or of the family split off it."""
    base = entity_id_of_key(key)
    return sense_entity_id(base, sense) if sense else base


def entity_id_variants(base: str) -> list[str]:
    """Every id a key whose own id is ``base`` can resolve to: what an incremental update must replace."""
    return [base, *(sense_entity_id(base, family) for family in FAMILIES)]


def fact_sense_id(fact_id: str, subject_sense: str = "", object_sense: str = "") -> str:
    """The id of a fact whose subject or object resolved to a family split off its name; ``fact_id`` otherwise."""
    if not (subject_sense or object_sense):
        return fact_id
    return f"fact-{short_hash(_SENSE.join((fact_id, subject_sense, object_sense)), ID_LENGTH)}"


def fact_id_variants(fact_id: str) -> list[str]:
    """Every id the fact text of ``fact_id`` can resolve to."""
    senses = ("", *FAMILIES)
    return [fact_sense_id(fact_id, s, o) for s in senses for o in senses]


class EntityIds:
    """Entity ids of (key, sense), each hashed once."""

    def __init__(self, senses: Mapping[str, Split]) -> None:
        self.senses, self._ids = senses, {}

    def __call__(self, key: str, chunk: str, entity_type: str = "") -> tuple[str, str]:
        """(entity id, sense) of a mention of ``key``."""
        sense = sense_of(key, chunk, entity_type, self.senses) if key in self.senses else ""
        found = self._ids.get((key, sense))
        if found is None:
            found = self._ids[(key, sense)] = entity_id_of_sense(key, sense)
        return found, sense


def entity_ids_of_rows(frame: pl.DataFrame, senses: Mapping[str, Split] | None = None) -> pl.Series:
    """The resolved entity id of each entity row (null for a name without a letter or digit)."""
    names = frame.get_column("entity_name").fill_null("").rechunk()  # replace_strict maps each chunk anew
    keys = {name: normalise_entity_name(name) for name in names.unique().to_list()}
    ids = names.replace_strict({name: entity_id_of_key(key) if key else None for name, key in keys.items()},
                               return_dtype=pl.String).alias("entity_id")
    senses = entity_senses(frame) if senses is None else senses
    split = [name for name, key in keys.items() if key in senses]
    if not split:
        return ids
    values, resolve = ids.to_list(), EntityIds(senses)
    names_, types, chunks = names.to_list(), strings_of(frame, "entity_type"), strings_of(frame, "chunk_id")
    for row in names.is_in(split).arg_true().to_list():  # only the split names' rows differ
        values[row] = resolve(keys[names_[row]], chunks[row], types[row])[0]
    return pl.Series("entity_id", values, dtype=pl.String)


# -- entities ---------------------------------------------------------------------------------


def resolve_entities(frame: pl.DataFrame,
                     senses: Mapping[str, Split] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Resolve extracted entity rows into one row per entity, and the merges that made them.

    ``frame`` has one row per entity per chunk, with at least ``entity_name``, ``entity_type``,
    ``description``, ``chunk_id`` and ``doc_id`` (``extractor``, ``model`` and ``prompt_version``
    are carried along when present). Rows whose name has no letter or digit are dropped.
    ``senses``: the split keys (:func:`entity_senses`), computed from ``frame`` when not given.

    Returns ``(entities, merges)``: ``entities`` (:data:`ENTITY_SCHEMA`, sorted by ``entity_id``)
    names each entity by its most frequent surface form and its majority type ("other" only
    when nothing more specific was said; a split entity's type is its family); ``merges``
    (:data:`MERGE_SCHEMA`) has a row for every surface form that differs from its entity's name,
    with the reason, and one per side of every split.
    """
    require_columns(frame, ENTITY_COLUMNS, "entity")
    names, types = strings_of(frame, "entity_name"), strings_of(frame, "entity_type")
    descriptions, chunks, docs = strings_of(frame, "description"), strings_of(frame, "chunk_id"), strings_of(frame, "doc_id")
    provenance = {column: strings_of(frame, column) for column in PROVENANCE_COLUMNS}
    senses = entity_senses(frame) if senses is None else senses
    resolve = EntityIds(senses)
    keys: dict[str, str] = {}
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row, name in enumerate(names):
        key = keys.get(name)
        if key is None:
            key = keys[name] = normalise_entity_name(name)
        if key:
            groups[(key, resolve(key, chunks[row], types[row])[1])].append(row)
    entity_rows, merge_rows = [], []
    for (key, sense), rows in groups.items():
        identifier = entity_id_of_sense(key, sense)
        cleaned = Counter(clean_text(names[row]) for row in rows)
        canonical = most_common(cleaned)
        kinds = Counter(clean_text(types[row]).casefold() for row in rows)
        texts = Counter(text for row in rows if (text := clean_text(descriptions[row])))
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        entity_rows.append({
            "entity_id": identifier, "entity_key": key, "name": canonical,
            "entity_type": (sense or senses[key].major) if key in senses else _majority_type(kinds),
            "description": merged_descriptions(texts), "surface_forms": sorted({names[row] for row in rows}),
            "doc_ids": doc_ids, "chunk_ids": sorted({chunks[row] for row in rows if chunks[row]}),
            "mention_count": len(rows), "doc_count": len(doc_ids),
            **{f"{column}s": sorted({values[row] for row in rows if values[row]})
               for column, values in provenance.items()},
        })
        by_surface: dict[str, list[int]] = defaultdict(list)
        for row in rows:
            by_surface[names[row]].append(row)
        for surface, surface_rows in by_surface.items():
            if surface == canonical:
                continue
            merge_rows.append({
                "entity_id": identifier, "canonical_name": canonical, "surface_form": surface,
                "reason": "; ".join(merge_reasons(surface, canonical)), "mention_count": len(surface_rows),
                "doc_ids": sorted({docs[row] for row in surface_rows if docs[row]}),
            })
    merge_rows += _split_records(entity_rows, senses)
    entities = pl.DataFrame(entity_rows, schema=ENTITY_SCHEMA).sort("entity_id")
    merges = pl.DataFrame(merge_rows, schema=MERGE_SCHEMA).sort("entity_id", "surface_form", "reason")
    return entities, merges


def _split_records(entity_rows: list[dict], senses: Mapping[str, Split]) -> list[dict]:
    """One merges row per side of every split: why the forms of one name were not folded into one entity."""
    sides: dict[str, list[dict]] = defaultdict(list)
    for entity in entity_rows:
        if entity["entity_key"] in senses:
            sides[entity["entity_key"]].append(entity)
    records = []
    for key, entities in sides.items():
        counts = senses[key].counts
        for ours in entities:
            for theirs in entities:
                if theirs is ours:
                    continue
                mine, other = ours["entity_type"], theirs["entity_type"]
                records.append({
                    "entity_id": ours["entity_id"], "canonical_name": ours["name"], "surface_form": theirs["name"],
                    "reason": (f"{KEPT_APART} {other} {theirs['name']} ({theirs['entity_id']}): types {mine} vs "
                               f"{other} ({counts.get(mine, 0)} vs {counts.get(other, 0)} typed mentions)"),
                    "mention_count": 0, "doc_ids": theirs["doc_ids"],  # nothing folded in: 0 keeps merge totals true
                })
    return records
