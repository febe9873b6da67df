"""The lexical state's table helpers: every document's tables concatenated into one chunk per column, since
polars' replace_strict builds its mapping once per chunk (a rebuild of the combined dev corpora, 3,327
documents, took 40 s and 16 GB in keyed_rows before), with the same resolution keys either way."""
from __future__ import annotations

import polars as pl

from lexgraph.indexing.lexical_state import KEY, PAIR, concat_tables, empty_tables, keyed_rows
from lexgraph.indexing.lexical_tables import stage_frame
from lexgraph.indexing.pipeline import ENTITIES, FACTS, RELATIONS

PROVENANCE = {"extractor": "nlp", "model": "", "prompt_version": "", "extracted_at": None}


def document_tables(n: int) -> dict[str, pl.DataFrame]:
    doc, chunk = f"doc-{n}", f"chunk-{n}"
    tables = empty_tables()
    tables[ENTITIES] = stage_frame(ENTITIES, [
        {"entity_name": name, "entity_type": kind, "description": "", "mention": name, "chunk_id": chunk,
         "doc_id": doc, **PROVENANCE}
        for name, kind in ((f"Vessel {n}", "product"), ("Alpha Shipping", "organization"), ("Dana Frost", "person"))])
    tables[FACTS] = stage_frame(FACTS, [
        {"fact_id": f"f-{n}", "subject": "Dana Frost", "predicate": "runs", "object": f"Vessel {n}",
         "statement_id": f"st-{n}", "chunk_id": chunk, "doc_id": doc, **PROVENANCE}])
    tables[RELATIONS] = stage_frame(RELATIONS, [
        {"source": "Alpha Shipping", "target": f"Vessel {n}", "predicate": "owns", "description": "",
         "strength": 1.0, "chunk_id": chunk, "doc_id": doc, **PROVENANCE}])
    return tables


def test_concatenated_tables_are_one_chunk_per_column():
    tables = concat_tables([document_tables(n) for n in range(60)])
    assert tables[ENTITIES].height == 180 and tables[RELATIONS].height == 60
    for stage in (ENTITIES, FACTS, RELATIONS):
        assert {tables[stage][column].n_chunks() for column in tables[stage].columns} == {1}, stage


def test_resolution_keys_do_not_depend_on_how_the_rows_are_chunked():
    parts = [document_tables(n) for n in range(60)]
    chunked = {stage: pl.concat([p[stage] for p in parts], rechunk=False) for stage in (ENTITIES, FACTS, RELATIONS)}
    assert chunked[ENTITIES]["entity_name"].n_chunks() == 60
    from_chunked, from_concat = keyed_rows(chunked), keyed_rows(concat_tables(parts))
    for stage in (ENTITIES, FACTS, RELATIONS):
        assert from_chunked[stage].equals(from_concat[stage]), stage
    keys = from_concat[ENTITIES][KEY].to_list()
    assert keys.count(keys[1]) == 60 and len(set(keys)) == 62  # one key per name: the 60 vessels, Alpha, Dana
    assert from_concat[FACTS][KEY].null_count() == 0 and from_concat[RELATIONS][PAIR].n_unique() == 60
