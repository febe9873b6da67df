"""Entity and fact resolution: one graph across documents, every merge recorded with its reason."""
from __future__ import annotations

import random
import re

import polars as pl
import pytest

from lexgraph.indexing.entity_resolution import (
    ENTITY_SCHEMA,
    MERGE_SCHEMA,
    entity_ids_of_rows,
    entity_senses,
    resolve_entities,
)
from lexgraph.indexing.fact_resolution import FACT_SCHEMA, RELATION_SCHEMA, resolve_facts, resolve_relations
from lexgraph.indexing.name_keys import entity_id, fact_id, merge_reasons, normalise_entity_name
from lexgraph.extract.nlp_extractor import NLPExtractor
from lexgraph.extract.schemas import ChunkInput

_SAFE = re.compile(r"^[a-z0-9._-]+$")


def _entity_rows(rows: list[tuple[str, str, str, str, str]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["entity_name", "entity_type", "description", "chunk_id", "doc_id"], orient="row")


ROWS = [
    ("Kestrel Propulsion GmbH", "organization", "German engine maker.", "contract-c1", "contract"),
    ("Kestrel Propulsion GmbH", "organization", "German engine maker.", "register-c1", "register"),
    ("the Kestrel Propulsion", "organization", "Supplier of the engines.", "email-c1", "email"),
    ("Kestrel Propulsion", "other", "Engine supplier.", "email-c2", "email"),
    ("KESTREL  PROPULSION G.m.b.H.", "organization", "", "memo-c1", "memo"),
    ("Kestrel Dawn", "vessel", "A survey vessel.", "email-c2", "email"),
    ("Annika Vogt", "person", "CEO of Kestrel.", "register-c1", "register"),
    ("Dr. Annika Vogt", "person", "CEO since 2021.", "profile-c1", "profile"),
    ("Gdańsk", "location", "Port city.", "profile-c1", "profile"),
    ("Gdansk", "location", "Port city.", "memo-c1", "memo"),
]


@pytest.mark.parametrize("name", [
    "Kestrel Propulsion GmbH", "Kestrel Propulsion", "the Kestrel Propulsion", "THE KESTREL PROPULSION",
    "Kestrel  Propulsion  G.m.b.H.", "Kestrel Propulsion, GmbH", "Kestrel Propulsion GmbH & Co. KG",
    "A Kestrel Propulsion Ltd.", "kestrel propulsion AS", "Kestrel Propulsion's",
])
def test_names_normalise_to_one_key(name):
    assert normalise_entity_name(name) == "kestrel propulsion"
    assert entity_id(name) == entity_id("Kestrel Propulsion GmbH")


def test_every_listed_legal_suffix_is_stripped():
    for suffix in ("GmbH", "AG", "AS", "ASA", "Ltd", "Limited", "LLC", "Inc", "Inc.", "Corp", "Corporation", "plc",
                   "SA", "S.A.", "BV", "B.V.", "NV", "N.V.", "Co", "Co.", "KG", "Oy", "AB", "SIA", "Pty Ltd"):
        assert normalise_entity_name(f"Nordhav Mutual {suffix}") == "nordhav mutual", suffix


def test_different_entities_stay_apart():
    assert normalise_entity_name("Kestrel Dawn") != normalise_entity_name("Kestrel Propulsion")
    assert entity_id("Kestrel Dawn") != entity_id("Kestrel Propulsion GmbH")
    assert normalise_entity_name("Anna Berg") != normalise_entity_name("Anna Bergh")


@pytest.mark.parametrize("name", ["The GmbH", "GmbH", "A", "the", "AS", "An Ltd", "The Co."])
def test_names_that_are_only_articles_or_suffixes_keep_a_key(name):
    key = normalise_entity_name(name)
    assert key and _SAFE.match(entity_id(name).replace("ent-", ""))


def test_names_without_letters_or_digits():
    assert normalise_entity_name("!!!") == "" and normalise_entity_name("") == ""
    assert entity_id("!!!") != entity_id("???")  # a fallback key, never an empty id
    with pytest.raises(ValueError):
        entity_id("   ")


def test_ids_are_deterministic_and_filesystem_safe():
    identifier = entity_id("Kestrel Propulsion GmbH")
    assert identifier == entity_id("Kestrel Propulsion GmbH") and identifier.startswith("ent-")
    assert _SAFE.match(identifier) and ":" not in identifier and "/" not in identifier
    assert _SAFE.match(fact_id("a/b", "c:d", "e\\f"))


def test_resolve_entities_merges_across_documents_with_reasons():
    entities, merges = resolve_entities(_entity_rows(ROWS))
    assert entities.schema == pl.Schema(ENTITY_SCHEMA) and merges.schema == pl.Schema(MERGE_SCHEMA)
    assert entities.height == 4  # Kestrel Propulsion, Kestrel Dawn, Annika Vogt, Gdansk
    kestrel = entities.filter(pl.col("name") == "Kestrel Propulsion GmbH").row(0, named=True)
    assert kestrel["entity_id"] == entity_id("the Kestrel Propulsion")
    assert kestrel["entity_type"] == "organization"  # the majority; "other" never outvotes a real type
    assert kestrel["doc_ids"] == ["contract", "email", "memo", "register"] and kestrel["doc_count"] == 4
    assert kestrel["chunk_ids"] == ["contract-c1", "email-c1", "email-c2", "memo-c1", "register-c1"]
    assert kestrel["mention_count"] == 5
    assert kestrel["description"].split("\n") == ["German engine maker.", "Engine supplier.", "Supplier of the engines."]
    reasons = {row["surface_form"]: row["reason"] for row in merges.iter_rows(named=True)
               if row["entity_id"] == kestrel["entity_id"]}
    assert reasons == {
        "the Kestrel Propulsion": "leading article; legal suffix GmbH",
        "Kestrel Propulsion": "legal suffix GmbH",
        "KESTREL  PROPULSION G.m.b.H.": "whitespace; case; punctuation",
    }
    dawn = entities.filter(pl.col("name") == "Kestrel Dawn").row(0, named=True)
    assert dawn["entity_type"] == "vessel" and dawn["entity_id"] != kestrel["entity_id"]
    gdansk = merges.filter(pl.col("entity_id") == entity_id("Gdansk"))  # a tie of equal length: the first in order
    assert gdansk.select("canonical_name", "surface_form", "reason").rows() == [("Gdansk", "Gdańsk", "accents")]
    vogt = entities.filter(pl.col("entity_id") == entity_id("Annika Vogt")).row(0, named=True)
    assert vogt["doc_ids"] == ["profile", "register"] and vogt["name"] == "Dr. Annika Vogt"  # tie: the longer form
    assert merges.filter(pl.col("surface_form") == "Annika Vogt")["reason"].to_list() == ["leading title Dr."]


def test_resolution_is_order_independent():
    frame = _entity_rows(ROWS)
    expected = resolve_entities(frame)
    for seed in range(5):
        shuffled = frame.sample(fraction=1.0, shuffle=True, seed=seed)
        entities, merges = resolve_entities(shuffled)
        assert entities.equals(expected[0]) and merges.equals(expected[1])


def test_bad_entity_rows_are_dropped_not_fatal():
    frame = _entity_rows([("", "person", "", "c", "d"), ("!!!", "other", "", "c", "d"), ("The GmbH", "x", "", "c", "d"),
                          ("   ", "person", "", "c", "d")])
    frame = pl.concat([frame, pl.DataFrame({"entity_name": [None], "entity_type": [None], "description": [None],
                                            "chunk_id": ["c"], "doc_id": ["d"]}, schema=frame.schema)])
    entities, merges = resolve_entities(frame)
    assert entities["name"].to_list() == ["The GmbH"] and entities["entity_type"].to_list() == ["x"]
    assert all(entities["entity_id"].str.len_chars() > 4)
    empty, no_merges = resolve_entities(frame.head(0))
    assert empty.height == 0 and no_merges.height == 0 and empty.schema == pl.Schema(ENTITY_SCHEMA)
    with pytest.raises(ValueError, match="doc_id"):
        resolve_entities(frame.drop("doc_id"))


def test_provenance_columns_are_carried():
    frame = _entity_rows(ROWS[:3]).with_columns(
        extractor=pl.Series(["openai", "heuristic", "heuristic"]), model=pl.Series(["gpt", "heuristic-v1", "heuristic-v1"]),
        prompt_version=pl.Series(["p1", "h1", "h1"]))
    entities, _ = resolve_entities(frame)
    row = entities.row(0, named=True)
    assert (row["extractors"], row["models"], row["prompt_versions"]) == (
        ["heuristic", "openai"], ["gpt", "heuristic-v1"], ["h1", "p1"])


def test_merge_reasons():
    assert merge_reasons("Kestrel Propulsion GmbH", "Kestrel Propulsion GmbH") == []
    assert merge_reasons("kestrel propulsion gmbh", "Kestrel Propulsion GmbH") == ["case"]
    assert merge_reasons("Skagerrak Bunkering AS", "Skagerrak Bunkering ASA") == [
        "legal suffix AS", "legal suffix ASA"]
    assert merge_reasons("Smith GmbH & Co. KG", "Smith") == [
        "legal suffix GmbH", "legal suffix Co.", "legal suffix KG"]
    assert merge_reasons("MV Nordlys Spirit", "Nordlys Spirit") == ["leading title MV"]
    assert merge_reasons("M/V Nordlys Spirit", "the Nordlys Spirit") == ["leading article", "leading title M/V"]


FACTS = [
    ("Kestrel Propulsion GmbH", "is a subsidiary of", "Ostwind Industrieholding AG", "s1", "profile-c1", "profile"),
    ("the Kestrel Propulsion", "Is a  subsidiary of", "Ostwind Industrieholding", "s2", "register-c1", "register"),
    ("Kestrel Propulsion", "is a subsidiary of", "Ostwind Industrieholding AG", "s2", "register-c1", "register"),
    ("Kestrel Dawn", "is a subsidiary of", "Ostwind Industrieholding AG", "s3", "email-c1", "email"),
    ("Kestrel Propulsion GmbH", "", "Ostwind", "s4", "email-c1", "email"),
]


def _fact_rows(rows) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["subject", "predicate", "object", "statement_id", "chunk_id", "doc_id"],
                        orient="row")


def test_the_same_fact_from_two_documents_is_one_fact_supporting_both_statements():
    assert fact_id("Kestrel Propulsion GmbH", "is a subsidiary of", "Ostwind Industrieholding AG") == fact_id(
        "the Kestrel Propulsion", "IS A  SUBSIDIARY OF", "ostwind industrieholding")
    assert fact_id("Kestrel Dawn", "is a subsidiary of", "Ostwind") != fact_id("Kestrel Propulsion", "is a subsidiary of",
                                                                               "Ostwind")
    assert fact_id("A", "owns", "B") != fact_id("B", "owns", "A")
    facts = resolve_facts(_fact_rows(FACTS))
    assert facts.schema == pl.Schema(FACT_SCHEMA) and facts.height == 2  # the fact without predicate is dropped
    shared = facts.filter(pl.col("support_count") == 2).row(0, named=True)
    assert shared["statement_ids"] == ["s1", "s2"] and shared["doc_ids"] == ["profile", "register"]
    assert shared["fact_id"] == fact_id("Kestrel Propulsion GmbH", "is a subsidiary of", "Ostwind Industrieholding AG")
    assert shared["subject_entity_id"] == entity_id("Kestrel Propulsion GmbH")
    assert shared["object_entity_id"] == entity_id("Ostwind Industrieholding AG")
    assert shared["object"] == "Ostwind Industrieholding AG" and shared["predicate"] == "is a subsidiary of"
    with pytest.raises(ValueError):
        fact_id("", "owns", "B")


def test_fact_resolution_is_order_independent():
    frame = _fact_rows(FACTS)
    expected = resolve_facts(frame)
    for seed in range(5):
        assert resolve_facts(frame.sample(fraction=1.0, shuffle=True, seed=seed)).equals(expected)
    assert resolve_facts(frame.head(0)).height == 0


def test_relations_fold_onto_resolved_entities():
    frame = pl.DataFrame(
        [("Kestrel Propulsion GmbH", "Annika Vogt", "co-occurs with", "Both named.", 0.5, "c1", "d1"),
         ("Annika Vogt", "the Kestrel Propulsion", "co-occurs with", "Both again.", 0.5, "c2", "d2"),
         ("Annika Vogt", "Kestrel Propulsion", "leads", "She leads it.", 0.9, "c3", "d3"),
         ("Kestrel Propulsion GmbH", "the Kestrel Propulsion", "is", "Self.", 1.0, "c4", "d4")],
        schema=["source", "target", "predicate", "description", "strength", "chunk_id", "doc_id"], orient="row")
    relations = resolve_relations(frame)
    assert relations.schema == pl.Schema(RELATION_SCHEMA)
    kestrel, vogt = entity_id("Kestrel Propulsion GmbH"), entity_id("Annika Vogt")
    pairs = {(row["source_entity_id"], row["target_entity_id"], row["predicate"]): row
             for row in relations.iter_rows(named=True)}
    assert (vogt, kestrel, "leads") in pairs and len(pairs) == 2  # the self-relation is gone
    co = next(row for key, row in pairs.items() if key[2] == "co-occurs with")
    assert co["weight"] == pytest.approx(1.0) and co["doc_ids"] == ["d1", "d2"] and co["support_count"] == 2
    assert resolve_relations(frame.reverse()).equals(relations)


def test_offline_extractions_resolve_across_documents():
    extractor = NLPExtractor()
    texts = {"profile": "Kestrel Propulsion GmbH is a German manufacturer. Dr. Annika Vogt joined Kestrel in 2011.",
             "email": "Annika Vogt of the Kestrel Propulsion signed the delivery note in Kiel.",
             "vessel": "The MV Kestrel Dawn sailed from Bergen."}
    rows = []
    for doc, text in texts.items():
        for entity in extractor.extract(ChunkInput(f"{doc}-c1", doc, text)).extraction.entities:
            rows.append((entity.name, entity.type, entity.description, f"{doc}-c1", doc))
    random.Random(0).shuffle(rows)
    entities, merges = resolve_entities(_entity_rows(rows))
    by_key = {row["entity_key"]: row for row in entities.iter_rows(named=True)}
    assert by_key["kestrel propulsion"]["doc_ids"] == ["email", "profile"]
    assert by_key["annika vogt"]["doc_ids"] == ["email", "profile"]  # "Dr. Annika Vogt" and "Annika Vogt"
    assert by_key["annika vogt"]["entity_type"] == "person"
    assert by_key["kestrel dawn"]["entity_type"] == "vessel"
    assert "Kestrel Propulsion" in merges["surface_form"].to_list()


# -- types: a person and a place of one name ----------------------------------------------------

JORDAN = [
    ("Jordan", "person", "Engineer at Kestrel.", "cv-c1", "cv"),
    ("jordan", "organization", "", "cv-c1", "cv"),  # NER noise in a chunk that calls Jordan a person
    ("Jordan", "location", "Country in the Middle East.", "atlas-c1", "atlas"),
    ("Jordan", "location", "Kingdom east of the river.", "atlas-c2", "atlas"),
    ("JORDAN", "other", "", "memo-c1", "memo"),  # untyped, in a chunk that types no Jordan: the larger family
    ("Amman", "location", "Capital.", "atlas-c1", "atlas"),
]
JORDAN_FACTS = [
    ("Jordan", "works at", "Kestrel Propulsion", "s1", "cv-c1", "cv"),
    ("Jordan", "borders", "Israel", "s2", "atlas-c1", "atlas"),
    ("Jordan", "borders", "Israel", "s3", "news-c1", "news"),  # no entity rows in that chunk: the larger family
    ("Jordan", "works at", "Kestrel Propulsion", "s4", "atlas-c2", "atlas"),  # the place's chunk: the place's fact
]


def test_a_person_and_a_place_of_one_name_stay_two_entities_each_with_its_facts():
    frame = _entity_rows(JORDAN)
    senses = entity_senses(frame)
    assert list(senses) == ["jordan"] and senses["jordan"].major == "location"  # 2 typed mentions against 1
    entities, merges = resolve_entities(frame)
    jordan = {row["entity_type"]: row for row in entities.iter_rows(named=True) if row["entity_key"] == "jordan"}
    assert set(jordan) == {"person", "location"}
    place, person = jordan["location"], jordan["person"]
    assert place["entity_id"] == entity_id("Jordan")  # the larger family keeps the name's id
    assert person["entity_id"] != place["entity_id"] and _SAFE.match(person["entity_id"])
    assert person["chunk_ids"] == ["cv-c1"] and person["mention_count"] == 2  # the ORG row of its chunk joined it
    assert place["doc_ids"] == ["atlas", "memo"] and place["mention_count"] == 3  # the untyped row joined the place
    assert "Engineer at Kestrel." not in place["description"]
    apart = {row["entity_id"]: row for row in merges.iter_rows(named=True) if row["reason"].startswith("kept apart")}
    assert apart[person["entity_id"]]["reason"] == (
        f"kept apart from the location Jordan ({place['entity_id']}): types person vs location "
        "(1 vs 2 typed mentions)")
    assert apart[place["entity_id"]]["reason"].startswith(f"kept apart from the person Jordan ({person['entity_id']})")
    assert apart[place["entity_id"]]["doc_ids"] == ["cv"] and apart[place["entity_id"]]["mention_count"] == 0
    folded = merges.filter(pl.col("entity_id") == place["entity_id"], ~pl.col("reason").str.starts_with("kept"))
    assert folded.select("surface_form", "reason").rows() == [("JORDAN", "case")]  # merge reasons as before

    facts = resolve_facts(_fact_rows(JORDAN_FACTS), senses)
    by_subject = {(row["subject_entity_id"], row["predicate"]): row for row in facts.iter_rows(named=True)}
    assert set(by_subject) == {(person["entity_id"], "works at"), (place["entity_id"], "borders"),
                               (place["entity_id"], "works at")}
    assert by_subject[(place["entity_id"], "borders")]["statement_ids"] == ["s2", "s3"]
    assert by_subject[(place["entity_id"], "borders")]["fact_id"] == fact_id("Jordan", "borders", "Israel")
    works = by_subject[(person["entity_id"], "works at")]
    assert works["statement_ids"] == ["s1"] and works["fact_id"] != fact_id("Jordan", "works at", "Kestrel Propulsion")
    assert resolve_facts(_fact_rows(JORDAN_FACTS)).height == 2  # without types: one entity, as before

    relations = pl.DataFrame(
        [("Jordan", "Amman", "has capital", "", 1.0, "atlas-c1", "atlas"),
         ("Jordan", "Kestrel Propulsion", "works at", "", 1.0, "cv-c1", "cv")],
        schema=["source", "target", "predicate", "description", "strength", "chunk_id", "doc_id"], orient="row")
    relations = resolve_relations(relations, senses)
    assert dict(zip(relations["predicate"], relations["source_entity_id"])) == {
        "has capital": place["entity_id"], "works at": person["entity_id"]}
    mentions = dict(zip(zip(frame["entity_name"], frame["chunk_id"]), entity_ids_of_rows(frame, senses)))
    assert mentions[("jordan", "cv-c1")] == person["entity_id"]
    assert mentions[("JORDAN", "memo-c1")] == place["entity_id"]


def test_a_split_is_order_independent_and_a_tie_goes_to_the_first_family():
    frame = _entity_rows(JORDAN)
    expected = resolve_entities(frame)
    facts = resolve_facts(_fact_rows(JORDAN_FACTS), entity_senses(frame))
    for seed in range(5):
        shuffled = frame.sample(fraction=1.0, shuffle=True, seed=seed)
        entities, merges = resolve_entities(shuffled)
        assert entities.equals(expected[0]) and merges.equals(expected[1])
        senses = entity_senses(shuffled)
        shuffled_facts = _fact_rows(JORDAN_FACTS).sample(fraction=1.0, shuffle=True, seed=seed)
        assert resolve_facts(shuffled_facts, senses).equals(facts)
    tie = _entity_rows([JORDAN[0], JORDAN[2]])
    assert entity_senses(tie)["jordan"].major == "location"
    assert resolve_entities(tie)[0].filter(pl.col("entity_id") == entity_id("Jordan"))["entity_type"].to_list() == [
        "location"]


def test_without_a_person_and_a_place_nothing_changes():
    """A person that NER also calls an organization, or a name only ever untyped, is one entity with the name's id."""
    rows = [("Morgan Hale", "person", "", "a-c1", "a"), ("Morgan Hale", "organization", "", "b-c1", "b"),
            ("Morgan Hale", "organization", "", "c-c1", "c"), ("Morgan Hale", "other", "", "d-c1", "d"),
            ("Bergen", "location", "", "a-c1", "a"), ("Bergen", "other", "", "b-c1", "b")]
    frame = _entity_rows(rows)
    assert entity_senses(frame) == {}
    entities, merges = resolve_entities(frame)
    assert entities["entity_id"].sort().to_list() == sorted([entity_id("Morgan Hale"), entity_id("Bergen")])
    assert entities.filter(pl.col("name") == "Morgan Hale")["entity_type"].to_list() == ["organization"]
    assert merges.height == 0
    assert entity_ids_of_rows(frame).to_list() == [entity_id(name) for name, *_ in rows]
