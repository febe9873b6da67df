"""What one chunk's extraction is: the lexical graph's Statement / Topic / Fact / Entity / Relation.

One :class:`ChunkExtraction` per chunk, produced by any :class:`Extractor` (the LLM through
instructor, or the offline NLP one). The pydantic models are the LLM's response model, so their
field descriptions are the JSON schema it sees, and their validators are what keeps a
half-right answer usable instead of failing it:

- every string is stripped and its inner whitespace collapsed;
- statements without text, facts missing a part, topics without statements and entities
  without a name are dropped;
- an entity named twice in one chunk is kept once (its first type, the first non-empty
  description and mention);
- a relation whose endpoints are not both entities of the same extraction, or that links an
  entity to itself, is dropped; endpoints are rewritten to the entity's spelling;
- an entity type outside the configured list becomes "other" (after mapping common synonyms:
  "organisation", "company" → "organization", "ship" → "vessel", ...);
- a relation strength given on a 0–10 or 0–100 scale is rescaled to 0–1.

The allowed entity types come from :func:`extraction_model` (a subclass whose JSON schema lists
them as an enum) or from a validation context ``{"entity_types": [...]}``; without either,
:data:`DEFAULT_ENTITY_TYPES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Iterable, Iterator, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator

from lexgraph.defaults import DEFAULT_ENTITY_TYPES

FALLBACK_TYPE = "other"

_TYPE_SYNONYMS: dict[str, str] = {
    "organisation": "organization", "org": "organization", "company": "organization",
    "corporation": "organization", "institution": "organization", "agency": "organization",
    "firm": "organization", "business": "organization", "people": "person", "human": "person",
    "individual": "person", "per": "person", "place": "location", "loc": "location", "gpe": "location",
    "city": "location", "country": "location", "geo": "location", "ship": "vessel", "boat": "vessel",
    "agreement": "contract", "time": "date", "datetime": "date", "amount": "money", "currency": "money",
    "price": "money", "misc": "other", "unknown": "other",
}


def clean_text(value: Any) -> str:
    """A string with surrounding whitespace stripped and inner runs of whitespace collapsed."""
    if value is None:
        return ""
    return " ".join(str(value).split())


def name_key(name: str) -> str:
    """How names are matched inside one extraction: case and whitespace do not count."""
    return clean_text(name).casefold()


def normalise_entity_type(value: Any, allowed: Iterable[str]) -> str:
    """``value`` as one of ``allowed`` (case, spacing, plurals and common synonyms forgiven), else "other"."""
    allowed = tuple(allowed)
    word = clean_text(value).casefold().replace("-", " ").replace(" ", "_")
    candidates = [word, _TYPE_SYNONYMS.get(word, "")]
    if word.endswith("s"):
        candidates += [word[:-1], _TYPE_SYNONYMS.get(word[:-1], "")]
    for candidate in candidates:
        for spelling in (candidate, candidate.replace("ization", "isation"), candidate.replace("isation", "ization")):
            if spelling and spelling in allowed:
                return spelling
    return FALLBACK_TYPE


def _allowed_types(cls: type, info: ValidationInfo | None) -> tuple[str, ...]:
    """The class's own types when :func:`extraction_model` configured them, else the context's, else the defaults."""
    if getattr(cls, "configured_types", False):
        return cls.entity_types  # type: ignore[attr-defined]
    context = info.context if info is not None else None
    if isinstance(context, dict) and context.get("entity_types"):
        return tuple(context["entity_types"])
    return getattr(cls, "entity_types", DEFAULT_ENTITY_TYPES)


class _Clean(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def _strip_strings(cls, value: Any) -> Any:
        return clean_text(value) if isinstance(value, str) else value


class Fact(_Clean):
    """One (subject, predicate, object) triple a statement asserts."""

    subject: str = Field(description="The entity the fact is about, named as in the entities list where it is one.")
    predicate: str = Field(description="A short verb phrase, e.g. 'is a subsidiary of', 'signed', 'chief executive'.")
    object: str = Field(description="The other entity, or a value such as a date, an amount or a quantity.")

    @property
    def complete(self) -> bool:
        return bool(self.subject and self.predicate and self.object)


class Statement(_Clean):
    """One standalone claim from the chunk: evidence that can be read without the chunk around it."""

    text: str = Field(
        description="One claim in one sentence, understandable alone: pronouns and references such as "
        "'the company' or 'he' replaced by the names they stand for."
    )
    facts: list[Fact] = Field(
        default_factory=list, description="The (subject, predicate, object) facts this statement asserts; may be empty."
    )

    @field_validator("facts", mode="after")
    @classmethod
    def _complete_facts(cls, facts: list[Fact]) -> list[Fact]:
        seen: set[tuple[str, str, str]] = set()
        kept = []
        for fact in facts:
            key = (name_key(fact.subject), name_key(fact.predicate), name_key(fact.object))
            if fact.complete and key not in seen:
                seen.add(key)
                kept.append(fact)
        return kept


class Topic(_Clean):
    """A subject the chunk's source discusses, with the statements made about it here."""

    name: str = Field(description="A short name for the topic, e.g. the section heading or what the statements share.")
    statements: list[Statement] = Field(description="The standalone statements about this topic.")

    @field_validator("name", mode="after")
    @classmethod
    def _named(cls, name: str) -> str:
        return name or "general"

    @field_validator("statements", mode="after")
    @classmethod
    def _with_text(cls, statements: list[Statement]) -> list[Statement]:
        return [statement for statement in statements if statement.text]


class Entity(_Clean):
    """A named thing the chunk mentions."""

    entity_types: ClassVar[tuple[str, ...]] = DEFAULT_ENTITY_TYPES
    configured_types: ClassVar[bool] = False

    name: str = Field(description="The entity's full name as written, e.g. 'Kestrel Propulsion GmbH', 'Annika Vogt'.")
    type: str = Field(description="The entity type, one of: " + ", ".join(DEFAULT_ENTITY_TYPES) + ".")
    description: str = Field(description="One or two sentences on what the entity is, from this chunk.")
    mention: str = Field(description="One line on how the entity appears in this chunk (its role in the text).")

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any, info: ValidationInfo) -> str:
        return normalise_entity_type(value, _allowed_types(cls, info))


class Relation(_Clean):
    """A relationship between two entities of the same extraction."""

    source: str = Field(description="Name of the source entity, exactly as in the entities list.")
    target: str = Field(description="Name of the target entity, exactly as in the entities list.")
    predicate: str = Field(description="A short verb phrase for the relationship, e.g. 'supplies engines to'.")
    description: str = Field(description="One sentence explaining the relationship as this chunk states it.")
    strength: float = Field(ge=0, le=1, description="How strong or explicit the relationship is, from 0 to 1.")

    @field_validator("strength", mode="before")
    @classmethod
    def _unit_scale(cls, value: Any) -> Any:
        """Models often answer on LightRAG's 1-10 scale or in percent; bring those to 0-1."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            return value
        if 1 < number <= 10:
            return number / 10
        if 10 < number <= 100:
            return number / 100
        return number


class ChunkExtraction(_Clean):
    """Everything extracted from one chunk: topics with their statements and facts, entities, relations."""

    entity_types: ClassVar[tuple[str, ...]] = DEFAULT_ENTITY_TYPES
    configured_types: ClassVar[bool] = False

    topics: list[Topic] = Field(default_factory=list, description="Topics, each with its standalone statements.")
    entities: list[Entity] = Field(default_factory=list, description="The named entities in the chunk.")
    relations: list[Relation] = Field(
        default_factory=list, description="Relationships between entities listed above (by their exact names)."
    )

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "ChunkExtraction":
        allowed = _allowed_types(type(self), info)
        self.topics = [topic for topic in self.topics if topic.statements]
        entities: dict[str, Entity] = {}
        for entity in self.entities:
            if not entity.name:
                continue
            entity.type = normalise_entity_type(entity.type, allowed)
            first = entities.setdefault(name_key(entity.name), entity)
            if first is not entity:
                first.description = first.description or entity.description
                first.mention = first.mention or entity.mention
        self.entities = list(entities.values())
        relations: dict[tuple[str, str, str], Relation] = {}
        for relation in self.relations:
            source, target = entities.get(name_key(relation.source)), entities.get(name_key(relation.target))
            if source is None or target is None or source is target or not relation.predicate:
                continue
            relation.source, relation.target = source.name, target.name
            relations.setdefault((name_key(source.name), name_key(target.name), name_key(relation.predicate)), relation)
        self.relations = list(relations.values())
        return self

    def statements(self) -> Iterator[tuple[Topic, Statement]]:
        """Every (topic, statement) pair, in order."""
        for topic in self.topics:
            for statement in topic.statements:
                yield topic, statement

    @property
    def empty(self) -> bool:
        return not (self.topics or self.entities or self.relations)


@lru_cache(maxsize=32)
def _model_for(entity_types: tuple[str, ...]) -> type[ChunkExtraction]:
    kind = Literal[entity_types]  # type: ignore[valid-type]
    typed_entity = create_model(
        "Entity",
        __base__=Entity,
        __doc__=Entity.__doc__,
        type=(kind, Field(description="The entity type, one of: " + ", ".join(entity_types) + ".")),
    )
    typed_entity.entity_types = entity_types
    typed_entity.configured_types = True
    model = create_model(
        "ChunkExtraction",
        __base__=ChunkExtraction,
        __doc__=ChunkExtraction.__doc__,
        entities=(list[typed_entity], Field(default_factory=list, description="The named entities in the chunk.")),
    )
    model.entity_types = entity_types
    model.configured_types = True
    return model


def extraction_model(entity_types: Iterable[str] | None = None) -> type[ChunkExtraction]:
    """The response model for a configured list of entity types ("other" is always allowed).

    The model's JSON schema lists the types as an enum; an answer with any other type is
    validated to "other" rather than rejected. Same types → the same class (cached).
    """
    if entity_types is None:
        return _model_for(DEFAULT_ENTITY_TYPES)
    names: list[str] = []
    for name in entity_types:
        word = clean_text(name).casefold().replace(" ", "_")
        if word and word not in names:
            names.append(word)
    if FALLBACK_TYPE not in names:
        names.append(FALLBACK_TYPE)
    return _model_for(tuple(names))


@dataclass(frozen=True)
class ChunkInput:
    """One chunk to extract from. ``heading_path`` is the chunk's headings joined by " > "."""

    chunk_id: str
    doc_id: str
    text: str
    heading_path: str = ""


@dataclass
class ExtractionOutcome:
    """One extraction and what it cost: the record an auditor and the cost ledger read."""

    extraction: ChunkExtraction
    extractor: str
    model: str
    prompt_version: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0
    outcome: str = "ok"
    attempts: int = 1
    error: str | None = None


@runtime_checkable
class Extractor(Protocol):
    """Anything that turns a chunk into a :class:`ChunkExtraction`."""

    name: str
    model: str
    prompt_version: str

    def extract(self, chunk: ChunkInput) -> ExtractionOutcome: ...
