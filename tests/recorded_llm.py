"""A recorded LLM: HippoRAG's GPT-3.5 OpenIE output for the MuSiQue passages, answered as ``ChunkExtraction``.

``../shared/datasets/musique-hipporag/openie_gpt-3.5-turbo-1106.json`` holds, per passage file stem,
``{title, entities: [names], triples: [[subject, predicate, object], ...]}``; the passages are
``corpus/<stem>.txt`` (title line, blank line, text). :class:`RecordedExtractions` finds the recorded passages
in a chunk's text and maps their recording onto the extraction schema (lexgraph/extract/schemas.py). It is
stdlib only, like tests/llm_server.py, which serves it (``LLMTestServer(replay=...)``, ``--replay PATH``).

Finding passages in a chunk (a chunk may hold several passages, one, or a fragment of one):

- passage and chunk are compared as sequences of words (NFKC, casefolded ``\\w+`` runs), so quoting and
  whitespace differences do not matter. Every 6-word run of a passage (its title line included) is indexed; a
  chunk's 6-word runs mark the passage words they cover;
- only runs aligned at one offset (chunk position minus passage position) count, longest first, each claiming
  its chunk words; a run counts when it covers at least 15 words of its passage that no longer run claimed (all
  of them for a shorter passage), or every word of the chunk (a short tail of a passage cut off by the
  chunker). So sentences and stock phrases that several passages share ("Latitude and longitude coordinates
  are provided for many National Register properties ...", "is a public high school located in") go to the
  passage the chunk holds most of, and do not pull in the others. Between runs of equal length (two revisions
  of one Wikipedia paragraph, which differ in a comma or a capital), the passage with more sentences verbatim
  in the chunk wins, then the first file stem;
- a sentence of a passage found in the chunk is in the chunk when its first word is (one of the covered words):
  a sentence cut by a chunk boundary (the chunker cuts long sentences at ``;`` and then at word pieces) belongs
  to the one chunk that holds its start.

The mapping, for each passage in the chunk, in the order the passages appear in it:

- each recorded triple is placed in one sentence of the passage: the sentence whose words cover the most of
  the subject's and the object's words (each end counted as a share of its own words; the predicate's share
  breaks ties at a tenth of the weight; then the earliest sentence). A triple sharing no word with any sentence
  goes to the passage's first sentence, which names the title subject. Sentences come from a rule-based splitter
  (``.``, ``!``, ``?`` before a capital, digit or quote; not after an initial or a common abbreviation);
- the chunk gets the triples whose sentence is in it; a triple with 2, 4 or more parts (185 of the 17,419
  recorded) is skipped: it does not fit subject, predicate, object, and guessing its split would be ours;
- each sentence holding kept triples → a ``Statement`` (the sentence's text) whose ``facts`` are those triples,
  under one ``Topic`` named by the passage's title. Sentences without a triple give no statement: the recording
  says nothing about them;
- entities: every recorded entity of a passage held whole; of a fragment, those named in its sentences or at an
  end of one of its triples. Type: the recording has none, so ``other``, except names that are a date by their
  form (a year, a decade, a century, a month with day or year) → ``date`` and an amount of currency
  (``$5 million``, ``200 euros``) → ``money``, when the request's schema allows those types. Description and
  mention: the first sentence of the passage in the chunk that names the entity (else the sentence of its first
  triple, else empty): source text, nothing made up;
- each kept triple whose subject and object are both entities of the extraction → a ``Relation`` (predicate as
  recorded, the triple's sentence as description, strength 1.0: the recording has no strengths, and the graph
  only uses strengths relative to each other).

A chunk with no recorded passage gets the empty extraction (no topics, entities or relations). Everything is
deterministic: the same chunk text gives the same answer.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

GRAM = 6  # words per indexed run: long enough that unrelated passages rarely share one
MIN_COVERED_WORDS = 15  # a passage is in a chunk from this many covered words (or all of a shorter one)
RELATION_STRENGTH = 1.0

_WORD = re.compile(r"\w+")
# A sentence ends at . ! ? (and any closing quote/bracket) followed by space and a capital, digit or quote.
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "jr", "sr", "gen", "col", "lt", "capt", "sgt", "rev", "hon",
    "no", "vs", "etc", "inc", "ltd", "co", "corp", "bros", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
    "sep", "sept", "oct", "nov", "dec", "fr", "ft", "op", "vol", "ca", "approx", "dept", "univ", "gov",
}
_STOPWORDS = {"the", "a", "an", "of", "in", "on", "at", "to", "for", "and", "or", "by", "with", "from", "as", "is",
              "was", "s"}
_MONTH = r"(?:january|february|march|april|may|june|july|august|september|october|november|december)"
_DATE = re.compile(
    rf"^(?:(?:early|late|mid|the)[ -])?(?:\d{{3,4}}s?|\d{{1,2}}(?:st|nd|rd|th) century|"
    rf"{_MONTH}(?: \d{{1,2}})?,? \d{{4}}|\d{{1,2}} {_MONTH},? \d{{4}}|{_MONTH} \d{{1,2}}|"
    rf"\d{{4}}[-–]\d{{2,4}})$", re.I)
_MONEY = re.compile(r"^(?:(?:us|a|c)?[$£€¥]\s?\d[\d,.]*(?: ?(?:million|billion|thousand|m|bn))?|"
                    r"\d[\d,.]*(?: (?:million|billion|thousand))? (?:dollars|euros|pounds|yen|usd|eur|gbp))$", re.I)


def words(text: str) -> list[str]:
    """The words passage and chunk are compared by."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def split_sentences(text: str) -> list[str]:
    """A passage's sentences, whitespace collapsed (rule-based; see the module docstring)."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        before = text[start:end.start() + 1].split()
        last = before[-1].rstrip(".!?\"'”’)]").casefold() if before else ""
        # "J. R. R. Tolkien", "St. Louis", "U.S. Navy": not a sentence end
        if len(last) == 1 and last.isalpha() or last in _ABBREVIATIONS or re.fullmatch(r"(?:\w\.)+\w", last):
            continue
        sentences.append(text[start:end.end()].strip())
        start = end.end()
    if text[start:].strip():
        sentences.append(text[start:].strip())
    return sentences


def entity_type(name: str, allowed: Sequence[str]) -> str:
    """``date`` / ``money`` by the name's form when the request allows that type, else ``other``."""
    clean = " ".join(name.split())
    if "date" in allowed and _DATE.match(clean):
        return "date"
    if "money" in allowed and _MONEY.match(clean):
        return "money"
    return "other"


def _key(name: str) -> str:
    return " ".join(str(name).split()).casefold()


def _contains(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return n > 0 and any(list(haystack[i:i + n]) == list(needle) for i in range(len(haystack) - n + 1))


@dataclass(frozen=True)
class Passage:
    """One recorded passage: its text as words and sentences, and its recording with each triple's sentence."""

    stem: str
    title: str
    words: tuple[str, ...]  # title line, then text
    sentences: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]  # each sentence's word range in `words`
    entities: tuple[str, ...]
    triples: tuple[tuple[str, str, str], ...]
    triple_sentence: tuple[int, ...]  # the sentence each triple is placed in

    @classmethod
    def of(cls, stem: str, text: str, record: dict) -> "Passage":
        title_line, _, body = text.strip().partition("\n")
        sentences = split_sentences(body)
        all_words, spans = words(title_line), []
        for sentence in sentences:
            start = len(all_words)
            all_words += words(sentence)
            spans.append((start, len(all_words)))
        triples = tuple((t[0].strip(), t[1].strip(), t[2].strip()) for t in record.get("triples") or []
                        if isinstance(t, (list, tuple)) and len(t) == 3
                        and all(isinstance(part, str) and part.strip() for part in t))
        entities = tuple(dict.fromkeys(e.strip() for e in record.get("entities") or []
                                       if isinstance(e, str) and e.strip()))
        sentence_words = [set(all_words[a:b]) for a, b in spans]
        placed = tuple(_place(triple, sentence_words) for triple in triples)
        return cls(stem, str(record.get("title") or title_line).strip(), tuple(all_words), tuple(sentences),
                   tuple(spans), entities, triples, placed)


def _place(triple: tuple[str, str, str], sentences: list[set[str]]) -> int:
    """The sentence a triple comes from: most of its subject's and object's words, then predicate's, then first."""
    ends = [{w for w in words(part) if w not in _STOPWORDS} or set(words(part)) for part in triple]

    def share(part: set[str], sentence: set[str]) -> float:
        return len(part & sentence) / len(part) if part else 0.0

    best, best_score = 0, 0.0
    for index, sentence in enumerate(sentences):
        score = share(ends[0], sentence) + share(ends[2], sentence) + 0.1 * share(ends[1], sentence)
        if score > best_score:
            best, best_score = index, score
    return best


@dataclass(frozen=True)
class Found:
    """A passage found in a chunk: which of its sentences are there, and where it starts in the chunk."""

    passage: Passage
    sentences: tuple[int, ...]
    first_position: int

    @property
    def whole(self) -> bool:
        return len(self.sentences) == len(self.passage.sentences)


class RecordedExtractions:
    """The recording, indexed for finding its passages in chunk texts (read-only after loading: thread-safe)."""

    def __init__(self, passages: Iterable[Passage]):
        self.passages = list(passages)
        self._grams: dict[tuple[str, ...], list[tuple[int, int]]] = defaultdict(list)
        for number, passage in enumerate(self.passages):
            for start in range(len(passage.words) - GRAM + 1):
                self._grams[passage.words[start:start + GRAM]].append((number, start))
        self._grams = dict(self._grams)

    @classmethod
    def load(cls, path: str | Path, corpus_dir: str | Path | None = None) -> "RecordedExtractions":
        """The recording at ``path``, with passages from ``corpus_dir`` (default: ``corpus/`` beside it). A
        recorded stem without its passage file is skipped (its text cannot be found in a chunk anyway)."""
        path = Path(path)
        corpus = Path(corpus_dir) if corpus_dir is not None else path.parent / "corpus"
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, dict):
            raise ValueError(f"{path}: expected a JSON object of {{file stem: {{title, entities, triples}}}}")
        passages = []
        for stem in sorted(records):
            file = corpus / f"{stem}.txt"
            if file.is_file():
                passages.append(Passage.of(stem, file.read_text(encoding="utf-8"), records[stem]))
        if not passages:
            raise ValueError(f"{path}: none of its passages is in {corpus}")
        return cls(passages)

    def __len__(self) -> int:
        return len(self.passages)

    def find(self, text: str) -> list[Found]:
        """The recorded passages in a chunk text, in the order they start in it."""
        chunk = words(text)
        # (passage, offset = chunk position - passage position) -> the passage words covered at that alignment
        aligned: dict[tuple[int, int], set[int]] = defaultdict(set)
        for position in range(len(chunk) - GRAM + 1):
            for number, start in self._grams.get(tuple(chunk[position:position + GRAM]), ()):
                aligned[number, position - start].update(range(start, start + GRAM))
        # the longest aligned runs claim their chunk words first: a sentence that several passages share
        # belongs to the passage the chunk holds more of
        flat = " ".join(text.split())
        verbatim = {number: sum(sentence in flat for sentence in self.passages[number].sentences)
                    for number in {number for number, _ in aligned}}
        claimed: set[int] = set()
        held: dict[int, set[int]] = defaultdict(set)
        first: dict[int, int] = {}
        for (number, offset), covered in sorted(aligned.items(), key=lambda item: (
                -len(item[1]), -verbatim[item[0][0]], self.passages[item[0][0]].stem, item[0][1])):
            fresh = {p for p in covered if p + offset not in claimed}
            if len(fresh) < min(MIN_COVERED_WORDS, len(self.passages[number].words)) and len(fresh) < len(chunk):
                continue  # too little to tell, unless the whole chunk is this run (a short tail of a passage)
            claimed.update(p + offset for p in covered)
            held[number] |= fresh
            first[number] = min(first.get(number, len(chunk)), min(fresh) + offset)
        found = []
        for number, positions in held.items():
            passage = self.passages[number]
            sentences = tuple(i for i, (a, b) in enumerate(passage.spans) if b > a and a in positions)
            if sentences:
                found.append(Found(passage, sentences, first[number]))
        return sorted(found, key=lambda f: (f.first_position, f.passage.stem))

    def extraction(self, text: str, entity_types: Sequence[str] = ("other",)) -> dict:
        """The ChunkExtraction (as a dict) of a chunk text: the recording of the passages in it."""
        topics, entities, relations = [], {}, []
        for found in self.find(text):
            topic, passage_entities, passage_relations = _mapped(found, entity_types)
            if topic["statements"]:
                topics.append(topic)
            for entity in passage_entities:
                entities.setdefault(_key(entity["name"]), entity)
            relations += passage_relations
        return {"topics": topics, "entities": list(entities.values()), "relations": relations}


def _mapped(found: Found, entity_types: Sequence[str]) -> tuple[dict, list[dict], list[dict]]:
    """(topic, entities, relations) of one passage found in a chunk."""
    passage, held = found.passage, set(found.sentences)
    kept = [(triple, sentence) for triple, sentence in zip(passage.triples, passage.triple_sentence)
            if sentence in held]
    facts: dict[int, list[dict]] = defaultdict(list)
    for (subject, predicate, obj), sentence in kept:
        facts[sentence].append({"subject": subject, "predicate": predicate, "object": obj})
    statements = [{"text": passage.sentences[i], "facts": facts[i]} for i in sorted(facts)]
    ends = {_key(part) for (subject, _, obj), _ in kept for part in (subject, obj)}
    sentence_words = {i: words(passage.sentences[i]) for i in found.sentences}
    entities = []
    for name in passage.entities:
        name_words = words(name)
        naming = [i for i in found.sentences if _contains(sentence_words[i], name_words)]
        if not (found.whole or naming or _key(name) in ends):
            continue
        if not naming:  # the sentence of the entity's first triple
            naming = [s for (subject, _, obj), s in kept if _key(name) in (_key(subject), _key(obj))][:1]
        sentence = passage.sentences[naming[0]] if naming else ""
        entities.append({"name": name, "type": entity_type(name, entity_types), "description": sentence,
                         "mention": sentence[:200]})
    names = {_key(e["name"]) for e in entities}
    relations = [{"source": subject, "target": obj, "predicate": predicate, "description": passage.sentences[s],
                  "strength": RELATION_STRENGTH}
                 for (subject, predicate, obj), s in kept
                 if _key(subject) in names and _key(obj) in names and _key(subject) != _key(obj)]
    return {"name": passage.title, "statements": statements}, entities, relations
