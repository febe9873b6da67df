"""(subject, predicate, object) facts of one parsed sentence, read from spaCy's dependency parse.

- a verb's subject (an entity, or a pronoun the caller resolved) with its direct object, its prepositional
  objects ("was born in" Putney), its passive agent ("was published by") and, for a copula, its attribute
  ("is chief executive of" Kestrel, or "is" former goalkeeper); a conjoined verb shares the first one's
  subject, a participle or relative clause takes the noun it hangs on, and conjoined subjects and objects
  each give the fact;
- an apposition: "Annika Vogt, CEO of Kestrel" gives (Annika Vogt, "is CEO of", Kestrel).

A predicate is lowercase words only: a parse that runs through punctuation or numbers gives none.
"""
from __future__ import annotations

import re

VALUE_LABELS = frozenset({"CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "DATE", "TIME", "MONEY"})
SUBJECTS = frozenset({"nsubj", "nsubjpass"})
LEADING = frozenset({"the", "a", "an"})
FACT_OBJECT_WORDS = 8
MAX_FACTS_PER_SENTENCE = 8
_PREDICATE = re.compile(r"^[a-z'’][a-z'’-]*(?: [a-z'’-]+)*$")
_CLAUSE_VERBS = ("ROOT", "conj", "relcl", "acl")


def _pobjs(token):
    return (c for c in token.children if c.dep_ == "pobj")


class SentenceFacts:
    """The facts of ``sent``; ``at`` maps a token index to the entity key it is part of, ``resolved`` is the
    entity a pronoun subject of the root stands for (or None)."""

    def __init__(self, sent, at: dict[int, str], resolved: str | None) -> None:
        self.sent, self.at, self.resolved = sent, at, resolved
        self.chunks = {t.i: chunk for chunk in sent.noun_chunks for t in chunk}
        self.facts: list[tuple[str, str, str]] = []

    def read(self) -> list[tuple[str, str, str]]:
        for verb in [t for t in self.sent if t.pos_ in ("VERB", "AUX") and t.dep_ in _CLAUSE_VERBS]:
            subject_token, subject = self._subject(verb)
            if subject is None:
                continue
            self._clause(verb, subject)
            for other in (subject_token.conjuncts if subject_token is not None else ()):  # "X and Y signed"
                if (name := self.at.get(other.i)) is not None and name != subject:
                    self._clause(verb, name)
        for token in self.sent:
            if token.dep_ == "appos":
                self._apposition(token)
        return list(dict.fromkeys(self.facts))

    def _subject(self, verb):
        """(the subject token, the entity key it names) of a clause verb."""
        token = next((c for c in verb.children if c.dep_ in SUBJECTS), None)
        if token is not None:
            subject = self.at.get(token.i)
            if subject is None and token.pos_ == "PRON" and verb.dep_ == "ROOT":
                subject = self.resolved
            return token, subject
        if verb.dep_ == "conj":  # "founded in 1994 and is based in Oslo": the first verb's subject
            first = next((c for c in verb.head.children if c.dep_ in SUBJECTS), None)
            subject = self.at.get(first.i) if first is not None else None
            if subject is None and first is not None and first.pos_ == "PRON":
                subject = self.resolved
            return None, subject
        if verb.dep_ in ("acl", "relcl"):  # "Bonetti (born ... in Putney)", "Vogt, who founded ..."
            return None, self.at.get(verb.head.i)
        return None, None

    def _clause(self, verb, subject: str) -> None:
        phrase = _verb_phrase(verb)
        for child in verb.children:
            if child.dep_ in ("dobj", "dative", "oprd"):
                self._add(subject, phrase, child)
                for prep in (c for c in child.children if c.dep_ == "prep"):  # "signed the deal with X"
                    for pobj in _pobjs(prep):
                        self._add(subject, f"{phrase} {child.text} {prep.text}", pobj)
            elif child.dep_ == "attr":
                preps = [c for c in child.children if c.dep_ == "prep"]
                if not (preps and child.pos_ == "NUM"):  # "was one of several goalkeepers": not "was one"
                    self._add(subject, phrase, child)
                for prep in preps:
                    head = [t.text for t in child.subtree if t.i < prep.i and t.lower_ not in LEADING]
                    for pobj in _pobjs(prep):
                        self._add(subject, f"{phrase} {' '.join(head)} {prep.text}", pobj)
            elif child.dep_ in ("prep", "agent"):
                for pobj in _pobjs(child):
                    self._add(subject, f"{phrase} {child.text}", pobj)

    def _apposition(self, token) -> None:
        subject = self.at.get(token.head.i)
        if subject is None or self.at.get(token.i) == subject:
            return
        preps = [c for c in token.children if c.dep_ == "prep"]
        if not preps:
            self._add(subject, "is", token)
        for prep in preps:
            head = [t.text for t in token.subtree if t.i < prep.i and t.lower_ not in LEADING]
            for pobj in _pobjs(prep):
                self._add(subject, f"is {' '.join(head)} {prep.text}", pobj)

    def _add(self, subject: str, predicate: str, token) -> None:
        predicate = " ".join(predicate.lower().split())
        if not _PREDICATE.match(predicate):
            return  # a parse that ran through punctuation or numbers is no predicate
        for one in (token, *token.conjuncts):
            value = self._object(one)
            if value and value != subject and len(self.facts) < MAX_FACTS_PER_SENTENCE:
                self.facts.append((subject, predicate, value))

    def _object(self, token) -> str | None:
        """The entity key, value or short noun phrase ``token`` stands for as an object."""
        key = self.at.get(token.i)
        if key is not None:
            return key
        if token.ent_type_ in VALUE_LABELS:
            span = next((e for e in self.sent.ents if e.start <= token.i < e.end), None)
            if span is not None:
                return span.text
        if token.pos_ in ("NOUN", "PROPN", "NUM"):
            chunk = self.chunks.get(token.i)
            words = [t.text for t in (chunk if chunk is not None else [token])
                     if t.lower_ not in LEADING and t.pos_ != "PRON"]
            if words and len(words) <= FACT_OBJECT_WORDS:
                return " ".join(words)
        return None


def _verb_phrase(verb) -> str:
    words = [c for c in verb.children if c.dep_ in ("aux", "auxpass", "neg") and c.i < verb.i]
    words += [verb] + [c for c in verb.children if c.dep_ == "prt"]
    return " ".join(t.text for t in sorted(words, key=lambda t: t.i))
