"""The LLM-free reader: a short answer span of the asked type, found in the best evidence sentences.

1. The answer type comes from the question (lexgraph.query.answer_types).
2. The strongest evidence chunks are parsed by spaCy (sentences, named entities, noun chunks; parses are
   cached by chunk id, since the same chunks come back question after question).
3. Candidates are the spans of the asked type in those sentences: entities whose label fits the type, and
   for "which X" noun chunks headed by X. A span made only of the question's own words is not an answer.
4. A candidate's score = type fit × (SENTENCE_SHARE × its sentence's score + (1 − SENTENCE_SHARE) ×
   nearness to the question's content words in that sentence). The sentence's score is the one the sentence
   answerer always used: question terms it and its chunk hold (idf-weighted), minus a little per rank.
5. Yes/no questions: "yes" or "no" only when one sentence holds nearly all of the question's terms (no
   answer is read into a sentence that holds half of them), "no" when that sentence is negated; else the
   sentence itself, typed `sentence`.

The caller abstains when the best score falls below its threshold (calibrated out of corpus, see
lexgraph.evaluation.generalize).
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from lexgraph.extract.keywords import split_sentences
from lexgraph.query.answer_types import AnswerType, answer_type

READ_ITEMS = 8  # evidence chunks read (parsed); later ones rarely hold the answer
SENTENCE_SHARE = 0.6  # a candidate's score: this × its sentence's score + the rest × nearness
NEAR_TOKENS = 6.0  # nearness = 1 / (1 + distance / NEAR_TOKENS), distance to the nearest question word
PLAIN_YES_NO = 0.8  # a yes/no answer needs a sentence holding this share of the question's terms
PARSE_CACHE = 4096
SUPPORT_BONUS = 0.05  # per further sentence naming the same answer (at most MAX_SUPPORT of them)
MAX_SUPPORT = 3
PLACE_BY_PREPOSITION = 0.8  # type fit of a named noun phrase after a preposition of place
_LOCATIVE = {"in", "on", "at", "near", "from", "inside", "outside", "beside", "across", "along", "off", "within"}
_MARKUP = re.compile(r"\*+|`+|^\s*#+|^\s*[-+>]\s|\|", re.M)
_COMPONENTS_OFF: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reading:
    answer: str  # the span, "yes"/"no", or the sentence (answer_type "sentence")
    answer_type: str
    score: float
    item_index: int  # which evidence item the sentence is in
    start: int  # the sentence's characters in that item's text
    end: int
    asked: str  # the answer type the question asked for


class Parser:
    """spaCy parses of evidence texts, cached by id (thread-safe: one parse at a time)."""

    def __init__(self, nlp=None):
        if nlp is None:
            from lexgraph.extract.nlp import load

            nlp = load(_COMPONENTS_OFF)
        self.nlp = nlp
        self._cache: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, key: str, text: str):
        with self._lock:
            doc = self._cache.get(key)
            if doc is not None:
                self._cache.move_to_end(key)
                return doc
            doc = self.nlp(text)
            self._cache[key] = doc
            if len(self._cache) > PARSE_CACHE:
                self._cache.popitem(last=False)
            return doc

    def parse_many(self, pairs: list[tuple[str, str]]) -> list:
        with self._lock:
            missing = [(k, t) for k, t in dict(pairs).items() if k not in self._cache]
            for (key, _), doc in zip(missing, self.nlp.pipe([t for _, t in missing], batch_size=16)):
                self._cache[key] = doc
            while len(self._cache) > PARSE_CACHE:
                self._cache.popitem(last=False)
            return [self._cache[k] for k, _ in pairs]

    def question(self, text: str):
        return self.parse(f"question:{text}", text)


def _sentence_score(terms, sentence: str, around: float, position: int) -> float:
    return 0.6 * terms.coverage(sentence) + 0.4 * around - 0.02 * position


def _candidates(sent, asked: AnswerType):
    """(span, fit) of the asked type in one spaCy sentence."""
    seen = set()
    for ent in sent.ents:
        fit = asked.labels.get(ent.label_, 0.0)
        if fit > 0:
            ent = _whole_name(ent)
            seen.add((ent.start, ent.end))
            yield ent, fit
    if asked.name == "place":
        # the small model often types a lesser-known place as ORG or not at all: a named noun phrase after a
        # preposition of place ("stands on Utsira island", "based in Tromsø") is a place by its grammar
        for chunk in sent.noun_chunks:
            if chunk.root.dep_ == "pobj" and chunk.root.head.lower_ in _LOCATIVE and \
                    any(t.pos_ == "PROPN" for t in chunk):
                span = chunk[1:] if chunk[0].dep_ == "det" else chunk
                if (span.start, span.end) not in seen:
                    seen.add((span.start, span.end))
                    yield span, PLACE_BY_PREPOSITION
    if asked.head:
        for chunk in sent.noun_chunks:
            if (chunk.start, chunk.end) not in seen and chunk.root.lower_.rstrip("s") == asked.head.rstrip("s"):
                # the chunk names the thing asked about only with a modifier ("the Quay 7 base", not "the base")
                if any(t.pos_ in ("PROPN", "NUM") or t.is_title for t in chunk if t.i != chunk.root.i):
                    yield chunk, 1.0


def _whole_name(span):
    """A named entity widened to the proper nouns it stands in ("MV Nordlys" of "MV Nordlys Spirit"): the
    small model often cuts a name short."""
    if not any(t.pos_ == "PROPN" for t in span):
        return span
    doc, start, end = span.doc, span.start, span.end
    lower, upper = span.sent.start, span.sent.end
    while start > lower and doc[start - 1].pos_ == "PROPN":
        start -= 1
    while end < upper and doc[end].pos_ == "PROPN":
        end += 1
    return doc[start:end] if (start, end) != (span.start, span.end) else span


def _own_share(span, question_lemmas: dict[str, float]) -> float:
    """The share of the span's content words that the question already names (an answer rarely is)."""
    words = [t for t in span if not t.is_stop and not t.is_punct and not t.is_space]
    if not words:
        return 1.0
    return sum(_key(t) in question_lemmas or t.lower_ in question_lemmas for t in words) / len(words)


def _key(token) -> str:
    return (token.lemma_ or token.lower_).lower()


def _nearness(sent, span, question_lemmas: dict[str, float]) -> float:
    """The question's words in the sentence, each weighted by its idf and by how near the span it stands,
    as a share of all the question's weight: high next to the rare words the question turns on."""
    total = sum(question_lemmas.values())
    if not total:
        return 0.0
    best: dict[str, float] = {}
    for token in sent:
        if span.start <= token.i < span.end:
            continue
        key = _key(token) if _key(token) in question_lemmas else token.lower_
        if key in question_lemmas:
            distance = min(abs(token.i - span.start), abs(token.i - (span.end - 1)))
            best[key] = max(best.get(key, 0.0), 1.0 / (1.0 + distance / NEAR_TOKENS))
    return sum(question_lemmas[k] * v for k, v in best.items()) / total


def question_lemmas(doc, terms) -> dict[str, float]:
    """The question's content words (lemma and surface form) with their idf weights."""
    out: dict[str, float] = {}
    for token in doc:
        if token.is_stop or token.is_punct or token.is_space:
            continue
        weight = terms.weights.get(token.lower_, max(terms.weights.values(), default=1.0))
        for key in {token.lower_, _key(token)}:
            out[key] = max(out.get(key, 0.0), weight)
    return out


def _sentences(parser: Parser, item) -> list[tuple[int, int, object]]:
    """(start, end, parsed sentence) of an evidence chunk: its sentences as the rest of lexgraph splits them
    (a Markdown line ends one), each parsed on its own."""
    spans = split_sentences(item.text) or [(0, len(item.text))]
    # Markdown's marks (**bold**, # headings, - bullets, | tables) blanked out, offsets kept: spaCy reads
    # "**Kaszuby Shipbuilding**" as prose otherwise, and a bullet as part of a name
    plain = _MARKUP.sub(lambda m: " " * len(m.group()), item.text)
    docs = parser.parse_many([(f"{item.id}:{a}", plain[a:b]) for a, b in spans])
    return [(a, b, doc) for (a, b), doc in zip(spans, docs)]


def read(question: str, items, terms, parser: Parser, limit: int = READ_ITEMS) -> Reading | None:
    """The best reading of the evidence `items` (ranked), or None when there are none."""
    asked = answer_type(question, parser.question)
    lemmas = question_lemmas(parser.question(question), terms)
    items = list(items[:limit])
    best_sentence: tuple[float, int, int, int, object] | None = None
    spans: dict[str, list[tuple[float, str, int, int, int]]] = {}
    for position, item in enumerate(items):
        around = terms.coverage(f"{item.heading_path}\n{item.text}")
        for start, end, sent in _sentences(parser, item):
            score = _sentence_score(terms, sent.text, around, position)
            if best_sentence is None or score > best_sentence[0]:
                best_sentence = (score, position, start, end, sent)
            if not asked.wants_span:
                continue
            for span, fit in _candidates(sent, asked):
                own = _own_share(span, lemmas)
                if own >= 1.0:
                    continue
                value = fit * (1 - own) * (SENTENCE_SHARE * score + (1 - SENTENCE_SHARE) * _nearness(sent, span, lemmas))
                text = " ".join(span.text.split()).strip(" *-:,;")
                spans.setdefault(text.lower(), []).append((value, text, position, start, end))
    if best_sentence is None:
        return None
    best_span = None
    for found in spans.values():
        found.sort(reverse=True)
        sentences = {(p, a) for _, _, p, a, _ in found}
        value = found[0][0] + SUPPORT_BONUS * min(len(sentences) - 1, MAX_SUPPORT)
        if best_span is None or value > best_span[0]:
            best_span = (value, *found[0][1:])
    if asked.wants_span:
        if best_span is None:
            return Reading("", asked.name, 0.0, best_sentence[1], best_sentence[2], best_sentence[3], asked.name)
        value, span, position, start, end = best_span
        return Reading(span, asked.name, value, position, start, end, asked.name)
    score, position, start, end, sent = best_sentence
    if asked.name == "yes_no" and terms.coverage(sent.text) >= PLAIN_YES_NO:
        negated = any(t.dep_ == "neg" for t in sent)
        return Reading("no" if negated else "yes", "yes_no", score, position, start, end, asked.name)
    return Reading(sent.text.strip(), "sentence", score, position, start, end, asked.name)
