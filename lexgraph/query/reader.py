"""The LLM-free reader: a short answer span of the asked type, found in the best evidence sentences.

1. The answer type comes from the question (lexgraph.query.answer_types).
2. The sentences of the strongest evidence chunks that hold a word of the question are parsed by spaCy
   (named entities, noun chunks, dependencies; parses are cached by chunk and sentence, since the same
   chunks come back question after question).
3. Candidates are the spans of the asked type in those sentences: entities whose label fits the type, and
   for "which X" noun chunks headed by X. A span made only of the question's own words is not an answer, nor
   one whose sentence holds none of the question's other content words.
4. A candidate's score = type fit × (1 − half the share of its words the question names) × (SENTENCE_SHARE ×
   its sentence's score + (1 − SENTENCE_SHARE) × nearness to the question's other content words in that
   sentence, counted in arcs of the dependency parse). The sentence's score is the one the sentence answerer
   always used: question terms it and its chunk hold (idf-weighted), minus a little per rank.
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
from lexgraph.query.answer_types import NAME_LABELS, AnswerType, answer_type

READ_ITEMS = 8  # evidence chunks read (parsed); later ones rarely hold the answer
SENTENCE_SHARE = 0.6  # a candidate's score: this × its sentence's score + the rest × nearness
NEAR_ARCS = 2.0  # nearness = 1 / (1 + arcs / NEAR_ARCS), arcs in the parse to a question word beyond the first
PLAIN_YES_NO = 0.8  # a yes/no answer needs a sentence holding this share of the question's terms
PARSE_CACHE = 4096
CANDIDATES_KEPT = 5
SUPPORT_BONUS = 0.05  # per further sentence naming the same answer (at most MAX_SUPPORT of them)
MAX_SUPPORT = 3
SUPPORT_SHARE = 0.8  # a further sentence supports an answer when the answer scores this share of its best there
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
    candidates: tuple = ()  # the best few span candidates (Candidate), best first


class Parser:
    """spaCy parses of evidence texts, cached by id (thread-safe: one parse at a time)."""

    def __init__(self, nlp=None, capacity: int = PARSE_CACHE):
        self.capacity = capacity
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
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            return doc

    def parse_many(self, pairs: list[tuple[str, str]]) -> list:
        with self._lock:
            missing = [(k, t) for k, t in dict(pairs).items() if k not in self._cache]
            for (key, _), doc in zip(missing, self.nlp.pipe([t for _, t in missing], batch_size=16)):
                self._cache[key] = doc
            found = [self._cache[k] for k, _ in pairs]  # before any eviction: these may be the oldest entries
            for key, _ in pairs:
                self._cache.move_to_end(key)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
            return found

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
            if ent.label_ in _NUMERIC:
                ent = _with_unit(ent)
                fit *= _counts_what_was_asked(ent, asked)
            elif ent.label_ in NAME_LABELS:  # a date or time is not widened into the name after it
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


_NUMERIC = {"CARDINAL", "QUANTITY", "MONEY", "PERCENT"}
_CURRENCY_CODE = re.compile(r"^[A-Z]{3}$")


def _with_unit(span):
    """A number widened to what it counts or its currency ("13" of "13 crew", "120 million" of "NOK 120
    million"): an amount without its unit is not the answer a reader gives."""
    doc, start, end = span.doc, span.start, span.end
    lower, upper = span.sent.start, span.sent.end
    if start > lower and (doc[start - 1].tag_ == "$" or _CURRENCY_CODE.match(doc[start - 1].text)):
        start -= 1
    root = span.root
    if root.dep_ == "nummod" and end <= root.head.i < upper and all(
            t.dep_ in ("compound", "amod", "nummod", "quantmod") for t in doc[end:root.head.i]):
        end = root.head.i + 1
    return doc[start:end] if (start, end) != (span.start, span.end) else span


OTHER_COUNT_FIT = 0.5  # "how many crew": a number of engines fits half as well as a number of crew


def _counts_what_was_asked(span, asked: AnswerType) -> float:
    """For "how many X": 1.0 when the number counts X or nothing named, OTHER_COUNT_FIT when it counts
    something else ("No. 2 main engine" for "how many crew")."""
    if asked.name != "count" or not asked.head:
        return 1.0
    root = span.root
    if root.dep_ != "nummod":
        return 1.0
    counted = {_key(root.head).rstrip("s"), root.head.lower_.rstrip("s")}  # by lemma or surface form
    return 1.0 if asked.head.rstrip("s") in counted else OTHER_COUNT_FIT


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


def _own_share(span, words: "QuestionWords", asked_head: str = "") -> float:
    """The share of the span's content words that the question already names (an answer rarely is). The
    asked noun itself does not count: "13 crew" answers "how many crew", "the Mongstad base" "which base"."""
    content = [t for t in span if not t.is_stop and not t.is_punct and not t.is_space
               and not (asked_head and _key(t).rstrip("s") == asked_head.rstrip("s"))]
    if not content:
        return 1.0
    return sum(words.word_of(t) is not None for t in content) / len(content)


def _key(token) -> str:
    return (token.lemma_ or token.lower_).lower()


def _tree_distance(a, b) -> int:
    """Arcs between two tokens of one parse (through their lowest common head)."""
    up = {a.i: 0}
    for depth, head in enumerate(a.ancestors, 1):
        up[head.i] = depth
    if b.i in up:
        return up[b.i]
    for depth, head in enumerate(b.ancestors, 1):
        if head.i in up:
            return up[head.i] + depth
    return abs(a.i - b.i)  # no common head (a fragment the parser did not join): the words between them


def _nearness(sent, span, words: "QuestionWords") -> float:
    """The question's words in the sentence, each weighted by its idf and by how near the span it stands in
    the dependency parse, as a share of the weight of the question's words the span does not hold itself:
    high where the span is the subject, object or agent of the question's own verb ("founded … by Einar
    Halvorsen"), low for a name elsewhere in a long sentence."""
    inside = {words.word_of(t) for t in span} - {None}
    total = sum(w for i, w in enumerate(words.weights) if i not in inside)
    if not total:
        return 0.0
    best: dict[int, float] = {}
    root = span.root
    for token in sent:
        if span.start <= token.i < span.end:
            continue
        word = words.word_of(token)
        if word is not None and word not in inside:
            distance = max(_tree_distance(root, token) - 1, 0)
            best[word] = max(best.get(word, 0.0), 1.0 / (1.0 + distance / NEAR_ARCS))
    return sum(words.weights[i] * v for i, v in best.items()) / total


class QuestionWords:
    """The question's content words, each with its idf weight, found in evidence by lemma or surface form."""

    def __init__(self, doc, terms):
        self.weights: list[float] = []
        self.keys: dict[str, int] = {}
        default = max(terms.weights.values(), default=1.0)
        for token in doc:
            if token.is_stop or token.is_punct or token.is_space:
                continue
            forms = {token.lower_, _key(token)}
            known = next((self.keys[f] for f in forms if f in self.keys), None)
            weight = terms.weights.get(token.lower_, default)
            if known is None:
                self.weights.append(weight)
                known = len(self.weights) - 1
            else:
                self.weights[known] = max(self.weights[known], weight)
            for form in forms:
                self.keys.setdefault(form, known)

    def word_of(self, token) -> int | None:
        found = self.keys.get(_key(token))
        return found if found is not None else self.keys.get(token.lower_)


_WORD = re.compile(r"[^\W_][\w'’-]*")


def _mentions(text: str, words: "QuestionWords") -> bool:
    """Whether a sentence may hold one of the question's words (by surface form, or a form that only adds an
    ending: "founded" for "found"). Only such sentences can hold a candidate near the question, so only they
    are parsed: parsing is most of a reading's time."""
    for word in _WORD.findall(text.lower()):
        if word in words.keys or any(len(word) - cut >= 4 and word[:-cut] in words.keys for cut in (1, 2, 3)):
            return True
    return False


def _sentences(item) -> list[tuple[int, int, str]]:
    """(start, end, text) of an evidence chunk's sentences as the rest of lexgraph splits them (a Markdown line
    ends one), the text with Markdown's marks (**bold**, # headings, - bullets, | tables) blanked out, offsets
    kept: spaCy reads "**Kaszuby Shipbuilding**" as prose otherwise, and a bullet as part of a name."""
    spans = split_sentences(item.text) or [(0, len(item.text))]
    plain = _MARKUP.sub(lambda m: " " * len(m.group()), item.text)
    return [(a, b, plain[a:b]) for a, b in spans]


@dataclass(frozen=True)
class Candidate:
    """One span of the asked type and why it scored as it did (for the log, the LLM and debugging)."""

    text: str
    score: float  # best value over its sentences, plus the support of further sentences
    position: int  # evidence item of its best sentence
    start: int  # that sentence's characters in the item
    end: int
    fit: float
    sentence_score: float
    nearness: float
    sentences: int  # sentences that support it


def read(question: str, items, terms, parser: Parser, limit: int = READ_ITEMS) -> Reading | None:
    """The best reading of the evidence `items` (ranked), or None when there are none."""
    asked = answer_type(question, parser.question)
    words = QuestionWords(parser.question(question), terms)
    items = list(items[:limit])
    best_sentence: tuple[float, int, int, int, str, str] | None = None
    spans: dict[str, list[tuple]] = {}
    scored = []
    for position, item in enumerate(items):
        around = terms.coverage(f"{item.heading_path}\n{item.text}")
        for start, end, text in _sentences(item):
            score = _sentence_score(terms, text, around, position)
            key = f"{item.id}:{start}"
            if best_sentence is None or score > best_sentence[0]:
                best_sentence = (score, position, start, end, text, key)
            if asked.wants_span and _mentions(text, words):
                scored.append((position, start, end, score, key, text))
    parsed = parser.parse_many([(key, text) for *_, key, text in scored])
    for (position, start, end, score, _, _), sent in zip(scored, parsed):
        for span, fit in _candidates(sent, asked):
            own = _own_share(span, words, asked.head)
            if own >= 1.0:
                continue
            near = _nearness(sent, span, words)
            if near <= 0.0:  # no word of the question in its sentence: it stands near nothing asked
                continue
            # a name that shares a word with the question ("Einar Halvorsen" for "Halvorsen Maritime Group")
            # is often the answer: only half its shared share counts against it
            value = fit * (1 - own / 2) * (SENTENCE_SHARE * score + (1 - SENTENCE_SHARE) * near)
            text = " ".join(span.text.split()).strip(" *-:,;")
            if text:
                spans.setdefault(text.lower(), []).append((value, text, position, start, end, fit, score, near))
    if best_sentence is None:
        return None
    ranked = []
    for found in spans.values():
        found.sort(key=lambda row: row[0], reverse=True)
        # further sentences support the answer only where it fits the question nearly as well there: a head
        # office's city named in every chunk is not an answer by being frequent
        supporting = {(row[2], row[3]) for row in found if row[0] >= SUPPORT_SHARE * found[0][0]}
        value, text, position, start, end, fit, score, near = found[0]
        ranked.append(Candidate(text, value + SUPPORT_BONUS * min(len(supporting) - 1, MAX_SUPPORT), position, start,
                                end, fit, score, near, len(supporting)))
    ranked.sort(key=lambda c: c.score, reverse=True)
    if asked.wants_span:
        if not ranked:
            return Reading("", asked.name, 0.0, best_sentence[1], best_sentence[2], best_sentence[3], asked.name)
        top = ranked[0]
        return Reading(top.text, asked.name, top.score, top.position, top.start, top.end, asked.name,
                       tuple(ranked[:CANDIDATES_KEPT]))
    score, position, start, end, text, key = best_sentence
    if asked.name == "yes_no" and terms.coverage(text) >= PLAIN_YES_NO:
        negated = any(t.dep_ == "neg" for t in parser.parse(key, text))
        return Reading("no" if negated else "yes", "yes_no", score, position, start, end, asked.name)
    return Reading(" ".join(text.split()), "sentence", score, position, start, end, asked.name)
