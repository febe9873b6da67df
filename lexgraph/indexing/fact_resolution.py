"""Facts and relations across documents, on the resolved entities.

- :func:`lexgraph.indexing.name_keys.fact_id` makes the same (subject, predicate, object) from two
  sources one Fact node; :func:`resolve_facts` groups fact rows into Fact nodes with the statements
  they support. A fact or relation names its ends by strings: a split name
  (:func:`lexgraph.indexing.entity_resolution.entity_senses`) resolves through the entity rows of
  the fact's own chunk (their type there), else to the larger family; a fact about the smaller
  family is its own Fact node.
- :func:`resolve_relations` folds entity↔entity relations onto the resolved ids.

Everything is deterministic: the same rows in any order give the same ids and the same frames.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Mapping

import polars as pl

from lexgraph.indexing.entity_resolution import (PROVENANCE_COLUMNS, EntityIds, Split, clean_text,
                                                 fact_sense_id, merged_descriptions, most_common,
                                                 require_columns, strings_of)
from lexgraph.indexing.name_keys import entity_key, fact_id_of_key, normalise_entity_name, normalise_predicate

FACT_COLUMNS = ("subject", "predicate", "object", "statement_id")
RELATION_COLUMNS = ("source", "target", "predicate", "description", "strength", "chunk_id", "doc_id")

_LIST = pl.List(pl.String)
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


# -- facts ------------------------------------------------------------------------------------


def _fact_identities(frame: pl.DataFrame, senses: Mapping[str, Split]) -> list[tuple[str, str, str] | None]:
    """Per fact row: (fact id, subject entity id, object entity id); None for a row missing a part."""
    subjects, predicates, objects = (strings_of(frame, column) for column in ("subject", "predicate", "object"))
    chunks = strings_of(frame, "chunk_id")
    resolve = EntityIds(senses)
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
    require_columns(frame, FACT_COLUMNS, "fact")
    subjects, predicates, objects = (strings_of(frame, column) for column in ("subject", "predicate", "object"))
    statements, chunks, docs = (strings_of(frame, column) for column in ("statement_id", "chunk_id", "doc_id"))
    provenance = {column: strings_of(frame, column) for column in PROVENANCE_COLUMNS}
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
            "subject": most_common(Counter(clean_text(subjects[row]) for row in rows)),
            "predicate": most_common(Counter(clean_text(predicates[row]) for row in rows)),
            "object": most_common(Counter(clean_text(objects[row]) for row in rows)),
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
    require_columns(frame, RELATION_COLUMNS, "relation")
    sources, targets = strings_of(frame, "source"), strings_of(frame, "target")
    predicates, descriptions = strings_of(frame, "predicate"), strings_of(frame, "description")
    chunks, docs = strings_of(frame, "chunk_id"), strings_of(frame, "doc_id")
    strengths = [float(value) if value is not None else 0.0 for value in frame.get_column("strength").to_list()]
    keys: dict[str, str] = {}
    resolve = EntityIds(senses or {})

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
        texts = Counter(text for row in rows if (text := clean_text(descriptions[row])))
        doc_ids = sorted({docs[row] for row in rows if docs[row]})
        relation_rows.append({
            "source_entity_id": first, "target_entity_id": second, "predicate": most_common(specific),
            "predicates": sorted(named), "description": merged_descriptions(texts),
            "weight": math.fsum(strengths[row] for row in rows), "strength": max(strengths[row] for row in rows),
            "chunk_ids": sorted({chunks[row] for row in rows if chunks[row]}), "doc_ids": doc_ids,
            "support_count": len(rows),
        })
    return pl.DataFrame(relation_rows, schema=RELATION_SCHEMA).sort("source_entity_id", "target_entity_id")
