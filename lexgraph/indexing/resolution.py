"""One graph across documents: entity resolution and global facts.

Extraction runs per chunk, so "Kestrel Propulsion GmbH" in one contract and "the Kestrel
Propulsion" in an e-mail arrive as two names. Here they become one Entity node:

- :func:`normalise_entity_name` is the matching key: case folded, accents and punctuation
  dropped, whitespace collapsed, a leading article ("the", "a", "an"), a leading honorific or
  vessel prefix ("Dr.", "MV") and trailing legal suffixes (GmbH, AS, Ltd, S.A., "GmbH & Co. KG",
  ...) removed. Never empty for a name with a
  letter or digit: a name that is nothing but an article and a suffix ("The GmbH") keeps the
  suffix.
- :func:`resolve_entities` keeps one row per key, with a content-hash id, and records every
  surface form it folded in and why ("case", "leading article", "legal suffix GmbH", ...): the
  audit trail for each merge.
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
- :func:`fact_id` makes the same (subject, predicate, object) from two sources one Fact node;
  :func:`resolve_facts` groups fact rows into Fact nodes with the statements they support. A
  fact or relation names its ends by strings: a split name resolves through the entity rows of
  the fact's own chunk (their type there), else to the larger family; a fact about the smaller
  family is its own Fact node.
- :func:`resolve_relations` folds entity↔entity relations onto the resolved ids.

Everything is deterministic: the same rows in any order give the same ids and the same frames.
A key that is not split resolves exactly as it did before types were used.
"""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping

import polars as pl

from lexgraph.ids import short_hash

LEGAL_SUFFIXES: frozenset[str] = frozenset(
    """gmbh mbh ag as asa ltd limited llc llp lp inc incorporated corp corporation plc sa sas sarl srl spa bv nv
    co kg kgaa ohg oy oyj ab aps se sia pty pte bhd sdn kk ltda sl ug cv""".split()
)
LEADING_ARTICLES: frozenset[str] = frozenset({"the", "a", "an"})
# Honorifics and vessel prefixes: "Dr. Annika Vogt" is Annika Vogt, "MV Nordlys Spirit" is Nordlys Spirit.
LEADING_TITLES: frozenset[str] = frozenset(
    "dr mr mrs ms mx miss prof sir dame herr frau mv mt ss rv fv".split()
)
# The normalisation steps, in the words a merge's reason uses.
WHITESPACE, CASE, ACCENTS, PUNCTUATION, ARTICLE, TITLE, SUFFIX = (
    "whitespace", "case", "accents", "punctuation", "leading article", "leading title", "legal suffix",
)
STEPS = (WHITESPACE, CASE, ACCENTS, PUNCTUATION, ARTICLE, TITLE, SUFFIX)
DESCRIPTION_SEPARATOR = "\n"
MAX_DESCRIPTION_CHARS = 2000
ID_LENGTH = 16  # hex digits: 64 bits keeps collisions negligible for millions of nodes

_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_POSSESSIVE = re.compile(r"['’]s(?![^\W_])")
_DROPPED = re.compile(r"[.'’`´]")
_INNER_MARK = re.compile(r"(?<=\S)(?:[^\w\s\x00]|_)+(?=\S)")
_MARK = re.compile(r"(?:[^\w\s\x00]|_)+")
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+")

ENTITY_COLUMNS = ("entity_name", "entity_type", "description", "chunk_id", "doc_id")
FACT_COLUMNS = ("subject", "predicate", "object", "statement_id")
RELATION_COLUMNS = ("source", "target", "predicate", "description", "strength", "chunk_id", "doc_id")
PROVENANCE_COLUMNS = ("extractor", "model", "prompt_version")

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
FACT_SCHEMA: dict[str, pl.DataType] = {
    "fact_id": pl.String(), "subject": pl.String(), "predicate": pl.String(), "object": pl.String(),
    "subject_entity_id": pl.String(), "object_entity_id": pl.String(), "statement_ids": _LIST,
    "chunk_ids": _LIST, "doc_ids": _LIST, "support_count": pl.Int64(), "doc_count": pl.Int64(),
    "extractors": _LIST, "models": _LIST, "prompt_versions": _LIST,
}
RELATION_SCHEMA: dict[str, pl.DataType] = {
    "source_entity_id": pl.String(), "target_entity_id": pl.String(), "predicate": pl.String(),
    "predicates": _LIST, "description": pl.String(), "weight": pl.Float64(), "strength": pl.Float64(),
    "chunk_ids": _LIST, "doc_ids": _LIST, "support_count": pl.Int64(),
}


# -- keys -------------------------------------------------------------------------------------


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def _strip_punctuation(text: str) -> str:
    """Possessives, dots and apostrophes go ("S.A." → "SA"); other marks between words become a space."""
    text = _POSSESSIVE.sub("", text)
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub("\x00", text)  # 4.5 stays 4.5
    text = text.replace("&", " and ")
    text = _DROPPED.sub("", text)
    text = _INNER_MARK.sub(" ", text)
    text = _MARK.sub("", text)
    return text.replace("\x00", ".")


def _bare(token: str) -> str:
    return "".join(_WORD.findall(token.casefold()))


def _normalise(name: str, skip: frozenset[str] = frozenset()) -> str:
    text = unicodedata.normalize("NFKC", name)
    if CASE not in skip:
        text = text.casefold()
    if ACCENTS not in skip:
        text = _strip_accents(text)
    if PUNCTUATION not in skip:
        text = _strip_punctuation(text)
    tokens = text.split() if WHITESPACE not in skip else text.split(" ")
    if ARTICLE not in skip and len(tokens) > 1 and tokens[0].casefold() in LEADING_ARTICLES:
        tokens = tokens[1:]
    if TITLE not in skip:
        tokens = tokens[_title_length(tokens):]
    if SUFFIX not in skip:
        stripped = False
        while len(tokens) > 1 and _bare(tokens[-1]) in LEGAL_SUFFIXES:
            tokens, stripped = tokens[:-1], True
            while stripped and len(tokens) > 1 and _bare(tokens[-1]) in ("and", ""):
                tokens = tokens[:-1]  # "GmbH & Co. KG"
    return " ".join(tokens)


def _title_length(tokens: list[str]) -> int:
    """How many leading tokens are an honorific or vessel prefix ("Dr.", "MV", "M/V" or, punctuation gone, "m v")."""
    if len(tokens) > 1 and _bare(tokens[0]) in LEADING_TITLES:
        return 1
    if len(tokens) > 2 and len(tokens[0]) == len(tokens[1]) == 1 and (tokens[0] + tokens[1]).casefold() in (
            "mv", "mt", "ms"):
        return 2
    return 0


def normalise_entity_name(name: str) -> str:
    """The key entity names are matched by ("Kestrel Propulsion GmbH" and "the Kestrel Propulsion" → "kestrel propulsion").

    Steps: NFKC, case fold, accents, punctuation (possessives, dots and apostrophes dropped, other
    marks between words a space, "&" → "and"), whitespace, a leading article, a leading
    honorific or vessel prefix ("Dr.", "MV"), trailing legal suffixes.

    Empty only for a name without a letter or digit.
    """
    if not name:
        return ""
    key = _normalise(name)
    return key if any(c.isalnum() for c in key) else ""


def entity_key(name: str) -> str:
    """:func:`normalise_entity_name`, or for a name of punctuation only its folded text (so never empty for a non-blank name)."""
    key = normalise_entity_name(name or "")
    if key:
        return key
    folded = _SPACE.sub(" ", unicodedata.normalize("NFKC", name or "")).strip().casefold()
    return f"~{folded}" if folded else ""


def entity_id(name: str) -> str:
    """The id of the name's entity: a filesystem-safe hash of the normalised name. When the name is split
    by type (a person and a place), this is the larger family's id (:func:`entity_senses`)."""
    key = entity_key(name)
    if not key:
        raise ValueError("an entity needs a non-blank name")
    return entity_id_of_key(key)


def entity_id_of_key(key: str) -> str:
    """The entity id of a key made by :func:`normalise_entity_name` (or :func:`entity_key`)."""
    return f"ent-{short_hash(key, ID_LENGTH)}"


def normalise_predicate(predicate: str) -> str:
    """A fact's predicate for matching: case folded, whitespace collapsed, surrounding punctuation dropped."""
    text = _SPACE.sub(" ", unicodedata.normalize("NFKC", predicate or "").casefold()).strip()
    return text.strip(" .,;:!?\"'“”‘’()[]{}")


def fact_key(subject: str, predicate: str, object: str) -> str:
    parts = (entity_key(subject), normalise_predicate(predicate), entity_key(object))
    if not all(parts):
        raise ValueError(f"a fact needs a subject, a predicate and an object: {(subject, predicate, object)!r}")
    return "\x1f".join(parts)


def fact_id_of_key(key: str) -> str:
    """The Fact node id of a key made by :func:`fact_key`."""
    return f"fact-{short_hash(key, ID_LENGTH)}"


def fact_id(subject: str, predicate: str, object: str) -> str:
    """The Fact node's id: the same fact from two sources (any case, article or legal suffix) is one id."""
    return fact_id_of_key(fact_key(subject, predicate, object))


# -- merge reasons ----------------------------------------------------------------------------


def _suffixes(name: str) -> list[str]:
    """The legal suffixes at the end of a name, as written ("Kestrel GmbH & Co. KG" → ["GmbH", "Co.", "KG"])."""
    tokens = name.split()
    found: list[str] = []
    while len(tokens) > 1:
        bare = _bare(tokens[-1])
        if bare in LEGAL_SUFFIXES:
            found.append(tokens[-1].strip(",;:"))
        elif not (found and bare in ("and", "")):
            break
        tokens = tokens[:-1]
    return found[::-1]


def merge_reasons(surface: str, canonical: str) -> list[str]:
    """Why ``surface`` was folded into ``canonical``: the normalisation steps that make them one.

    First the steps without which they would differ; then, if those alone do not make them
    equal (two steps could each do it), the further steps that change either form, in order.
    Suffixes and titles are named as written: "legal suffix GmbH", "leading title Dr.".
    """
    if surface == canonical:
        return []
    every = frozenset(STEPS)

    def equal_with(steps: set[str]) -> bool:
        return _normalise(surface, every - steps) == _normalise(canonical, every - steps)

    chosen = {step for step in STEPS if not equal_with(set(STEPS) - {step})}
    for step in STEPS:
        if equal_with(chosen):
            break
        if step not in chosen and any(_normalise(form, every - chosen - {step}) != _normalise(form, every - chosen)
                                      for form in (surface, canonical)):
            chosen.add(step)
    reasons: list[str] = []
    for step in (step for step in STEPS if step in chosen):
        if step == TITLE:
            titles = [" ".join(form.split()[:_title_length(form.split())]) for form in (surface, canonical)]
            reasons.extend([f"{TITLE} {title}" for title in dict.fromkeys(titles) if title] or [TITLE])
        elif step == SUFFIX:
            ours, theirs = _suffixes(surface), _suffixes(canonical)
            theirs_bare, ours_bare = Counter(map(_bare, theirs)), Counter(map(_bare, ours))
            different = [s for s in ours if ours_bare[_bare(s)] > theirs_bare[_bare(s)]]
            different += [s for s in theirs if theirs_bare[_bare(s)] > ours_bare[_bare(s)]]
            reasons.extend([f"{SUFFIX} {suffix}" for suffix in dict.fromkeys(different)] or [SUFFIX])
        else:
            reasons.append(step)
    return reasons or ["normalised form"]


# -- helpers ----------------------------------------------------------------------------------


def _clean(value: object) -> str:
    return _SPACE.sub(" ", str(value)).strip() if value is not None else ""


def _require(frame: pl.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(f"{what} rows lack column(s) {', '.join(missing)}; they have {', '.join(frame.columns)}")


def _most_common(counts: Counter) -> str:
    """The most frequent value; ties go to the longer, then the alphabetically first."""
    return min(counts.items(), key=lambda item: (-item[1], -len(item[0]), item[0]))[0]


def _merged_descriptions(counts: Counter, limit: int = MAX_DESCRIPTION_CHARS) -> str:
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


def _strings(frame: pl.DataFrame, column: str) -> list[str]:
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
    kind = _clean(entity_type).casefold()
    return kind if kind in FAMILIES else ""


def entity_senses(frame: pl.DataFrame) -> dict[str, Split]:
    """The split keys among entity rows (``entity_name``, ``entity_type``, ``chunk_id``): key -> :class:`Split`.

    A key is split when its rows are typed in more than one family. It depends on all the key's rows, so
    pass them all (the diff passes every document's rows of the keys it resolves again).
    """
    families = {kind: family for kind in set(_strings(frame, "entity_type")) if (family := family_of(kind))}
    if not families:
        return {}
    typed = frame.filter(pl.col("entity_type").is_in(list(families)))
    names, types, chunks = (_strings(typed, column) for column in ("entity_name", "entity_type", "chunk_id"))
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


class _Ids:
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
    names = frame.get_column("entity_name").fill_null("")
    keys = {name: normalise_entity_name(name) for name in names.unique().to_list()}
    ids = names.replace_strict({name: entity_id_of_key(key) if key else None for name, key in keys.items()},
                               return_dtype=pl.String).alias("entity_id")
    senses = entity_senses(frame) if senses is None else senses
    split = [name for name, key in keys.items() if key in senses]
    if not split:
        return ids
    values, resolve = ids.to_list(), _Ids(senses)
    names_, types, chunks = names.to_list(), _strings(frame, "entity_type"), _strings(frame, "chunk_id")
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
    _require(frame, ENTITY_COLUMNS, "entity")
    names, types = _strings(frame, "entity_name"), _strings(frame, "entity_type")
    descriptions, chunks, docs = _strings(frame, "description"), _strings(frame, "chunk_id"), _strings(frame, "doc_id")
    provenance = {column: _strings(frame, column) for column in PROVENANCE_COLUMNS}
    senses = entity_senses(frame) if senses is None else senses
    resolve = _Ids(senses)
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
        cleaned = Counter(_clean(names[row]) for row in rows)
        canonical = _most_common(cleaned)
        kinds = Counter(_clean(types[row]).casefold() for row in rows)
        texts = Counter(text for row in rows if (text := _clean(descriptions[row])))
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        entity_rows.append({
            "entity_id": identifier, "entity_key": key, "name": canonical,
            "entity_type": (sense or senses[key].major) if key in senses else _majority_type(kinds),
            "description": _merged_descriptions(texts), "surface_forms": sorted({names[row] for row in rows}),
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


# -- facts ------------------------------------------------------------------------------------


def _fact_identities(frame: pl.DataFrame, senses: Mapping[str, Split]) -> list[tuple[str, str, str] | None]:
    """Per fact row: (fact id, subject entity id, object entity id); None for a row missing a part."""
    subjects, predicates, objects = (_strings(frame, column) for column in ("subject", "predicate", "object"))
    chunks = _strings(frame, "chunk_id")
    resolve = _Ids(senses)
    names: dict[str, str] = {}  # a name recurs in many facts: normalised once (as fact_key would)
    known: dict[tuple[str, str, str], tuple[str, str, str] | None] = {}
    identities: list[tuple[str, str, str] | None] = []
    for row in range(frame.height):
        triple = (subjects[row], predicates[row], objects[row])
        if triple not in known:
            for name in (triple[0], triple[2]):
                if name not in names:
                    names[name] = entity_key(name)
            subject_key, predicate, object_key = names[triple[0]], normalise_predicate(triple[1]), names[triple[2]]
            key = "\x1f".join((subject_key, predicate, object_key))
            complete = subject_key and predicate and object_key
            known[triple] = (fact_id_of_key(key), subject_key, object_key) if complete else None
        found = known[triple]
        if found is None:
            identities.append(None)
            continue
        text_id, subject_key, object_key = found
        (subject_id, subject_sense), (object_id, object_sense) = (resolve(subject_key, chunks[row]),
                                                                 resolve(object_key, chunks[row]))
        identities.append((fact_sense_id(text_id, subject_sense, object_sense), subject_id, object_id))
    return identities


def resolve_facts(frame: pl.DataFrame, senses: Mapping[str, Split] | None = None) -> pl.DataFrame:
    """Group fact rows (one per fact per statement) into Fact nodes with the statements they support.

    ``frame`` has at least ``subject``, ``predicate``, ``object`` and ``statement_id`` (``chunk_id``,
    ``doc_id`` and the provenance columns when present). Rows missing a part are dropped. The
    result (:data:`FACT_SCHEMA`, sorted by ``fact_id``) spells each part in its most frequent form
    and gives the entity ids its subject and object resolve to (whether or not such an entity
    was extracted: the loader links those that exist). ``senses`` (:func:`entity_senses`) resolves a
    split name through the entity rows of the fact's chunk; without it every name is its key's entity.
    """
    return resolve_fact_rows(frame, senses)[0]


def resolve_fact_rows(frame: pl.DataFrame, senses: Mapping[str, Split] | None = None) -> tuple[pl.DataFrame, pl.Series]:
    """:func:`resolve_facts`, and the Fact id of each row (null for a row missing a part): a row's own
    ``fact_id`` is its text's, which a fact about the smaller family of a split name does not keep."""
    _require(frame, FACT_COLUMNS, "fact")
    subjects, predicates, objects = (_strings(frame, column) for column in ("subject", "predicate", "object"))
    statements, chunks, docs = (_strings(frame, column) for column in ("statement_id", "chunk_id", "doc_id"))
    provenance = {column: _strings(frame, column) for column in PROVENANCE_COLUMNS}
    identities = _fact_identities(frame, senses or {})
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for row, found in enumerate(identities):
        if found is not None:
            groups[found].append(row)
    fact_rows = []
    for (identifier, subject_id, object_id), rows in groups.items():
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        statement_ids = sorted({statements[row] for row in rows if statements[row]})
        fact_rows.append({
            "fact_id": identifier,
            "subject": _most_common(Counter(_clean(subjects[row]) for row in rows)),
            "predicate": _most_common(Counter(_clean(predicates[row]) for row in rows)),
            "object": _most_common(Counter(_clean(objects[row]) for row in rows)),
            "subject_entity_id": subject_id, "object_entity_id": object_id,
            "statement_ids": statement_ids, "chunk_ids": sorted({chunks[row] for row in rows if chunks[row]}),
            "doc_ids": doc_ids, "support_count": len(statement_ids), "doc_count": len(doc_ids),
            **{f"{column}s": sorted({values[row] for row in rows if values[row]})
               for column, values in provenance.items()},
        })
    ids = pl.Series("fact_id", [found[0] if found else None for found in identities], dtype=pl.String)
    return pl.DataFrame(fact_rows, schema=FACT_SCHEMA).sort("fact_id"), ids


# -- relations --------------------------------------------------------------------------------

CO_OCCURRENCE = "co-occurs with"


def resolve_relations(frame: pl.DataFrame, senses: Mapping[str, Split] | None = None) -> pl.DataFrame:
    """Entity↔entity relations on resolved entity ids, one row per (source, target) pair.

    ``frame`` has ``source``, ``target``, ``predicate``, ``description``, ``strength``, ``chunk_id``
    and ``doc_id``. Co-occurrence has no direction, so its pairs are ordered by id; a pair
    that is one name is dropped. A split name resolves through its chunk, as in
    :func:`resolve_facts`. ``weight`` sums the strengths (LightRAG's
    edge weight), ``strength`` is the largest, ``predicate`` the most frequent and
    ``predicates`` all of them. Sorted by (source_entity_id, target_entity_id).
    """
    _require(frame, RELATION_COLUMNS, "relation")
    sources, targets = _strings(frame, "source"), _strings(frame, "target")
    predicates, descriptions = _strings(frame, "predicate"), _strings(frame, "description")
    chunks, docs = _strings(frame, "chunk_id"), _strings(frame, "doc_id")
    strengths = [float(value) if value is not None else 0.0 for value in frame.get_column("strength").to_list()]
    keys: dict[str, str] = {}
    resolve = _Ids(senses or {})

    def key_of(name: str) -> str:
        if name not in keys:
            keys[name] = normalise_entity_name(name)
        return keys[name]

    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row in range(frame.height):
        source, target, predicate = key_of(sources[row]), key_of(targets[row]), normalise_predicate(predicates[row])
        if not (source and target and predicate) or source == target:
            continue
        first, second = resolve(source, chunks[row])[0], resolve(target, chunks[row])[0]
        if predicate == CO_OCCURRENCE and second < first:
            first, second = second, first
        groups[(first, second)].append(row)
    relation_rows = []
    for (first, second), rows in groups.items():
        named = Counter(normalise_predicate(predicates[row]) for row in rows)
        specific = Counter({p: n for p, n in named.items() if p != CO_OCCURRENCE}) or named
        texts = Counter(text for row in rows if (text := _clean(descriptions[row])))
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        relation_rows.append({
            "source_entity_id": first, "target_entity_id": second, "predicate": _most_common(specific),
            "predicates": sorted(named), "description": _merged_descriptions(texts),
            "weight": math.fsum(strengths[row] for row in rows), "strength": max(strengths[row] for row in rows),
            "chunk_ids": sorted({chunks[row] for row in rows if chunks[row]}), "doc_ids": doc_ids,
            "support_count": len(rows),
        })
    return pl.DataFrame(relation_rows, schema=RELATION_SCHEMA).sort("source_entity_id", "target_entity_id")
