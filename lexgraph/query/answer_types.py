"""What a question asks for: the answer type read off its question word (DESIGN.md §6).

who → a person or organisation; when → a date or time; how much / how many → an amount; where → a place;
"which X" / "what X" → something headed by X (typed where X names a kind of place, time or person);
a question opening with an auxiliary ("Is …", "Did …") → yes or no; why / how / a bare "what" → a sentence
or any named thing. The rules follow English question grammar, not any benchmark's questions.

Each type says how well each spaCy entity label fits it (1.0 exact, less for a near fit); an answer
candidate's score is multiplied by that fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PERSON_OR_ORG = {"PERSON": 1.0, "ORG": 1.0, "NORP": 0.5}
DATE_OR_TIME = {"DATE": 1.0, "TIME": 1.0}
PLACE = {"GPE": 1.0, "LOC": 1.0, "FAC": 1.0, "ORG": 0.3}
MONEY_OR_AMOUNT = {"MONEY": 1.0, "QUANTITY": 1.0, "PERCENT": 1.0, "CARDINAL": 0.8}
COUNT = {"CARDINAL": 1.0, "QUANTITY": 1.0, "MONEY": 0.5, "PERCENT": 0.5}
DURATION = {"DATE": 1.0, "TIME": 1.0, "QUANTITY": 0.8, "CARDINAL": 0.5}
NAMED = {"PERSON": 0.7, "ORG": 0.7, "GPE": 0.7, "LOC": 0.7, "FAC": 0.7, "NORP": 0.7, "PRODUCT": 0.7,
         "EVENT": 0.7, "WORK_OF_ART": 0.7, "LAW": 0.7, "LANGUAGE": 0.7, "DATE": 0.5, "MONEY": 0.5,
         "QUANTITY": 0.5, "PERCENT": 0.5, "CARDINAL": 0.3, "TIME": 0.5, "ORDINAL": 0.3}

# en_core_web_sm often gives a name the wrong name label ("Annika Vogt" LOC, "Kiel" PERSON): a name of another
# kind still fits a person, organisation or place question a little, so the reader can weigh it by its sentence
# instead of never seeing it.
NAME_LABELS = ("PERSON", "ORG", "GPE", "LOC", "FAC", "NORP", "PRODUCT", "EVENT", "WORK_OF_ART")
OTHER_NAME_FIT = 0.4


def _names_fit(labels: dict[str, float]) -> dict[str, float]:
    return {**{label: OTHER_NAME_FIT for label in NAME_LABELS}, **labels}


PERSON_OR_ORG = _names_fit(PERSON_OR_ORG)
PLACE = _names_fit(PLACE)

# Nouns after "which"/"what" that name a kind of thing spaCy's NER types: general English, not corpus words.
_PLACE_NOUNS = {"city", "town", "country", "state", "county", "province", "region", "place", "village", "river",
                "island", "continent", "capital", "location", "district", "area", "port", "nation", "municipality",
                "neighbourhood", "neighborhood", "street", "building", "venue", "site", "mountain", "lake", "sea"}
_TIME_NOUNS = {"year", "date", "day", "month", "decade", "century", "time", "period", "era", "season", "week"}
_PERSON_NOUNS = {"person", "man", "woman", "people", "individual", "actor", "actress", "singer", "author",
                 "writer", "player", "artist", "director", "president", "leader", "member", "founder", "owner",
                 "chairman", "chair", "ceo", "manager", "officer", "employee", "colleague", "friend", "spouse",
                 "wife", "husband", "son", "daughter", "father", "mother", "brother", "sister", "composer",
                 "politician", "king", "queen", "emperor", "musician", "band"}
_ORG_NOUNS = {"company", "organisation", "organization", "firm", "group", "team", "club", "university",
              "school", "college", "institution", "agency", "party", "label", "publisher", "network",
              "corporation", "business", "supplier", "manufacturer", "contractor", "bank", "airline",
              "newspaper", "magazine", "brand", "shipbuilder", "yard", "studio"}
_MONEY_NOUNS = {"price", "cost", "fee", "salary", "revenue", "budget", "fine", "payment", "income", "profit",
                "turnover", "wage", "provision", "penalty", "charge", "rent"}
_PERCENT_NOUNS = {"rate", "percentage", "share", "proportion", "margin"}
_NUMBER_NOUNS = {"number", "amount", "sum", "total", "value", "population", "count", "quantity", "figure",
                 *_MONEY_NOUNS, *_PERCENT_NOUNS}
MONEY = {"MONEY": 1.0, "QUANTITY": 0.5, "CARDINAL": 0.3, "PERCENT": 0.3}
PERCENTAGE = {"PERCENT": 1.0, "MONEY": 0.5, "QUANTITY": 0.5, "CARDINAL": 0.3}

_MONEY_VERBS = re.compile(r"\b(?:cost|costs|costing|pay|pays|paid|spend|spends|spent|charge|charges|charged|earn|"
                          r"earns|earned|worth|price|priced|owe|owes|owed|fee|fees|sell|sold|buy|bought)\b")
AUXILIARIES = ("is", "are", "was", "were", "do", "does", "did", "has", "have", "had", "can", "could", "will",
               "would", "should", "shall", "may", "might", "must")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
# "which X" / "what X" / "whose X": the wh-determiner and the words of its noun (to the next verb-ish word)
_WH_NOUN = re.compile(r"\b(which|what|whose)\s+((?:[A-Za-z][\w'’-]*\s+){0,3}?[A-Za-z][\w'’-]*)"
                      r"(?=\s+(?:is|are|was|were|did|does|do|has|have|had|can|could|will|would|of|in|on|at|for|"
                      r"to|from|by|with|that|who|which|where|when|[a-z]+ed|[a-z]+s)\b|\s*[?,.]|\s*$)", re.I)
_STOP_HEADS = {"is", "are", "was", "were", "did", "does", "do", "kind", "type", "sort", "the", "a", "an"}


@dataclass(frozen=True)
class AnswerType:
    name: str  # person_or_organisation | date_or_time | amount | count | duration | place | noun | named |
    #            yes_no | sentence
    labels: dict[str, float] = field(default_factory=dict)  # spaCy entity label -> fit
    head: str = ""  # "which X": X's head noun (lowercase); noun chunks headed by it fit 1.0

    @property
    def wants_span(self) -> bool:
        return self.name not in ("yes_no", "sentence")


def _singular(noun: str) -> str:
    """A plural noun's stem as the reader compares heads ("vessels" → "vessel", "crew" stays)."""
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") else noun


def _noun_type(words: str) -> AnswerType:
    """The type of "which <words>": by the head noun (the last word), else a noun chunk headed by it."""
    tokens = [w.lower() for w in _WORD.findall(words)]
    tokens = [t for t in tokens if t not in _STOP_HEADS] or [""]
    head = tokens[-1].rstrip("s") if tokens[-1].endswith("s") and tokens[-1][:-1] in (
        _PLACE_NOUNS | _TIME_NOUNS | _PERSON_NOUNS | _ORG_NOUNS | _NUMBER_NOUNS) else tokens[-1]
    if head in _PLACE_NOUNS:
        return AnswerType("place", PLACE, head)
    if head in _TIME_NOUNS:
        return AnswerType("date_or_time", DATE_OR_TIME, head)
    if head in _PERSON_NOUNS:
        return AnswerType("person_or_organisation", _names_fit({"PERSON": 1.0, "ORG": 0.6, "NORP": 0.5}), head)
    if head in _ORG_NOUNS:
        return AnswerType("person_or_organisation", _names_fit({"ORG": 1.0, "PERSON": 0.4}), head)
    if head in _MONEY_NOUNS:  # "what price": money, rarely a bare number (a clause number is not a price)
        return AnswerType("amount", MONEY, head)
    if head in _PERCENT_NOUNS:
        return AnswerType("amount", PERCENTAGE, head)
    if head in _NUMBER_NOUNS:
        return AnswerType("amount", MONEY_OR_AMOUNT, head)
    return AnswerType("noun", {k: min(v, 0.5) for k, v in NAMED.items()}, head)


def wh_noun(doc) -> str:
    """From a spaCy parse of the question: the noun a wh-determiner modifies ("which shipbuilder" →
    shipbuilder, "what kind of university" → university); "" when there is none."""
    for token in doc:
        if token.lower_ in ("which", "what", "whose") and token.dep_ in ("det", "poss") and \
                token.head.pos_ in ("NOUN", "PROPN"):
            head = token.head
            if head.lower_ in ("kind", "kinds", "type", "types", "sort"):
                objects = [c for p in head.children if p.dep_ == "prep" for c in p.children if c.dep_ == "pobj"]
                head = objects[0] if objects else head
            return head.text
    return ""


def copula_noun(doc) -> str:
    """In "what is/was <noun phrase>", the head noun of that phrase (the copula's subject or attribute that
    is not the question word); "" when there is none."""
    for token in doc:
        if token.dep_ == "ROOT" and token.lemma_ == "be":
            for child in token.children:
                if child.dep_ in ("nsubj", "attr") and child.pos_ in ("NOUN", "PROPN") and \
                        child.lower_ not in ("what", "which"):
                    return child.text
    return ""


def answer_type(question: str, parse=None) -> AnswerType:
    """The answer type of a question (English only). `parse` (text -> spaCy Doc) finds the noun after
    "which"/"what" from the dependency parse; without it, a word pattern does."""
    text = " ".join(question.split())
    lowered = text.lower()
    # the question proper is the last sentence ("… is a county. In what city is …?")
    last = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)[-1]
    low = last.lower().lstrip("¿¡\"'“ ")
    low = re.sub(r"^(?:question\s*:\s*|so,?\s+|and\s+|but\s+|ok(?:ay)?,?\s+|hey,?\s+|quick question\s*[:,-]?\s*)",
                 "", low)
    low = re.sub(r"^(?:according to [^,]+,\s*|(?:in|on|at|for|from|by|to|with|within|during|of|since|until|after|before)\s+"
                 r"(?=(?:which|what|whose|whom|how|when|where)\b))", "", low)
    first = low.split(" ", 1)[0] if low else ""
    if first in ("who", "whom"):
        return AnswerType("person_or_organisation", PERSON_OR_ORG)
    if first == "whose":
        return AnswerType("person_or_organisation", PERSON_OR_ORG)
    if first == "when" or re.match(r"^(?:what|which)\s+(?:year|date|day|month|time|decade|century)\b", low):
        return AnswerType("date_or_time", DATE_OR_TIME)
    if first == "where":
        return AnswerType("place", PLACE)
    if low.startswith("how many"):
        counted = re.match(r"^how many\s+([a-z][\w'’-]*)", low)
        noun = counted.group(1) if counted and counted.group(1) not in _STOP_HEADS and \
            counted.group(1) not in AUXILIARIES else ""
        return AnswerType("count", COUNT, _singular(noun))
    if low.startswith("how much") and _MONEY_VERBS.search(low) or re.match(r"^how (?:expensive|costly)\b", low):
        return AnswerType("amount", MONEY)  # "how much will it cost": money, not the quay's 240 metres
    if low.startswith("how much") or re.match(r"^how (?:large|big|high)\b", low):
        return AnswerType("amount", MONEY_OR_AMOUNT)
    if re.match(r"^how (?:long|old|soon|often)\b", low):
        return AnswerType("duration", DURATION)
    if first in AUXILIARIES and not re.search(r"\b(?:or)\b", low):
        return AnswerType("yes_no")
    if first in ("why", "how"):
        return AnswerType("sentence")
    if first in ("which", "what"):
        if re.match(r"^(?:what|which)\s+(?:is|are|was|were|does|do|did|has|have|had)\b", low):
            # "what is the X of …": the X is the noun asked for
            focus = re.match(r"^(?:what|which)\s+(?:is|are|was|were)\s+(?:the\s+|a\s+|an\s+)?"
                             r"((?:[\w'’-]+\s+){0,2}?[\w'’-]+)\s+(?:of|for|at|in|on|behind|that|which|who)\b", low)
            if focus:
                typed = _noun_type(focus.group(1))
                return typed if typed.name != "noun" else AnswerType("named", NAMED, typed.head)
            # "What was the group's revenue in 2023?": the copula's other noun is the thing asked for
            noun = copula_noun(parse(last)) if parse is not None else ""
            if noun:
                typed = _noun_type(noun)
                return typed if typed.name != "noun" else AnswerType("named", NAMED, typed.head)
            return AnswerType("named", NAMED)
        noun = wh_noun(parse(last)) if parse is not None else ""
        if noun:
            return _noun_type(noun)
        match = _WH_NOUN.match(low)
        if match:
            return _noun_type(match.group(2))
        return AnswerType("named", NAMED)
    # the wh-word later in the sentence: "The singer … signed to which record label?"
    noun = wh_noun(parse(last)) if parse is not None else ""
    if noun:
        return _noun_type(noun)
    match = _WH_NOUN.search(low)
    if match and match.group(1) in ("which", "what"):
        return _noun_type(match.group(2))
    for word, typed in (("who", AnswerType("person_or_organisation", PERSON_OR_ORG)),
                        ("when", AnswerType("date_or_time", DATE_OR_TIME)), ("where", AnswerType("place", PLACE))):
        if re.search(rf"\b{word}\b[^,]*\?\s*$", low):
            return typed
    if "how many" in lowered:
        return AnswerType("count", COUNT)
    if "how much" in lowered:
        return AnswerType("amount", MONEY_OR_AMOUNT)
    return AnswerType("sentence")
