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
- :func:`fact_id` makes the same (subject, predicate, object) from two sources one Fact node;
  :func:`resolve_facts` groups fact rows into Fact nodes with the statements they support.
- :func:`resolve_relations` folds entity↔entity relations onto the resolved ids.

Everything is deterministic: the same rows in any order give the same ids and the same frames.
"""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from typing import Iterable

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
    """The resolved entity's id: a filesystem-safe hash of the normalised name."""
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


# -- entities ---------------------------------------------------------------------------------


def resolve_entities(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Resolve extracted entity rows into one row per entity, and the merges that made them.

    ``frame`` has one row per entity per chunk, with at least ``entity_name``, ``entity_type``,
    ``description``, ``chunk_id`` and ``doc_id`` (``extractor``, ``model`` and ``prompt_version``
    are carried along when present). Rows whose name has no letter or digit are dropped.

    Returns ``(entities, merges)``: ``entities`` (:data:`ENTITY_SCHEMA`, sorted by ``entity_id``)
    names each entity by its most frequent surface form and its majority type ("other" only
    when nothing more specific was said); ``merges`` (:data:`MERGE_SCHEMA`) has a row for every
    surface form that differs from its entity's name, with the reason.
    """
    _require(frame, ENTITY_COLUMNS, "entity")
    names, types = _strings(frame, "entity_name"), _strings(frame, "entity_type")
    descriptions, chunks, docs = _strings(frame, "description"), _strings(frame, "chunk_id"), _strings(frame, "doc_id")
    provenance = {column: _strings(frame, column) for column in PROVENANCE_COLUMNS}
    keys: dict[str, str] = {}
    groups: dict[str, list[int]] = defaultdict(list)
    for row, name in enumerate(names):
        key = keys.get(name)
        if key is None:
            key = keys[name] = normalise_entity_name(name)
        if key:
            groups[key].append(row)
    entity_rows, merge_rows = [], []
    for key, rows in groups.items():
        identifier = entity_id_of_key(key)
        cleaned = Counter(_clean(names[row]) for row in rows)
        canonical = _most_common(cleaned)
        kinds = Counter(_clean(types[row]).casefold() for row in rows)
        texts = Counter(text for row in rows if (text := _clean(descriptions[row])))
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        entity_rows.append({
            "entity_id": identifier, "entity_key": key, "name": canonical, "entity_type": _majority_type(kinds),
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
    entities = pl.DataFrame(entity_rows, schema=ENTITY_SCHEMA).sort("entity_id")
    merges = pl.DataFrame(merge_rows, schema=MERGE_SCHEMA).sort("entity_id", "surface_form")
    return entities, merges


# -- facts ------------------------------------------------------------------------------------


def resolve_facts(frame: pl.DataFrame) -> pl.DataFrame:
    """Group fact rows (one per fact per statement) into Fact nodes with the statements they support.

    ``frame`` has at least ``subject``, ``predicate``, ``object`` and ``statement_id`` (``chunk_id``,
    ``doc_id`` and the provenance columns when present). Rows missing a part are dropped. The
    result (:data:`FACT_SCHEMA`, sorted by ``fact_id``) spells each part in its most frequent form
    and gives the entity ids its subject and object resolve to (whether or not such an entity
    was extracted: the loader links those that exist).
    """
    _require(frame, FACT_COLUMNS, "fact")
    subjects, predicates, objects = (_strings(frame, column) for column in ("subject", "predicate", "object"))
    statements, chunks, docs = (_strings(frame, column) for column in ("statement_id", "chunk_id", "doc_id"))
    provenance = {column: _strings(frame, column) for column in PROVENANCE_COLUMNS}
    groups: dict[str, list[int]] = defaultdict(list)
    keys: dict[tuple[str, str, str], str | None] = {}
    for row in range(frame.height):
        triple = (subjects[row], predicates[row], objects[row])
        if triple not in keys:
            try:
                keys[triple] = fact_key(*triple)
            except ValueError:
                keys[triple] = None
        key = keys[triple]
        if key is not None:
            groups[key].append(row)
    fact_rows = []
    for key, rows in groups.items():
        subject_key, _, object_key = key.split("\x1f")
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        statement_ids = sorted({statements[row] for row in rows if statements[row]})
        fact_rows.append({
            "fact_id": f"fact-{short_hash(key, ID_LENGTH)}",
            "subject": _most_common(Counter(_clean(subjects[row]) for row in rows)),
            "predicate": _most_common(Counter(_clean(predicates[row]) for row in rows)),
            "object": _most_common(Counter(_clean(objects[row]) for row in rows)),
            "subject_entity_id": entity_id_of_key(subject_key), "object_entity_id": entity_id_of_key(object_key),
            "statement_ids": statement_ids, "chunk_ids": sorted({chunks[row] for row in rows if chunks[row]}),
            "doc_ids": doc_ids, "support_count": len(statement_ids), "doc_count": len(doc_ids),
            **{f"{column}s": sorted({values[row] for row in rows if values[row]})
               for column, values in provenance.items()},
        })
    return pl.DataFrame(fact_rows, schema=FACT_SCHEMA).sort("fact_id")


# -- relations --------------------------------------------------------------------------------

CO_OCCURRENCE = "co-occurs with"


def resolve_relations(frame: pl.DataFrame) -> pl.DataFrame:
    """Entity↔entity relations on resolved entity ids, one row per (source, target) pair.

    ``frame`` has ``source``, ``target``, ``predicate``, ``description``, ``strength``, ``chunk_id``
    and ``doc_id``. Co-occurrence has no direction, so its pairs are ordered by id; a pair
    that is one entity after resolution is dropped. ``weight`` sums the strengths (LightRAG's
    edge weight), ``strength`` is the largest, ``predicate`` the most frequent and
    ``predicates`` all of them. Sorted by (source_entity_id, target_entity_id).
    """
    _require(frame, RELATION_COLUMNS, "relation")
    sources, targets = _strings(frame, "source"), _strings(frame, "target")
    predicates, descriptions = _strings(frame, "predicate"), _strings(frame, "description")
    chunks, docs = _strings(frame, "chunk_id"), _strings(frame, "doc_id")
    strengths = [float(value) if value is not None else 0.0 for value in frame.get_column("strength").to_list()]
    keys: dict[str, str] = {}

    def key_of(name: str) -> str:
        if name not in keys:
            keys[name] = normalise_entity_name(name)
        return keys[name]

    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row in range(frame.height):
        source, target, predicate = key_of(sources[row]), key_of(targets[row]), normalise_predicate(predicates[row])
        if not (source and target and predicate) or source == target:
            continue
        first, second = entity_id_of_key(source), entity_id_of_key(target)
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
