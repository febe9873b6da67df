"""The LLM-free extractor: the lexical graph for every chunk, at no model cost.

Rules, not a model, so it is deterministic and fast (thousands of chunks per second):

- **Statements** are the chunk's sentences (``keywords.split_sentences``), read line by line
  so that Markdown keeps its meaning: headings set the topic and are no statements; list
  markers and emphasis are dropped; a table row becomes "Header: cell; Header: cell"; code
  blocks are skipped; chat lines ("WolfgangSchulz: ...") keep their speaker in every
  statement, so each reads alone. Over-long sentences are cut at word boundaries.
- **Entities** are money amounts, dates, proper-noun phrases ("Kestrel Propulsion GmbH"),
  code-like names ("KP-9", "HM-2023-07"), acronyms and chat speakers. The type is voted by
  cues over all mentions in the chunk: a legal suffix or organisation word → organization, an
  honorific, a known first name, a role word before it or a speaker prefix → person, "MV" and
  other vessel prefixes (dropped from the name) → vessel, a country, a place word or "in/at/
  from" before it → location, contract and product words around code-like names, event words;
  otherwise "other". A lone "Vogt" or "Kestrel" is folded into the one longer entity of the
  chunk that starts or ends with it.
- **Relations** link entities named in the same sentence (dates and amounts excepted): the
  predicate is the single word between them when there is one (usually the verb), else
  "co-occurs with"; strength grows with the number of sentences they share. A table row
  relates its first cell to the other cells, with the column header as predicate.
- **Facts** come from sentences that read "<Entity> <verb phrase> <Entity or value>" and from
  table rows (first cell, column header, cell).
- **Topics** are the chunk's last heading (and any heading inside it); a chunk without
  headings gets its top keywords as topic.

Changing any rule means changing :data:`RULES_VERSION`: its hash is the extractor's prompt
version, so cached extractions are redone.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from lexgraph.extract.keywords import STOPWORDS, split_sentences
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
from lexgraph.ids import short_hash

RULES_VERSION = "heuristic-rules v1: sentences, markdown lines, chat speakers, cue-voted types, co-occurrence"

MENTION_CHARS = 160
DESCRIPTION_CHARS = 240
MAX_STATEMENT_CHARS = 600
# Co-occurrence pairs are quadratic in the entities of a sentence: only the first few count.
MAX_PAIR_ENTITIES = 12
TOPIC_KEYWORDS = 3
TOPIC_CHARS = 1500  # keyword topics read this much of a chunk
HEADING_SEPARATOR = " > "

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December|"
    "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
_DATE = re.compile(
    rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\.?,?\s+\d{{4}}\b"  # 14 March 2024
    rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b"  # March 14, 2024
    rf"|\b(?:{_MONTHS})\.?\s+\d{{4}}\b"  # June 2023
    r"|\b\d{4}-\d{2}-\d{2}\b"  # 2024-03-14
    r"|\b\d{1,2}[./]\d{1,2}[./]\d{4}\b"  # 14.03.2024
    r"|(?<!\d)20\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])(?!\d)"  # 20260924 (chat-log timestamps)
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b"  # 17 January
    rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?![\d,.]*\d)"  # January 17
)
# A bare year is a date after a preposition of time: "founded in 1994", "since 2012".
_YEAR = re.compile(r"\b(?:in|since|until|by|from|during|before|after|of)\s+((?:1[6-9]|20)\d{2})\b"
                   r"(?!\s*(?:kW|MW|hours|units|percent|%|tonnes|people))")
_CURRENCY_CODES = "EUR|USD|NOK|GBP|SEK|DKK|CHF|JPY|CNY|RMB|KRW|INR|AUD|CAD|PLN|SGD|HKD"
_SCALE = r"(?:\s?(?:million|billion|thousand|trillion|bn|mn|m|k)\b)?"
_MONEY = re.compile(
    rf"(?:\b(?:{_CURRENCY_CODES})\s?|[€$£¥₩])\d[\d,]*(?:\.\d+)?{_SCALE}"
    rf"|\b\d[\d,]*(?:\.\d+)?{_SCALE}\s?(?:\b(?:{_CURRENCY_CODES})\b|euros?\b|dollars?\b|pounds\b|kroner\b|krone\b|yen\b|won\b)"
)
_DIGIT = re.compile(r"\d")
# "<Entity> is a ...": the sentence defines the entity and becomes its description.
_DEFINES = re.compile(r"\s+(?:is|was|are|were|has been|serves as|acts as)\s+(?:a|an|the|one)\b")
_TOKEN = re.compile(r"&|[^\W_](?:[\w'’./-]*[^\W_])?(?:'s|’s)?")
_CAMEL = re.compile(r"^[A-Z][a-z]+(?:[A-Z][a-z]+)+$")
_CAMEL_SPLIT = re.compile(r"(?<=[a-z])(?=[A-Z])")
_SPEAKER = re.compile(r"^(?P<speaker>[A-Z][A-Za-z]*(?:[ .'-][A-Z][A-Za-z]*){0,2}):[ \t]+(?P<message>\S.*)$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")
_LIST_MARKER = re.compile(r"^\s*(?:>\s*)*(?:[-*+•]|\d{1,3}[.)])\s+")
_QUOTE_MARKER = re.compile(r"^\s*(?:>\s*)+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_TAG = re.compile(r"<[^<>\n]{1,200}>")
_EMPHASIS = re.compile(r"\*{1,3}|(?<![\w])_{1,3}|_{1,3}(?![\w])|`+")
_SPACE = re.compile(r"\s+")
_PLAIN_WORDS = re.compile(r"^[a-z][a-z'’-]*(?: [a-z][a-z'’-]*){0,5}$")
_CODE = re.compile(r"^(?=[A-Za-z0-9/.-]*\d)(?=[A-Za-z0-9/.-]*[A-Z])[A-Z0-9][A-Za-z0-9]*(?:[-/.][A-Za-z0-9]+)+$|^[A-Z]{1,5}\d+[A-Z0-9]*$")

LEGAL_SUFFIXES = frozenset(
    "gmbh ag as asa ltd limited llc llp lp inc incorporated corp corporation plc sa sas sarl srl spa bv nv co kg "
    "kgaa ohg oy oyj ab aps se sia pty pte bhd kk ltda sl ug".split()
)
_LOWERCASE_SUFFIXES = frozenset({"plc", "ltd", "llc", "gmbh", "inc", "corp", "mbh"})
# Single capitalised words with these endings are mostly statuses and adjectives ("Suspended", "Approved").
_ADJECTIVE_ENDINGS = ("ed", "ing", "ive", "ous", "able", "ible", "ful", "less")
_HONORIFICS = frozenset("dr mr mrs ms miss mx prof sir dame capt captain rev lord lady herr frau".split())
_VESSEL_PREFIXES = frozenset({"MV", "M/V", "MT", "M/T", "MS", "M/S", "SS", "RV", "FV", "LNGC", "HMS"})
_VESSEL_WORDS = frozenset("vessel vessels ship ships tanker carrier ferry barge tug trawler yacht newbuild hull".split())
_ORG_WORDS = frozenset(
    """group bank mutual holding holdings company association authority university college council ministry
    board committee tribunal court agency services systems shipping maritime insurance partners foundation
    institute club society federation union department commission coatings bunkering propulsion logistics
    shipyard yard construction industries engineering technologies solutions airlines airways trust fund
    capital ventures consulting labs laboratories school hospital police navy army party registry
    classification brands media press studio studios team""".split()
)
_LOCATION_WORDS = frozenset(
    """street strasse straße road avenue lane square quay quays port harbour harbor bay island islands sea ocean
    river fjord lake mountain mountains valley county province region city town district state coast terminal
    peninsula gulf strait canal airport park bridge""".split()
)
_COUNTRIES = frozenset(
    """afghanistan albania algeria argentina armenia australia austria azerbaijan bahrain bangladesh belarus belgium
    bolivia bosnia brazil bulgaria cambodia cameroon canada chile china colombia croatia cuba cyprus czechia denmark
    ecuador egypt england estonia ethiopia finland france georgia germany ghana greece greenland hungary iceland india
    indonesia iran iraq ireland israel italy jamaica japan jordan kazakhstan kenya korea kuwait latvia lebanon libya
    lithuania luxembourg malaysia malta mexico moldova monaco mongolia montenegro morocco mozambique myanmar namibia
    nepal netherlands nigeria norway oman pakistan panama paraguay peru philippines poland portugal qatar romania russia
    scotland senegal serbia singapore slovakia slovenia somalia spain sweden switzerland syria taiwan tanzania thailand
    tunisia turkey uganda ukraine uruguay uzbekistan venezuela vietnam wales yemen zambia zimbabwe europe asia africa
    america antarctica oceania""".split()
) | {"united kingdom", "united states", "united arab emirates", "south korea", "north korea", "new zealand",
     "south africa", "saudi arabia", "czech republic", "hong kong", "united states of america", "north america",
     "south america", "latin america", "middle east", "north sea", "baltic sea", "the netherlands"}
_LOCATION_PREPOSITIONS = frozenset("in at from near around across outside inside via".split())
_LIST_GAPS = frozenset({",", "and", ", and", "or", ", or", "&"})
_ROLE_WORDS = frozenset(
    """ceo cfo cto coo cco cio chief officer executive financial commercial technology technical operating director
    manager chairman chairwoman chair chairperson president vice head engineer captain master superintendent
    lawyer counsel secretary minister spokesperson spokesman spokeswoman founder owner professor inspector
    surveyor auditor analyst coordinator lead supervisor treasurer partner deputy senior junior general managing
    member members employee contact""".split()
)
# Words that end a role right before a name: "CEO Annika Vogt", "Chief Engineer Piotr Nowak".
_ROLE_ENDS = frozenset(
    """ceo cfo cto coo cco cio officer executive director manager chairman chairwoman chair chairperson president
    engineer captain master superintendent lawyer counsel secretary minister spokesperson spokesman spokeswoman
    founder owner professor inspector surveyor auditor analyst coordinator supervisor treasurer""".split()
)
_CONTRACT_WORDS = frozenset(
    "contract contracts agreement agreements amendment order orders award case charter notice policy reference ref "
    "claim invoice tender po dispute".split()
)
_CONTRACT_NAME_WORDS = frozenset("agreement contract charter amendment award lease licence license".split())
_PRODUCT_WORDS = frozenset(
    "engine engines series model models system systems software platform unit units product products version "
    "device app tool".split()
)
_EVENT_WORDS = frozenset(
    "conference summit festival championship championships olympics war cup forum expo fair week tournament "
    "election incident strike ceremony concert".split()
)
_NOT_SINGLE = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday january february march april may june july august
    september october november december ceo cfo cto coo cco cio ok okay am pm tv id faq pdf url http https www
    eur usd nok gbp sek dkk chf jpy cny krw i german european norwegian british english french dutch danish swedish
    finnish polish american chinese japanese korean italian spanish russian scottish irish african asian nordic
    scandinavian latvian indian canadian australian""".split()
)
_HEADER_KEYS = frozenset(
    """from to cc bcc date time subject sent re fw fwd note notes attachment attachments status summary decision
    action actions question answer q a example warning important result results conclusion background purpose
    scope update reference ref tel phone email e-mail fax address location agenda minutes present apologies
    chair total source sources author title version step tip objective outcome owner deadline comment comments
    response recommendation risk issue resolution motion vote item price cost amount payment delivery warranty
    timing funding customers customer supplier term terms definition definitions remarks remark""".split()
)
_PERSON_HEADERS = frozenset({"from", "to", "cc", "bcc", "sent by", "author", "signed"})
_CONNECTORS = frozenset({"of", "de", "del", "der", "den", "van", "von", "da", "di", "du", "la", "le", "am", "&",
                         "for", "y", "e"})
_OPENERS = frozenset(
    """yesterday today tomorrow tonight recently finally later currently actually unfortunately fortunately
    hopefully honestly dear congratulations welcome sorry thanks hey hi hello also however meanwhile please
    great awesome absolutely definitely totally sounds sure exactly agreed indeed cool nice wow yay oops alright
    right well perfect amazing excellent glad good""".split()
)
_NON_VERBS = STOPWORDS | frozenset("a an the of and or but in on at to for with by from as than".split())
_VERB_AUXILIARIES = frozenset(
    "is was are were has had have will would shall should can could may might must does did became becomes "
    "remains remained".split()
)

_FIRST_NAMES = frozenset(
    """aaron adam adrian agnes ahmed aiden alan albert alex alexander alexandra alice alicia amanda amelia amy ana
    anders andrea andreas andrew angela anita anna anne annika anton antonio arne astrid ben benjamin bernard bjorn
    björn bob brian bruno camilla carl carla carlos caroline catherine charles charlotte chen chris christian
    christina christine christopher claire clara claudia colin daniel david deborah dennis diana dieter dmitri
    dorothy edward elena elias elizabeth ella emily emma eric erik eva ewan fatima felix fiona frank franz fred
    frederik freya friedrich gabriel george gerhard gina grace gregory greta gustav hailey hannah hanne hans harald
    harry heidi helen helga henrik henry hiroshi hugo ian ida ines ingeborg ingrid isabel isabella ivan jack jacob
    jake james jan jane janis jason jean jennifer jens jessica jim joachim johan johannes john jonas jonathan jorge
    jose josef joseph julia julian juliet karen kari karin karl kate katharina katherine kenji kevin kim klaus kristin
    lars laura lea lena leo li liam lin linda lisa liv lucas lucy ludwig luis lukas magnus maja malik marco marcus
    maren margaret maria marie mark marta marte martin mary mathias matthew matthias max maria michael michelle
    mikkel ming mohammed monika nadia natalia nathan nicholas nicola nils nina noah nora olaf olga oliver olivia
    omar oscar otto patricia patrick paul paula peter petra philip pieter piotr rachel rafael ragnhild ralf rebecca
    richard robert rory ruth ryan sally samuel sandra sara sarah sebastian sergei simon sofia sophie soren søren
    stefan stephen steven susan svein sven thomas tim tobias tom tomas trond ulrich ursula valentina victor viktor
    walter wei william wolfgang xavier yuki yuko yuriko zhang""".split()
)
_DEFAULT_ORDER = ("vessel", "organization", "person", "contract", "product", "event", "location", "date", "money",
                  "other")


@dataclass
class _Mention:
    start: int
    end: int
    name: str  # as written, vessel prefix and honorific removed
    tokens: tuple[str, ...]
    votes: dict[str, float] = field(default_factory=dict)
    fixed: str | None = None  # "date" or "money": found by pattern, not voted


@dataclass
class _Entity:
    name: str
    order: int
    votes: Counter = field(default_factory=Counter)
    fixed: str | None = None
    mention: str = ""
    description: str = ""
    defined: bool = False
    aliases: list[str] = field(default_factory=list)


@dataclass
class _Line:
    kind: str  # "text", "chat", "table"
    text: str
    topic: str
    speaker: str = ""
    cells: list[tuple[str, str]] = field(default_factory=list)  # (header, cell) for table rows
    spans: list[tuple[int, int]] = field(default_factory=list)  # each cell's span in ``text``


def _unpossessive(token: str) -> str:
    return token[:-2] if token.endswith(("'s", "’s")) else token


def _trim(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def _clean_inline(text: str) -> str:
    if "](" in text:
        text = _LINK.sub(r"\1", _IMAGE.sub(r"\1", text))
    if "<" in text:
        text = _TAG.sub(" ", text)
    if "*" in text or "_" in text or "`" in text:
        text = _EMPHASIS.sub("", text)
    return " ".join(text.split())


def _speaker_name(raw: str) -> str:
    return " ".join(_CAMEL_SPLIT.sub(" ", raw).split()) if _CAMEL.match(raw) else raw


def _pieces(sentence: str) -> Iterable[str]:
    """The sentence, cut at word boundaries when it is longer than a statement should be."""
    while len(sentence) > MAX_STATEMENT_CHARS:
        cut = sentence.rfind(" ", MAX_STATEMENT_CHARS // 2, MAX_STATEMENT_CHARS)
        cut = cut if cut > 0 else MAX_STATEMENT_CHARS
        yield sentence[:cut].strip()
        sentence = sentence[cut:].strip()
    if sentence:
        yield sentence


def _table_cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [_clean_inline(cell) for cell in re.split(r"(?<!\\)\|", body)]


class HeuristicExtractor:
    """Sentences as statements, cue-typed proper-noun entities, co-occurrence relations, heading topics."""

    name = "heuristic"
    model = "heuristic-v1"
    prompt_version = short_hash(RULES_VERSION, 12)

    def __init__(self, entity_types: Iterable[str] | None = None) -> None:
        self.response_model = extraction_model(entity_types)
        self.entity_types = self.response_model.entity_types

    # -- public -------------------------------------------------------------------------------

    def extract(self, chunk: ChunkInput) -> ExtractionOutcome:
        started = time.perf_counter()
        extraction = self.extract_text(chunk.text, chunk.heading_path)
        return ExtractionOutcome(
            extraction=extraction, extractor=self.name, model=self.model, prompt_version=self.prompt_version,
            seconds=time.perf_counter() - started,
        )

    def extract_text(self, text: str, heading_path: str = "") -> ChunkExtraction:
        """The extraction of one chunk's text; ``heading_path`` is its headings joined by " > "."""
        if not text or not text.strip():
            return self.response_model()
        lines = self._lines(text, heading_path)
        sentences: list[tuple[_Line, str]] = []
        for line in lines:
            if line.kind == "table":
                sentences.append((line, line.text))
                continue
            for start, end in split_sentences(line.text):
                for piece in _pieces(line.text[start:end]):
                    sentences.append((line, piece))
        sentence_tokens = [list(_TOKEN.finditer(sentence)) for _, sentence in sentences]
        lowercase, capitalised_inside = self._word_cases(sentences, sentence_tokens)
        entities: dict[str, _Entity] = {}
        per_sentence: list[list[tuple[_Mention, str]]] = []
        for (line, sentence), tokens in zip(sentences, sentence_tokens):
            mentions = self._mentions(line, sentence, tokens, lowercase, capitalised_inside)
            keyed = []
            for mention in mentions:
                key = mention.name.casefold()
                entity = entities.get(key)
                if entity is None:
                    entity = entities[key] = _Entity(mention.name, len(entities))
                entity.votes.update(mention.votes)
                if mention.fixed:
                    entity.fixed = mention.fixed
                context = f"{line.speaker}: {sentence}" if line.speaker else sentence
                if not entity.mention:
                    entity.mention = _trim(context, MENTION_CHARS)
                    entity.description = _trim(context, DESCRIPTION_CHARS)
                if not entity.defined and mention.start == 0 and _DEFINES.match(sentence, mention.end):
                    entity.description, entity.defined = _trim(sentence, DESCRIPTION_CHARS), True
                keyed.append((mention, key))
            per_sentence.append(keyed)
        return self._build(sentences, sentence_tokens, per_sentence, entities, self._aliases(entities))

    # -- lines --------------------------------------------------------------------------------

    def _lines(self, text: str, heading_path: str) -> list[_Line]:
        headings = [part for part in heading_path.split(HEADING_SEPARATOR) if part.strip()] if heading_path else []
        topic = _clean_inline(headings[-1].lstrip("#")) if headings else ""
        raw = text.splitlines()
        prefixes = Counter(match.group("speaker") for line in raw if (match := _SPEAKER.match(line)))
        lines: list[_Line] = []
        in_code = False
        header: list[str] = []
        for index, line in enumerate(raw):
            if _FENCE.match(line):
                in_code = not in_code
                continue
            if in_code or not line.strip():
                if not line.strip():
                    header = []
                continue
            heading = _HEADING.match(line)
            if heading:
                topic = _clean_inline(heading.group(2)) or topic
                header = []
                continue
            if line.lstrip().startswith("|") or (header and "|" in line):
                if _TABLE_SEPARATOR.match(line):
                    continue
                cells = _table_cells(line)
                following = raw[index + 1] if index + 1 < len(raw) else ""
                if _TABLE_SEPARATOR.match(following):
                    header = cells
                    continue
                named = [(header[i] if i < len(header) else "", cell) for i, cell in enumerate(cells)]
                named = [(head, cell) for head, cell in named if cell]
                if sum(len(head) + len(cell) for head, cell in named) > 4 * MAX_STATEMENT_CHARS:
                    lines.append(_Line("text", " ".join(cell for _, cell in named), topic))  # cut like prose
                elif named:
                    parts, spans, length = [], [], 0
                    for head, cell in named:
                        label = f"{head}: " if head else ""
                        start = length + (2 if parts else 0) + len(label)
                        parts.append(label + cell)
                        spans.append((start, start + len(cell)))
                        length = start + len(cell)
                    lines.append(_Line("table", "; ".join(parts), topic, cells=named, spans=spans))
                continue
            header = []
            speaker = _SPEAKER.match(line)
            if speaker and self._is_speaker(speaker.group("speaker"), prefixes):
                lines.append(_Line("chat", _clean_inline(speaker.group("message")), topic,
                                   speaker=_speaker_name(speaker.group("speaker"))))
                continue
            body = _LIST_MARKER.sub("", line, count=1)
            body = _QUOTE_MARKER.sub("", body, count=1)
            lines.append(_Line("text", _clean_inline(body), topic))
        return [line for line in lines if line.text]

    @staticmethod
    def _is_speaker(raw: str, prefixes: Counter) -> bool:
        if raw.casefold() in _HEADER_KEYS or " " in raw:
            return False
        if _CAMEL.match(raw) or raw.casefold() in _FIRST_NAMES:
            return True
        # A single capitalised word is a speaker when the chunk reads like a conversation:
        # it speaks more than once, or another speaker talks too.
        others = sum(count for name, count in prefixes.items() if name.casefold() not in _HEADER_KEYS)
        return prefixes[raw] >= 2 or others >= 2

    @staticmethod
    def _word_cases(sentences: list[tuple[_Line, str]],
                    sentence_tokens: list[list[re.Match[str]]]) -> tuple[set[str], set[str]]:
        """The words the chunk writes in lowercase (common words), and those it capitalises somewhere other
        than at a sentence's (or table cell's) start (names, not openers)."""
        lowercase: set[str] = set()
        capitalised: set[str] = set()
        for (line, _), tokens in zip(sentences, sentence_tokens):
            table = line.kind == "table"
            starts = {start for start, _ in line.spans}
            for position, match in enumerate(tokens):
                token = match.group()
                first = token[0]
                if first.islower():
                    lowercase.add(token.casefold())
                elif position and first.isupper():
                    if table and (match.start() in starts
                                  or not any(a <= match.start() < b for a, b in line.spans)):
                        continue
                    capitalised.add(_unpossessive(token).casefold())
        return lowercase, capitalised

    # -- entities -----------------------------------------------------------------------------

    def _mentions(self, line: _Line, sentence: str, tokens: list[re.Match[str]], lowercase: set[str],
                  capitalised_inside: set[str]) -> list[_Mention]:
        mentions: list[_Mention] = []
        masked: list[tuple[int, int]] = []
        patterns = ((_MONEY, "money", 0), (_DATE, "date", 0), (_YEAR, "date", 1)) if _DIGIT.search(sentence) else ()
        for pattern, kind, group in patterns:  # every amount and date has a digit
            for match in pattern.finditer(sentence):
                start, end = match.span(group)
                if any(start < b and a < end for a, b in masked):
                    continue
                masked.append((start, end))
                value = _SPACE.sub(" ", match.group(group)).strip(" ,")
                mentions.append(_Mention(start, end, value, (value,), fixed=kind))
        if line.kind == "chat" and line.speaker:
            mentions.append(_Mention(-1, -1, line.speaker, tuple(line.speaker.split()), votes={"person": 3.0}))
        if masked:
            tokens = [match for match in tokens if not any(a <= match.start() < b for a, b in masked)]
        starts = {tokens[0].start()} if tokens else set()
        if line.kind == "table":  # headers are no names, and every cell starts like a sentence
            tokens = [match for match in tokens if any(a <= match.start() < b for a, b in line.spans)]
            starts = {match.start() for match in tokens if any(a == match.start() for a, _ in line.spans)}
        mentions.extend(self._phrases(sentence, tokens, masked, starts, lowercase, capitalised_inside))
        if line.kind == "table":
            mentions.extend(self._cell_mentions(line, sentence, mentions))
        mentions.sort(key=lambda m: (m.start, -m.end))
        kept: list[_Mention] = []
        last_end = -1
        for mention in mentions:
            if kept and mention.start >= 0 and (mention.start, mention.end) == (kept[-1].start, kept[-1].end):
                for kind, weight in mention.votes.items():  # a table cell that is also a phrase
                    kept[-1].votes[kind] = kept[-1].votes.get(kind, 0.0) + weight
                continue
            if mention.start >= 0 and mention.start < last_end:
                continue
            if kept and kept[-1].start >= 0 and not mention.votes and not mention.fixed:
                gap = sentence[kept[-1].end:mention.start].strip()
                kind = max(kept[-1].votes, key=lambda k: kept[-1].votes[k], default=None)
                if gap in _LIST_GAPS and kind in ("location", "person", "organization", "product"):
                    mention.votes[kind] = 0.75  # "in Hamburg, Rotterdam and Gdansk"
            kept.append(mention)
            last_end = max(last_end, mention.end)
        return kept

    def _phrases(self, sentence: str, tokens: list[re.Match[str]], masked: list[tuple[int, int]], starts: set[int],
                 lowercase: set[str], capitalised_inside: set[str]) -> list[_Mention]:
        found: list[_Mention] = []
        run: list[re.Match[str]] = []
        pending: list[re.Match[str]] = []  # connectors waiting for a capitalised word
        honorific = vessel = False
        previous_end = -1
        run_start = 0  # index in ``tokens`` of the run's first token

        def close() -> None:
            nonlocal honorific, vessel
            if not run:
                if pending or honorific or vessel:
                    pending.clear()
                    honorific = vessel = False
                return
            if run:
                mention = self._mention(sentence, run, tokens, run_start, run[0].start() in starts, honorific, vessel,
                                        lowercase, capitalised_inside)
                if mention is not None:
                    found.append(mention)
            run.clear()
            pending.clear()
            honorific = vessel = False

        for position, match in enumerate(tokens):
            token = match.group()
            if not run and token[0].islower() and not (honorific or vessel or pending):
                previous_end = match.end()  # the common case: a lowercase word outside any name
                continue
            gap = sentence[previous_end:match.start()] if previous_end >= 0 else ""
            broken = previous_end >= 0 and (gap.strip(" ") not in ("", ".") or "." in gap and run
                                            and run[-1].group().casefold() not in _HONORIFICS
                                            and not run[-1].group().isupper())
            if masked and any(previous_end <= a < match.start() for a, _ in masked):
                broken = True
            if broken:
                close()
            previous_end = match.end()
            bare = _unpossessive(token)
            folded = bare.casefold().replace("’", "'")
            if not run and folded in _HONORIFICS and bare[:1].isupper():
                honorific = True
                continue
            if not run and bare in _VESSEL_PREFIXES:
                vessel = True
                continue
            capital = bare[:1].isupper() or bool(_CODE.match(bare)) or (bool(run) and folded in _LOWERCASE_SUFFIXES)
            if capital and folded in STOPWORDS:  # "The", "It"; but "Skagerrak Bunkering AS"
                capital = bool(run) and folded in LEGAL_SUFFIXES
            initial = match.start() in starts
            if capital and initial and (folded in _OPENERS or folded in lowercase) and not _CAMEL.match(bare):
                capital = False
            if capital:
                if not run:
                    run_start = position
                run.extend(pending)
                pending.clear()
                run.append(match)
                if bare != token:  # possessive ends the name: "Ostwind's Marine division"
                    close()
            elif run and (folded in _CONNECTORS or (folded == "the" and pending)) and len(pending) < 2:
                pending.append(match)
            elif run and bare.isdigit() and len(bare) <= 3 and not pending:
                run.append(match)  # "Quay 7", "Kanalstrasse 40"
                close()
            else:
                close()
                honorific = vessel = False
        close()
        return found

    def _mention(self, sentence: str, run: list[re.Match[str]], tokens: list[re.Match[str]], index: int,
                 initial: bool, honorific: bool, vessel: bool, lowercase: set[str],
                 capitalised_inside: set[str]) -> _Mention | None:
        words = tuple(_unpossessive(match.group()) for match in run)
        start, end = run[0].start(), run[-1].end() - (len(run[-1].group()) - len(words[-1]))
        folded = [word.casefold() for word in words]
        capitals = [word for word in words if word[:1].isupper() or _CODE.match(word)]
        if all(word in _ROLE_WORDS or word in STOPWORDS or word in _CONNECTORS for word in folded):
            return None  # "Chief Executive Officer": a role, and a cue for the next name
        if len(capitals) == 1 and len(words) == 1:
            word = words[0]
            if folded[0] in _NOT_SINGLE or folded[0] in LEGAL_SUFFIXES and not word.isupper():
                return None
            if not (honorific or vessel or _CODE.match(word) or _CAMEL.match(word)):
                if word.isupper():
                    if len(word) < 2:
                        return None
                elif folded[0] in lowercase:
                    return None
                elif initial and folded[0] not in capitalised_inside and folded[0] not in _FIRST_NAMES:
                    return None
                elif folded[0].endswith(_ADJECTIVE_ENDINGS) and folded[0] not in _FIRST_NAMES and not (
                        index and tokens[index - 1].group().casefold() in _LOCATION_PREPOSITIONS):
                    return None
        name = " ".join(sentence[start:end].split())
        mention = _Mention(start, end, name, words)
        self._vote(mention, sentence, tokens, index, len(run), honorific, vessel)
        return mention

    def _vote(self, mention: _Mention, sentence: str, tokens: list[re.Match[str]], index: int, length: int,
              honorific: bool, vessel: bool) -> None:
        votes = mention.votes
        folded = [word.casefold() for word in mention.tokens]
        before = [match.group().casefold() for match in tokens[max(0, index - 3):index]]
        after = [match.group().casefold() for match in tokens[index + length:index + length + 2]]

        def vote(kind: str, weight: float) -> None:
            votes[kind] = votes.get(kind, 0.0) + weight

        if vessel:
            vote("vessel", 4)
        if any(word in _VESSEL_WORDS for word in before[-2:]):
            vote("vessel", 1.5)
        if folded[-1].replace(".", "") in LEGAL_SUFFIXES and len(folded) > 1:
            vote("organization", 4)
        if any(word in _ORG_WORDS for word in folded[1:]) or (len(folded) > 1 and folded[0] in _ORG_WORDS):
            vote("organization", 2)
        if honorific:
            vote("person", 4)
        alpha = all(word.isalpha() and not word.isupper() for word in mention.tokens)
        if folded[0] in _FIRST_NAMES and alpha and len(folded) <= 3:
            vote("person", 2 if len(folded) > 1 else 1)
        if alpha and len(folded) <= 3 and any(word in _ROLE_ENDS for word in before[-2:]):
            vote("person", 1.5)
        if sentence[:mention.start].rstrip().casefold().rstrip(":") in _PERSON_HEADERS:
            vote("person", 2)
        if " ".join(folded) in _COUNTRIES or folded[-1] in _COUNTRIES:
            vote("location", 3)
        if any(word in _LOCATION_WORDS for word in folded[1:]) or (len(folded) > 1 and folded[-1].isdigit()):
            vote("location", 1.5)
        if before and before[-1] in _LOCATION_PREPOSITIONS:
            vote("location", 1)
        elif before and before[-1] == "to" and alpha:
            vote("location", 0.5)
        if any(word in _CONTRACT_NAME_WORDS for word in folded):
            vote("contract", 2)
        code = _CODE.match(mention.tokens[-1]) is not None
        if code and any(word in _CONTRACT_WORDS for word in before):
            vote("contract", 2.5)
        if code and after and after[0] in _PRODUCT_WORDS:
            vote("product", 2)
        if any(word in _EVENT_WORDS for word in folded[1:]):
            vote("event", 2)

    def _cell_mentions(self, line: _Line, sentence: str, mentions: list[_Mention]) -> list[_Mention]:
        """A table row's first cell and the cells under a typed header are entities as a whole."""
        found: list[_Mention] = []
        for column, ((head, cell), (position, cursor)) in enumerate(zip(line.cells, line.spans)):
            kind = self._header_type(head)
            if not cell[:1].isupper() or len(cell.split()) > 6 or (column and kind is None):
                continue
            if any(m.fixed for m in mentions if m.start >= position and m.end <= cursor):
                continue
            mention = _Mention(position, cursor, cell, tuple(cell.split()), votes={kind: 2.5} if kind else {})
            self._vote_words(mention)
            found.append(mention)
        return found

    def _vote_words(self, mention: _Mention) -> None:
        folded = [word.casefold() for word in mention.tokens]
        if len(folded) > 1 and folded[-1].replace(".", "") in LEGAL_SUFFIXES:
            mention.votes["organization"] = mention.votes.get("organization", 0.0) + 4
        if folded and folded[0] in _FIRST_NAMES and len(folded) <= 3:
            mention.votes["person"] = mention.votes.get("person", 0.0) + 2
        if " ".join(folded) in _COUNTRIES:
            mention.votes["location"] = mention.votes.get("location", 0.0) + 3

    @staticmethod
    def _header_type(head: str) -> str | None:
        words = set(re.findall(r"[a-z]+", head.casefold()))
        for kind, cues in (
            ("person", {"name", "executive", "ceo", "contact", "person", "manager", "owner", "author", "director",
                        "chair", "chairman", "captain", "master", "employee", "representative", "signatory"}),
            ("organization", {"supplier", "company", "customer", "client", "party", "organisation", "organization",
                              "vendor", "counterparty", "insurer", "operator", "contractor", "subsidiary", "owner"}),
            ("vessel", {"vessel", "ship", "hull"}),
            ("location", {"country", "city", "location", "port", "place", "site", "region", "headquarters"}),
            ("contract", {"contract", "agreement"}),
        ):
            if words & cues:
                return kind
        return None

    @staticmethod
    def _aliases(entities: dict[str, _Entity]) -> dict[str, str]:
        """A one-word entity that starts (or, for a person, ends) exactly one longer entity is that entity."""
        firsts: dict[str, list[str]] = {}
        lasts: dict[str, list[str]] = {}
        prefixes: dict[str, list[str]] = {}
        for key, entity in entities.items():
            words = key.split()
            if entity.fixed or len(words) < 2:
                continue
            firsts.setdefault(words[0], []).append(key)
            lasts.setdefault(words[-1], []).append(key)
            for cut in range(1, len(words)):
                if all(word.replace(".", "") in LEGAL_SUFFIXES for word in words[cut:]):
                    prefixes.setdefault(" ".join(words[:cut]), []).append(key)
        aliases: dict[str, str] = {}
        for key, entity in entities.items():
            if entity.fixed:
                continue
            if key in prefixes and len(prefixes[key]) == 1:
                aliases[key] = prefixes[key][0]
            elif " " not in key:
                candidates = firsts.get(key, []) + [
                    other for other in lasts.get(key, []) if entities[other].votes.get("person")]
                candidates = sorted(set(candidates))
                if len(candidates) == 1:
                    aliases[key] = candidates[0]
        return aliases

    @staticmethod
    def _type(entity: _Entity) -> str:
        if entity.fixed:
            return entity.fixed
        if not entity.votes:
            return "other"
        best = max(entity.votes.values())
        return next(kind for kind in _DEFAULT_ORDER if entity.votes.get(kind) == best)

    # -- assembly -----------------------------------------------------------------------------

    def _build(self, sentences: list[tuple[_Line, str]], sentence_tokens: list[list[re.Match[str]]],
               per_sentence: list[list[tuple[_Mention, str]]],
               entities: dict[str, _Entity], aliases: dict[str, str]) -> ChunkExtraction:
        for key, target in aliases.items():
            into, alias = entities[target], entities[key]
            into.votes.update(alias.votes)
            into.aliases.append(alias.name)
            if alias.order < into.order:
                into.order, into.mention = alias.order, alias.mention
                if not into.defined:
                    into.description = alias.description
        types = {key: self._type(entity) for key, entity in entities.items() if key not in aliases}
        topics: dict[str, list[dict]] = {}
        pair_counts: Counter[tuple[str, str]] = Counter()
        # unordered pair -> (source, target, predicate, sentence) where the pair first occurs
        pair_first: dict[tuple[str, str], tuple[str, str, str, str]] = {}
        for (line, sentence), keyed in zip(sentences, per_sentence):
            resolved: list[tuple[_Mention, str]] = []
            seen: set[str] = set()
            for mention, key in keyed:
                key = aliases.get(key, key)
                if key not in seen:
                    seen.add(key)
                    resolved.append((mention, key))
            text = f"{line.speaker}: {sentence}" if line.speaker else sentence
            facts = self._facts(line, sentence, resolved, entities)
            topic = line.topic or ""
            topics.setdefault(topic, []).append({"text": text, "facts": facts})
            self._pairs(line, sentence, resolved, types, pair_counts, pair_first)
        if "" in topics:
            untitled = topics.pop("")
            name = self._keyword_topic(sentences, sentence_tokens, per_sentence)
            topics[name] = untitled + topics.get(name, [])
        relations = []
        for pair, count in sorted(pair_counts.items(),
                                  key=lambda item: (entities[item[0][0]].order, entities[item[0][1]].order)):
            source, target, predicate, sentence = pair_first[pair]
            relations.append({
                "source": entities[source].name, "target": entities[target].name, "predicate": predicate,
                "description": _trim(sentence, DESCRIPTION_CHARS), "strength": round(count / (count + 1), 4),
            })
        ordered = sorted((key for key in entities if key not in aliases), key=lambda key: entities[key].order)
        entity_rows = []
        for key in ordered:
            entity = entities[key]
            description = entity.description
            if entity.aliases:
                description = f"{description} (also written: {', '.join(sorted(set(entity.aliases)))})"
            entity_rows.append({"name": entity.name, "type": types[key], "description": description,
                                "mention": entity.mention})
        return self._construct(topics, entity_rows, relations)

    def _construct(self, topics: dict[str, list[dict]], entities: list[dict], relations: list[dict]) -> ChunkExtraction:
        """The extraction without re-validating it: the rules above already keep what the validators demand
        (clean strings, complete facts, known types, relations between listed entities); the tests check
        that validating the result changes nothing. Validation would cost a fifth of the time."""
        entity_model = self.response_model.model_fields["entities"].annotation.__args__[0]
        types: dict[str, str] = {}

        def known(kind: str) -> str:
            if kind not in types:
                types[kind] = normalise_entity_type(kind, self.entity_types)
            return types[kind]

        return self.response_model.model_construct(
            topics=[Topic.model_construct(name=name, statements=[
                Statement.model_construct(text=statement["text"], facts=[
                    Fact.model_construct(**fact) for fact in statement["facts"]]) for statement in statements])
                for name, statements in topics.items()],
            entities=[entity_model.model_construct(name=row["name"], type=known(row["type"]),
                                                   description=row["description"], mention=row["mention"])
                      for row in entities],
            relations=[Relation.model_construct(**row) for row in relations],
        )

    @staticmethod
    def _keyword_topic(sentences: list[tuple[_Line, str]], sentence_tokens: list[list[re.Match[str]]],
                       per_sentence: list[list[tuple[_Mention, str]]]) -> str:
        """The chunk's top keywords, as KET-RAG's keyword graph has them: content words and the names in the
        text (not chat speakers, who would name every chunk of a conversation), from the sentences without a
        heading, reading at most :data:`TOPIC_CHARS` of them."""
        counts: Counter[str] = Counter()
        budget = TOPIC_CHARS
        for (line, sentence), tokens, keyed in zip(sentences, sentence_tokens, per_sentence):
            if line.topic or budget <= 0:
                continue
            budget -= len(sentence)
            for match in tokens:
                word = _unpossessive(match.group().casefold().replace("’", "'"))
                if len(word) > 2 and word not in STOPWORDS and not word.isdigit() and word not in _OPENERS \
                        and word not in _NOT_SINGLE:
                    counts[word] += 1
            for mention, _ in keyed:
                if mention.start >= 0 and not mention.fixed and " " in mention.name:
                    counts[mention.name.casefold()] += 1
        top = sorted(counts.items(), key=lambda item: (-item[1], -len(item[0].split()), item[0]))[:TOPIC_KEYWORDS]
        return ", ".join(word for word, _ in top) or "general"

    @staticmethod
    def _facts(line: _Line, sentence: str, resolved: list[tuple[_Mention, str]],
               entities: dict[str, _Entity]) -> list[dict]:
        facts: list[dict] = []
        inline = [(mention, key) for mention, key in resolved if mention.start >= 0]
        if line.kind == "table":
            if len(inline) >= 1 and line.cells:
                first_head, first_cell = line.cells[0]
                subject = next((entities[key].name for mention, key in inline
                                if mention.name == first_cell), None)
                if subject is not None:
                    seen: set[tuple[str, str]] = set()
                    for head, cell in line.cells[1:]:
                        if head and cell and (head.casefold(), cell.casefold()) not in seen:
                            seen.add((head.casefold(), cell.casefold()))
                            facts.append({"subject": subject, "predicate": head.casefold(), "object": cell})
            return facts
        if len(inline) < 2:
            return facts
        subject, key = inline[0]
        lead = sentence[:subject.start].strip().casefold()
        if lead not in ("", "the"):
            return facts
        obj, object_key = inline[1]
        between = _SPACE.sub(" ", sentence[subject.end:obj.start]).strip()
        if lead == "" and between.casefold().endswith(" the"):
            between = between[:-4].rstrip()
        if not _PLAIN_WORDS.match(between):
            return facts
        first = between.split()[0]
        if first in _NON_VERBS and first not in _VERB_AUXILIARIES:
            return facts
        if not (first in _VERB_AUXILIARIES or first.endswith(("ed", "s")) or len(between.split()) > 1):
            return facts
        object_name = obj.name if obj.fixed else entities[object_key].name
        facts.append({"subject": entities[key].name, "predicate": between, "object": object_name})
        return facts

    @staticmethod
    def _pairs(line: _Line, sentence: str, resolved: list[tuple[_Mention, str]], types: dict[str, str],
               counts: Counter, first: dict[tuple[str, str], tuple[str, str, str, str]]) -> None:
        named = [(mention, key) for mention, key in resolved if types.get(key) not in ("date", "money")]
        named = named[:MAX_PAIR_ENTITIES]
        headers = {cell: head for head, cell in line.cells}
        for i, (left, left_key) in enumerate(named):
            for right, right_key in named[i + 1:]:
                if left_key == right_key:
                    continue
                predicate = "co-occurs with"
                if line.kind == "table":
                    if i != 0:
                        continue  # a row relates its first cell to the others
                    predicate = headers.get(right.name, "").casefold() or predicate
                elif left.start >= 0 and right.start >= left.end:
                    between = sentence[left.end:right.start].strip()
                    if between.isalpha() and between.islower() and between not in _NON_VERBS:
                        predicate = between
                pair = (left_key, right_key) if left_key < right_key else (right_key, left_key)
                counts[pair] += 1
                context = f"{line.speaker}: {sentence}" if line.speaker else sentence
                first.setdefault(pair, (left_key, right_key, predicate, context))
