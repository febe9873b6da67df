"""The LLM-free extractor: the lexical graph of every chunk from spaCy's English pipeline, at no model cost.

The chunk is first read as lines (lexgraph.extract.text_lines: headings, tables, chat speakers); then
every line is parsed by en_core_web_sm (lexgraph.extract.nlp), in batches through ``nlp.pipe``.

- **Statements** are spaCy's sentences (cut at word boundaries past 600 characters). A chat line's
  statements keep their speaker ("Li Hua: ..."). A subject "he"/"she" that refers to the previous
  sentence's subject person, or "it" to its subject thing, is replaced by that name, so the statement
  reads alone; in a chat line "I" is the speaker.
- **Entities** are NER spans, typed by :data:`NER_TYPES` (a label with no mapping becomes "other";
  numbers, percentages and quantities are values, not entities; a date or time needs a digit). A span is
  widened to the proper nouns it is compounded with ("Kestrel Propulsion" + "GmbH"), and a leading
  article or vessel prefix is dropped ("MV Nordlys Spirit" is the vessel Nordlys Spirit). Noun chunks join
  them only where they name something: a proper-noun head, or a head noun with a proper-noun or title
  modifier; such a chunk is typed by its head noun (:data:`HEAD_NOUN_TYPES`) or "other". A chat speaker is
  a person. An entity's type is the majority of its labels in the chunk; a one-word name that ends exactly
  one longer person's name, or starts exactly one longer name, is that entity ("Vogt" → "Annika Vogt").
- **Facts** come from the dependency parse: subject–verb–object, the verb's prepositional objects
  ("was born in" Putney), passive agents ("published by"), copulas ("X is the chief executive of Y"),
  appositions ("Annika Vogt, CEO of Kestrel") and conjoined objects. The subject must be an entity (or a
  pronoun resolved to one); the object is an entity, a value or a noun phrase. A table row gives
  (first cell, column header, cell).
- **Relations** are the facts between two entities (strength 0.9). Two entities named in one sentence
  that no fact of the chunk relates are "co-occurs with", a weak fallback (strength ≤ 0.5, growing with
  the sentences they share): the parse relates a subject to its objects, not the objects to each other
  or to a name in a subordinate clause, and the entity hop and path walk run on relations. A table row
  has none: its cells relate to its first cell.
- **Topics**: the chunk's heading; without one, its main noun phrases (the most frequent subjects and
  objects, chat speakers excluded).

Deterministic and offline. Changing a rule means changing :data:`RULES_VERSION`: its hash is the
extractor's prompt version, so `lexgraph reextract` (or a Dagster backfill) redoes the extractions.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from lexgraph.extract import nlp as nlp_model
from lexgraph.extract.dependency_facts import LEADING, SUBJECTS, VALUE_LABELS, SentenceFacts
from lexgraph.extract.schemas import (
    ChunkExtraction,
    ChunkInput,
    ExtractionOutcome,
    Fact,
    Relation,
    Statement,
    Topic,
    extraction_model,
    normalise_entity_type,
)
from lexgraph.extract.text_lines import Line, pieces, read_lines, trim
from lexgraph.ids import short_hash

RULES_VERSION = ("nlp-rules v1: en_core_web_sm 3.8.0 sentences, NER types, named noun chunks and heading names, "
                 "proper-noun runs, compact timestamps, dependency facts, "
                 "pronoun subjects, fact relations, weak co-occurrence of every pair no fact relates")
DISABLED = ("lemmatizer",)  # the rest (tagger, attribute_ruler for POS, parser, ner) is used
NER_TYPES: dict[str, str] = {
    "PERSON": "person", "ORG": "organization", "GPE": "location", "LOC": "location", "FAC": "location",
    "PRODUCT": "product", "EVENT": "event", "LAW": "contract", "DATE": "date", "TIME": "date", "MONEY": "money",
    "NORP": "other", "WORK_OF_ART": "other", "LANGUAGE": "other",
}
HEAD_NOUN_TYPES: dict[str, str] = {
    **dict.fromkeys("contract agreement charter amendment award lease licence license policy".split(), "contract"),
    **dict.fromkeys("vessel ship tanker carrier ferry barge tug yacht trawler".split(), "vessel"),
    **dict.fromkeys("engine engines system platform software model series device".split(), "product"),
}
VESSEL_PREFIXES = frozenset({"MV", "M/V", "MT", "M/T", "MS", "M/S", "SS", "RV", "FV", "HMS"})
MENTION_CHARS = 160
DESCRIPTION_CHARS = 240
MAX_PAIR_ENTITIES = 12  # co-occurrence pairs are quadratic in a sentence's entities
FACT_STRENGTH = 0.9
CO_OCCURRENCE = "co-occurs with"
TOPIC_PHRASES = 3
MAX_LINE_CHARS = 20_000  # a longer line is parsed in pieces (spaCy's cost grows with a text's length)

_PERSONAL = {"he": "person", "she": "person", "him": "person", "her": "person", "it": "thing"}
_DIGIT = re.compile(r"\d")
# a compact timestamp, as chat logs and file names write dates: 20260924 or 20260924_17:00 (NER misses them)
_COMPACT_DATE = re.compile(r"^(20\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]))(?:[_T]\d{1,2}:\d{2}(?::\d{2})?)?$")
_NAMED_POS = frozenset({"PROPN"})


@dataclass
class _Mention:
    start: int  # token indexes in the line's Doc; -1 for a speaker
    end: int
    name: str
    kind: str


@dataclass
class _Entity:
    name: str
    order: int
    kinds: Counter = field(default_factory=Counter)
    mention: str = ""
    description: str = ""
    defined: bool = False
    aliases: list[str] = field(default_factory=list)


@dataclass
class _Sentence:
    line: Line
    text: str  # as the statement reads (speaker prefix, resolved pronoun)
    keys: list[str]  # entity keys named in it, in order
    facts: list[tuple[str, str, str]]
    subject_key: str | None = None


def _clean_name(tokens) -> tuple[str, bool]:
    """The name the tokens spell, without a leading article or vessel prefix; and whether a prefix was there."""
    words = [t for t in tokens]
    vessel = False
    while words and (words[0].lower_ in LEADING or words[0].text in VESSEL_PREFIXES or words[0].pos_ == "INTJ"
                     or not any(c.isalnum() for c in words[0].text)):  # "Hey Jennifer", "🎉 Things"
        vessel = vessel or words[0].text in VESSEL_PREFIXES
        words = words[1:]
    if words and words[-1].text in ("'s", "’s"):
        words = words[:-1]
    text = " ".join("".join(t.text_with_ws for t in words).strip().rstrip(".,;:!?").split())
    return (text if len(text) > 1 else ""), vessel


class NLPExtractor:
    """Sentences as statements, NER-typed entities, dependency facts and relations, heading or noun-chunk topics."""

    name = "nlp"
    model = f"spacy-en_{nlp_model.MODEL_NAME}-{nlp_model.MODEL_VERSION}"
    prompt_version = short_hash(RULES_VERSION, 12)

    def __init__(self, entity_types: Iterable[str] | None = None, batch_size: int = 256) -> None:
        self.response_model = extraction_model(entity_types)
        self.entity_types = self.response_model.entity_types
        self.batch_size = batch_size
        self._types: dict[str, str] = {}

    # -- public -------------------------------------------------------------------------------

    def extract(self, chunk: ChunkInput) -> ExtractionOutcome:
        return self.extract_many([chunk])[0]

    def extract_many(self, chunks: Sequence[ChunkInput]) -> list[ExtractionOutcome]:
        """Every chunk's extraction, their lines parsed in one ``nlp.pipe`` stream; seconds shared evenly."""
        started = time.perf_counter()
        extractions = self.extract_texts([(chunk.text, chunk.heading_path) for chunk in chunks])
        seconds = (time.perf_counter() - started) / max(1, len(chunks))
        return [ExtractionOutcome(extraction=extraction, extractor=self.name, model=self.model,
                                  prompt_version=self.prompt_version, seconds=seconds)
                for extraction in extractions]

    def extract_text(self, text: str, heading_path: str = "") -> ChunkExtraction:
        return self.extract_texts([(text, heading_path)])[0]

    def extract_texts(self, texts: Sequence[tuple[str, str]]) -> list[ChunkExtraction]:
        lines_of = [read_lines(text, heading) if text and text.strip() else [] for text, heading in texts]
        docs: dict[tuple[int, int], list] = {}
        parts = [(c, i, piece) for c, lines in enumerate(lines_of) for i, line in enumerate(lines)
                 if line.kind != "table" for piece in pieces(line.text, MAX_LINE_CHARS)]
        # a table's cells are parsed one by one: a row read as one sentence confuses the tagger and NER
        parts += [(c, i, cell) for c, lines in enumerate(lines_of) for i, line in enumerate(lines)
                  if line.kind == "table" for _, cell in line.cells]
        for (c, i, _), doc in zip(parts, self._parse([text for _, _, text in parts])):
            docs.setdefault((c, i), []).append(doc)
        # the headings over a chunk's lines name what it is about: their names are the chunk's entities too;
        # the chunks of one section share its heading, parsed once
        topics = [list(dict.fromkeys(line.topic for line in lines if line.topic)) for lines in lines_of]
        unique = list(dict.fromkeys(topic for chunk_topics in topics for topic in chunk_topics))
        heading_doc = dict(zip(unique, self._parse(unique)))
        return [self._chunk(lines, [docs.get((c, i), []) for i in range(len(lines))],
                            [heading_doc[topic] for topic in topics[c]])
                for c, lines in enumerate(lines_of)]

    def _parse(self, texts: list[str]) -> list:
        """spaCy's parses of ``texts``, in order, through one nlp.pipe stream."""
        if not texts:
            return []
        return list(nlp_model.load(DISABLED).pipe(texts, batch_size=self.batch_size))

    # -- one chunk ----------------------------------------------------------------------------

    def _chunk(self, lines: list[Line], line_docs: list[list], heading_docs: list) -> ChunkExtraction:
        if not lines:
            return self.response_model()
        entities: dict[str, _Entity] = {}
        for doc in heading_docs:
            for mention in self._mentions(doc):
                self._remember(entities, mention.name, mention.kind, f"heading: {doc.text}")
        sentences: list[_Sentence] = []
        previous: tuple[str, str] | None = None  # (key, kind) of the last sentence's subject
        speaker = None
        for line, docs in zip(lines, line_docs):
            if line.kind == "chat" and line.speaker != speaker:
                previous, speaker = None, line.speaker  # another voice: "he" starts afresh
            if line.kind == "table":
                sentences.append(self._table_row(line, docs, entities))
                continue
            for doc in docs:
                mentions = self._mentions(doc)
                for sent in doc.sents:
                    found = self._sentence(line, sent, mentions, entities, previous)
                    if found is None:
                        continue
                    sentences.append(found)
                    if found.subject_key is not None:
                        previous = (found.subject_key, self._kind(entities[found.subject_key]))
        if not sentences:
            return self.response_model()
        aliases = self._aliases(entities)
        return self._build(sentences, entities, aliases)

    def _remember(self, entities: dict[str, _Entity], name: str, kind: str, context: str) -> str:
        key = name.casefold()
        entity = entities.get(key)
        if entity is None:
            entity = entities[key] = _Entity(name, len(entities), mention=trim(context, MENTION_CHARS),
                                             description=trim(context, DESCRIPTION_CHARS))
        entity.kinds[kind] += 1
        return key

    def _mentions(self, doc) -> list[_Mention]:
        """Named spans of the doc: NER entities (widened, cleaned), then named noun chunks not already covered."""
        found: list[_Mention] = []
        taken = [False] * len(doc)
        for token in doc:
            date = _COMPACT_DATE.match(token.text) if token.like_num or "_" in token.text else None
            if date and not taken[token.i]:
                found.append(_Mention(token.i, token.i + 1, date.group(1), "date"))
                taken[token.i] = True
        for ent in doc.ents:
            kind = NER_TYPES.get(ent.label_)
            if kind is None or (kind == "date" and not _DIGIT.search(ent.text)):
                continue
            start, end = ent.start, ent.end
            if kind not in ("date", "money"):
                while start > 0 and doc[start - 1].pos_ in _NAMED_POS and doc[start - 1].dep_ == "compound" \
                        and not doc[start - 1].ent_type_:
                    start -= 1
                while end < len(doc) and doc[end].pos_ in _NAMED_POS and doc[end - 1].head.i == end \
                        and not doc[end].ent_type_ and not doc[end - 1].text.endswith("."):
                    end += 1
            if any(taken[start:end]):
                continue
            prefix = start > 0 and doc[start - 1].text in VESSEL_PREFIXES
            name, vessel = _clean_name(doc[start:end])
            if vessel or prefix:
                kind = "vessel"
            if name and any(c.isalnum() for c in name):
                found.append(_Mention(start, end, name, kind))
                taken[start:end] = [True] * (end - start)
        for chunk in doc.noun_chunks:
            root = chunk.root
            if any(taken[chunk.start:chunk.end]) or root.pos_ == "PRON" or root.ent_type_ in VALUE_LABELS:
                continue
            named = root.pos_ in _NAMED_POS
            # a title-case modifier counts inside a sentence; at its start every word is capitalised
            modified = any(child.dep_ in ("compound", "amod") and child.i < root.i and (
                child.pos_ in _NAMED_POS or (child.is_title and child.i != child.sent.start)) for child in root.children)
            if not (named or modified):
                continue
            words = [t for t in chunk if t.pos_ in _NAMED_POS or t.is_title or t.i == root.i or t.lower_ in LEADING
                     or t.text in VESSEL_PREFIXES or (t.like_num and t.i > chunk.start)]
            if named and len(words) == 1 and root.i == root.sent.start:
                continue  # one capitalised word opening a sentence is as often a greeting as a name
            name, vessel = _clean_name(words)
            if not name or not any(c.isalpha() for c in name):
                continue
            kind = "vessel" if vessel else HEAD_NOUN_TYPES.get(root.lower_, "other")
            found.append(_Mention(chunk.start, chunk.end, name, kind))
            taken[chunk.start:chunk.end] = [True] * (chunk.end - chunk.start)
        # runs of proper nouns the parse left outside any noun chunk (headings, fragments): "MV Nordlys Spirit"
        start = None
        for i in range(len(doc) + 1):
            inside = i < len(doc) and doc[i].pos_ in _NAMED_POS and not taken[i] and not doc[i].ent_type_
            if inside and start is None:
                start = i
            elif not inside and start is not None:
                run = doc[start:i]
                if len(run) > 1 or (start != run[0].sent.start and run[0].is_title):
                    name, vessel = _clean_name(run)
                    if name and any(c.isalpha() for c in name):
                        found.append(_Mention(start, i, name, "vessel" if vessel else "other"))
                        taken[start:i] = [True] * (i - start)
                start = None
        found.sort(key=lambda m: m.start)
        return found

    def _sentence(self, line: Line, sent, mentions: list[_Mention], entities: dict[str, _Entity],
                  previous: tuple[str, str] | None) -> _Sentence | None:
        text = sent.text.strip()
        if not text or not any(c.isalnum() for c in text):
            return None
        inside = [m for m in mentions if sent.start <= m.start < sent.end]
        context = f"{line.speaker}: {text}" if line.speaker else text
        keys: list[str] = []
        at: dict[int, str] = {}  # token index -> entity key
        if line.speaker:
            keys.append(self._remember(entities, line.speaker, "person", context))
        for mention in inside:
            key = self._remember(entities, mention.name, mention.kind, context)
            keys.append(key)
            for i in range(mention.start, mention.end):
                at[i] = key
        resolved, replaced = self._subject(sent, line, at, entities, previous)
        if replaced is not None:
            token = replaced
            offset = token.idx - sent.start_char
            text = (sent.text[:offset] + entities[resolved].name + sent.text[offset + len(token.text):]).strip()
            if resolved not in keys:
                keys.append(resolved)
        statement = f"{line.speaker}: {text}" if line.speaker else text
        facts = SentenceFacts(sent, at, resolved).read()
        root_subject = next((t for t in sent.root.children if t.dep_ in SUBJECTS), None)
        subject_key = at.get(root_subject.i) if root_subject is not None else None
        if subject_key is None and replaced is not None:
            subject_key = resolved
        for subject, predicate, _ in facts:  # "X is a ...": the sentence defines X
            if predicate in ("is", "was", "are", "were") and not entities[subject].defined:
                entities[subject].description, entities[subject].defined = trim(context, DESCRIPTION_CHARS), True
        named = [(entities[s].name, p, entities[o].name if o in entities else o) for s, p, o in facts]
        return _Sentence(line, statement, list(dict.fromkeys(keys)), named, subject_key)

    def _subject(self, sent, line: Line, at: dict[int, str], entities: dict[str, _Entity],
                 previous: tuple[str, str] | None):
        """(entity key, replaced token): the root's subject when it is a pronoun that plainly names someone."""
        subject = next((t for t in sent.root.children if t.dep_ in SUBJECTS), None)
        if subject is None or subject.pos_ != "PRON":
            return (at.get(subject.i) if subject is not None else None), None
        word = subject.lower_
        if word == "i" and line.speaker:
            return line.speaker.casefold(), None  # "Li Hua: I ..." already reads alone
        wanted = _PERSONAL.get(word)
        if wanted is None or previous is None:
            return None, None
        key, kind = previous
        if (wanted == "person") != (kind == "person"):
            return None, None
        if wanted == "thing" and (kind in ("date", "money") or any(
                c.dep_ in ("ccomp", "xcomp") for c in sent.root.children)):
            return None, None  # "It is important to ..." names nothing
        return key, subject

    def _table_row(self, line: Line, cell_docs: list, entities: dict[str, _Entity]) -> _Sentence:
        """A table row: the names in its cells are entities, and a cell that is one name is that entity (the
        first cell is one whenever it is capitalised and short); facts run from the first cell to the others,
        with the column header as predicate."""
        keys: list[str] = []
        cell_keys: list[str | None] = []
        for column, ((head, cell), doc) in enumerate(zip(line.cells, cell_docs)):
            mentions = self._mentions(doc)
            for mention in mentions:
                keys.append(self._remember(entities, mention.name, mention.kind, line.text))
            whole = next((m for m in mentions if m.start == 0 and m.end == len(doc)), None)
            if whole is not None:
                cell_keys.append(whole.name.casefold())
            elif column == 0 and cell[:1].isupper() and len(cell.split()) <= 6:
                cell_keys.append(self._remember(entities, cell, "other", line.text))
                keys.append(cell_keys[-1])
            else:
                cell_keys.append(None)
        facts = []
        if cell_keys and cell_keys[0] is not None:
            subject = entities[cell_keys[0]].name
            for (head, cell), key in list(zip(line.cells, cell_keys))[1:]:
                if head and cell:
                    facts.append((subject, head.casefold(), entities[key].name if key else cell))
        return _Sentence(line, line.text, list(dict.fromkeys(keys)), list(dict.fromkeys(facts)), None)

    # -- assembly -----------------------------------------------------------------------------

    @staticmethod
    def _kind(entity: _Entity) -> str:
        specific = [(n, -i, kind) for i, (kind, n) in enumerate(entity.kinds.items()) if kind != "other"]
        return max(specific)[2] if specific else "other"

    def _aliases(self, entities: dict[str, _Entity]) -> dict[str, str]:
        """A one-word name that ends exactly one longer person's name or starts exactly one longer name."""
        firsts: dict[str, list[str]] = {}
        lasts: dict[str, list[str]] = {}
        for key, entity in entities.items():
            words = key.split()
            kind = self._kind(entity)
            if len(words) < 2 or kind in ("date", "money"):
                continue
            firsts.setdefault(words[0], []).append(key)
            if kind == "person":
                lasts.setdefault(words[-1], []).append(key)
        aliases: dict[str, str] = {}
        for key, entity in entities.items():
            if " " in key or self._kind(entity) in ("date", "money"):
                continue
            candidates = sorted(set(firsts.get(key, []) + lasts.get(key, [])))
            if len(candidates) == 1:
                aliases[key] = candidates[0]
        return aliases

    def _known(self, kind: str) -> str:
        if kind not in self._types:
            self._types[kind] = normalise_entity_type(kind, self.entity_types)
        return self._types[kind]

    def _build(self, sentences: list[_Sentence], entities: dict[str, _Entity],
               aliases: dict[str, str]) -> ChunkExtraction:
        for key, target in aliases.items():
            into, alias = entities[target], entities[key]
            into.kinds.update(alias.kinds)
            into.aliases.append(alias.name)
            if alias.order < into.order:
                into.order, into.mention = alias.order, alias.mention
                if not into.defined:
                    into.description = alias.description
        names = {key: entities[aliases.get(key, key)].name for key in entities}
        kinds = {key: self._kind(entity) for key, entity in entities.items() if key not in aliases}
        topics: dict[str, list[dict]] = {}
        related: dict[tuple[str, str], dict] = {}
        together: Counter[tuple[str, str]] = Counter()
        first_together: dict[tuple[str, str], str] = {}
        phrases: Counter[str] = Counter()
        speakers = {line.speaker.casefold() for line in (s.line for s in sentences) if line.speaker}
        for sentence in sentences:
            facts = []
            for subject, predicate, obj in sentence.facts:
                subject = names.get(subject.casefold(), subject)
                obj = names.get(obj.casefold(), obj)
                if subject.casefold() != obj.casefold():
                    facts.append({"subject": subject, "predicate": predicate, "object": obj})
                    if obj.casefold() in names and kinds.get(aliases.get(obj.casefold(), obj.casefold())) \
                            not in ("date", "money"):
                        related.setdefault((subject, obj), {
                            "source": subject, "target": obj, "predicate": predicate,
                            "description": trim(sentence.text, DESCRIPTION_CHARS), "strength": FACT_STRENGTH})
            parts = list(pieces(sentence.text)) or [sentence.text]  # an over-long sentence: its facts on the first
            topics.setdefault(sentence.line.topic or "", []).extend(
                {"text": part, "facts": facts if i == 0 else []} for i, part in enumerate(parts))
            keys = [aliases.get(k, k) for k in sentence.keys]
            named = [k for k in dict.fromkeys(keys) if kinds.get(k) not in ("date", "money")][:MAX_PAIR_ENTITIES]
            if sentence.line.kind == "table":
                named = []  # a row's structure is known: its cells relate to its first cell, not to each other
            for i, left in enumerate(named):
                for right in named[i + 1:]:
                    pair = (left, right) if left < right else (right, left)
                    together[pair] += 1
                    first_together.setdefault(pair, sentence.text)
            if not sentence.line.topic:
                for fact in facts:
                    for phrase in (fact["subject"], fact["object"]):
                        if phrase.casefold() not in speakers and not _DIGIT.search(phrase):
                            phrases[phrase] += 1
        if "" in topics:
            untitled = topics.pop("")
            top = sorted(phrases.items(), key=lambda item: -item[1])[:TOPIC_PHRASES]
            name = ", ".join(phrase for phrase, _ in top) or "general"
            topics[name] = untitled + topics.get(name, [])
        by_pair = {frozenset((a.casefold(), b.casefold())) for a, b in related}
        relations = list(related.values())
        for (left, right), count in sorted(together.items(), key=lambda item: (entities[item[0][0]].order,
                                                                             entities[item[0][1]].order)):
            if frozenset((names[left].casefold(), names[right].casefold())) in by_pair:
                continue
            relations.append({"source": names[left], "target": names[right], "predicate": CO_OCCURRENCE,
                              "description": trim(first_together[(left, right)], DESCRIPTION_CHARS),
                              "strength": round(0.5 * count / (count + 1), 4)})
        entity_rows = []
        for key in sorted(kinds, key=lambda k: entities[k].order):
            entity = entities[key]
            description = entity.description
            if entity.aliases:
                description = f"{description} (also written: {', '.join(sorted(set(entity.aliases)))})"
            entity_rows.append((entity.name, kinds[key], description, entity.mention))
        return self._construct(topics, entity_rows, relations)

    def _construct(self, topics: dict[str, list[dict]], entities: list[tuple[str, str, str, str]],
                   relations: list[dict]) -> ChunkExtraction:
        """The extraction validated once: the schema's validators keep what they demand (clean strings, complete
        facts, relations between listed entities)."""
        return self.response_model.model_validate({
            "topics": [{"name": name, "statements": statements} for name, statements in topics.items()],
            "entities": [{"name": n, "type": self._known(k), "description": d, "mention": m}
                         for n, k, d, m in entities],
            "relations": relations,
        })
