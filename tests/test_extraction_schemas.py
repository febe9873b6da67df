"""The extraction schemas: what the LLM sees as JSON schema, and how half-right answers are kept sane."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lexgraph.extract.schemas import (
    DEFAULT_ENTITY_TYPES,
    ChunkExtraction,
    ChunkInput,
    Entity,
    ExtractionOutcome,
    Extractor,
    Fact,
    Relation,
    Statement,
    Topic,
    extraction_model,
    normalise_entity_type,
)


def _answer(**overrides) -> dict:
    answer = {
        "topics": [{
            "name": "  Supply\tcontract ",
            "statements": [
                {"text": "  Kestrel Propulsion GmbH   supplies the main engines. ",
                 "facts": [{"subject": "Kestrel Propulsion GmbH", "predicate": " supplies ", "object": "main engines"},
                           {"subject": "Kestrel Propulsion GmbH", "predicate": "", "object": "main engines"},
                           {"subject": "kestrel propulsion gmbh", "predicate": "SUPPLIES", "object": "Main engines"}]},
                {"text": "   ", "facts": []},
            ],
        }, {"name": "empty", "statements": [{"text": ""}]}],
        "entities": [
            {"name": " Kestrel Propulsion GmbH ", "type": "Organisation", "description": "Engine maker.",
             "mention": "Supplier of the engines."},
            {"name": "Annika Vogt", "type": "PERSONS", "description": "CEO of Kestrel.", "mention": "Signs for Kestrel."},
            {"name": "kestrel  propulsion gmbh", "type": "organization", "description": "dup", "mention": "dup"},
            {"name": "   ", "type": "person", "description": "", "mention": ""},
            {"name": "Nordlys Spirit", "type": "spaceship", "description": "A vessel.", "mention": "The ship."},
        ],
        "relations": [
            {"source": "annika vogt", "target": "KESTREL PROPULSION GMBH", "predicate": "leads",
             "description": "She is CEO.", "strength": 0.9},
            {"source": "Annika Vogt", "target": "Unknown Corp", "predicate": "advises", "description": "", "strength": 1},
            {"source": "Annika Vogt", "target": "annika vogt", "predicate": "is", "description": "", "strength": 1},
            {"source": "Nordlys Spirit", "target": "Kestrel Propulsion GmbH", "predicate": "powered by",
             "description": "", "strength": 7},
        ],
    }
    answer.update(overrides)
    return answer


def test_field_names_are_the_agreed_ones():
    assert list(Fact.model_fields) == ["subject", "predicate", "object"]
    assert list(Statement.model_fields) == ["text", "facts"]
    assert list(Topic.model_fields) == ["name", "statements"]
    assert list(Entity.model_fields) == ["name", "type", "description", "mention"]
    assert list(Relation.model_fields) == ["source", "target", "predicate", "description", "strength"]
    assert list(ChunkExtraction.model_fields) == ["topics", "entities", "relations"]
    assert DEFAULT_ENTITY_TYPES == ("person", "organization", "location", "vessel", "contract", "product", "event",
                                    "date", "money", "other")
    assert ChunkExtraction().model_dump() == {"topics": [], "entities": [], "relations": []}


def test_json_schema_describes_every_field_for_the_llm():
    schema = ChunkExtraction.model_json_schema()
    for name, definition in schema["$defs"].items():
        for field, spec in definition["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"
    assert set(schema["properties"]) == {"topics", "entities", "relations"}
    strength = schema["$defs"]["Relation"]["properties"]["strength"]
    assert strength["minimum"] == 0 and strength["maximum"] == 1


def test_validators_strip_drop_and_deduplicate():
    extraction = ChunkExtraction.model_validate(_answer())
    assert [topic.name for topic in extraction.topics] == ["Supply contract"]  # the empty topic went
    [statement] = extraction.topics[0].statements
    assert statement.text == "Kestrel Propulsion GmbH supplies the main engines."
    assert [fact.model_dump() for fact in statement.facts] == [
        {"subject": "Kestrel Propulsion GmbH", "predicate": "supplies", "object": "main engines"}]
    assert [(e.name, e.type) for e in extraction.entities] == [
        ("Kestrel Propulsion GmbH", "organization"), ("Annika Vogt", "person"), ("Nordlys Spirit", "other")]
    assert extraction.entities[0].description == "Engine maker."  # the first of the duplicates wins


def test_relations_must_join_two_entities_of_the_same_extraction():
    extraction = ChunkExtraction.model_validate(_answer())
    assert [(r.source, r.predicate, r.target, r.strength) for r in extraction.relations] == [
        ("Annika Vogt", "leads", "Kestrel Propulsion GmbH", 0.9),  # endpoints spelt as the entities are
        ("Nordlys Spirit", "powered by", "Kestrel Propulsion GmbH", pytest.approx(0.7)),  # 7 of 10
    ]


def test_strength_outside_every_scale_is_an_error():
    with pytest.raises(ValidationError):
        Relation(source="a", target="b", predicate="p", description="", strength=-0.1)
    with pytest.raises(ValidationError):
        Relation(source="a", target="b", predicate="p", description="", strength=250)
    assert Relation(source="a", target="b", predicate="p", description="", strength=55).strength == pytest.approx(0.55)


def test_missing_required_fields_fail_validation_so_the_llm_is_asked_again():
    with pytest.raises(ValidationError):
        ChunkExtraction.model_validate({"entities": [{"name": "X", "type": "person"}]})
    with pytest.raises(ValidationError):
        Statement.model_validate({"facts": []})


def test_configured_types_are_an_enum_in_the_schema_and_unknown_types_become_other():
    model = extraction_model(["Person", "ship", "organisation"])
    assert model is extraction_model(["person", "ship", "organisation"])  # cached per type list
    assert issubclass(model, ChunkExtraction) and model.entity_types == ("person", "ship", "organisation", "other")
    schema = model.model_json_schema()
    assert schema["$defs"]["Entity"]["properties"]["type"]["enum"] == ["person", "ship", "organisation", "other"]
    extraction = model.model_validate(_answer())
    assert [(e.name, e.type) for e in extraction.entities] == [
        ("Kestrel Propulsion GmbH", "organisation"), ("Annika Vogt", "person"), ("Nordlys Spirit", "other")]
    assert all(isinstance(e, Entity) for e in extraction.entities)
    json.dumps(schema)  # serialisable, as instructor sends it


def test_a_validation_context_can_configure_the_types_too():
    extraction = ChunkExtraction.model_validate(_answer(), context={"entity_types": ["person", "vessel", "other"]})
    assert [e.type for e in extraction.entities] == ["other", "person", "other"]
    assert normalise_entity_type("Ships", ["vessel", "other"]) == "vessel"
    assert normalise_entity_type("", DEFAULT_ENTITY_TYPES) == "other"
    assert normalise_entity_type(None, DEFAULT_ENTITY_TYPES) == "other"


def test_statements_iterates_topics_in_order_and_json_round_trips():
    extraction = ChunkExtraction.model_validate(_answer())
    assert [(topic.name, statement.text) for topic, statement in extraction.statements()] == [
        ("Supply contract", "Kestrel Propulsion GmbH supplies the main engines.")]
    again = ChunkExtraction.model_validate_json(extraction.model_dump_json())
    assert again == extraction
    assert ChunkExtraction().empty and not extraction.empty


def test_chunk_input_outcome_and_extractor_protocol():
    chunk = ChunkInput(chunk_id="d-c00000-ab", doc_id="d", text="Hello.", heading_path="A > B")
    outcome = ExtractionOutcome(extraction=ChunkExtraction(), extractor="x", model="m", prompt_version="p")
    assert (outcome.prompt_tokens, outcome.completion_tokens, outcome.seconds, outcome.outcome, outcome.attempts,
            outcome.error) == (0, 0, 0, "ok", 1, None)

    class Echo:
        name, model, prompt_version = "echo", "echo-1", "v1"

        def extract(self, chunk: ChunkInput) -> ExtractionOutcome:
            return ExtractionOutcome(ChunkExtraction(), self.name, self.model, self.prompt_version)

    assert isinstance(Echo(), Extractor)
    assert Echo().extract(chunk).extractor == "echo"
