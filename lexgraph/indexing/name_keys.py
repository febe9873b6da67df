"""The keys names are matched by, and why two surface forms were folded into one.

Extraction runs per chunk, so "Kestrel Propulsion GmbH" in one contract and "the Kestrel
Propulsion" in an e-mail arrive as two names. :func:`normalise_entity_name` is their matching key:
case folded, accents and punctuation dropped, whitespace collapsed, a leading article ("the", "a",
"an"), a leading honorific or vessel prefix ("Dr.", "MV") and trailing legal suffixes (GmbH, AS,
Ltd, S.A., "GmbH & Co. KG", ...) removed. Never empty for a name with a letter or digit: a name
that is nothing but an article and a suffix ("The GmbH") keeps the suffix. :func:`entity_id` and
:func:`fact_id` are content hashes of those keys, so the same fact from two sources (any case,
article or legal suffix) is one id. :func:`merge_reasons` names the normalisation steps that made
two forms one ("case", "leading article", "legal suffix GmbH", ...): the audit trail of a merge.

The entities, their splits by type and the merges table: :mod:`lexgraph.indexing.entity_resolution`;
facts and relations: :mod:`lexgraph.indexing.fact_resolution`.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter

from lexgraph.ids import short_hash

LEGAL_SUFFIXES: frozenset[str] = frozenset(
    """gmbh mbh ag as asa ltd limited llc llp lp inc incorporated corp corporation plc sa sas sarl srl spa bv nv
    co kg kgaa ohg oy oyj ab aps se sia pty pte bhd sdn kk ltda sl ug cv""".split()
)
LEADING_ARTICLES: frozenset[str] = frozenset({"the", "a", "an"})
# Honorifics and vessel prefixes: "Dr. Annika Vogt" is Annika Vogt, "MV Nordlys Spirit" is Nordlys Spirit.
LEADING_TITLES: frozenset[str] = frozenset(
    "dr mr mrs ms mx miss prof sir dame herr frau mv mt ss rv fv".split()
)
# The normalisation steps, in the words a merge's reason uses.
WHITESPACE, CASE, ACCENTS, PUNCTUATION, ARTICLE, TITLE, SUFFIX = (
    "whitespace", "case", "accents", "punctuation", "leading article", "leading title", "legal suffix",
)
STEPS = (WHITESPACE, CASE, ACCENTS, PUNCTUATION, ARTICLE, TITLE, SUFFIX)
ID_LENGTH = 16  # hex digits: 64 bits keeps collisions negligible for millions of nodes

_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_POSSESSIVE = re.compile(r"['’]s(?![^\W_])")
_DROPPED = re.compile(r"[.'’`´]")
_INNER_MARK = re.compile(r"(?<=\S)(?:[^\w\s\x00]|_)+(?=\S)")
_MARK = re.compile(r"(?:[^\w\s\x00]|_)+")
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+")


# -- keys -------------------------------------------------------------------------------------


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


def _strip_punctuation(text: str) -> str:
    """Possessives, dots and apostrophes go ("S.A." → "SA"); other marks between words become a space."""
    text = _POSSESSIVE.sub("", text)
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub("\x00", text)  # 4.5 stays 4.5
    text = text.replace("&", " and ")
    text = _DROPPED.sub("", text)
    text = _INNER_MARK.sub(" ", text)
    text = _MARK.sub("", text)
    return text.replace("\x00", ".")


def _bare(token: str) -> str:
    return "".join(_WORD.findall(token.casefold()))


def _normalise(name: str, skip: frozenset[str] = frozenset()) -> str:
    text = unicodedata.normalize("NFKC", name)
    if CASE not in skip:
        text = text.casefold()
    if ACCENTS not in skip:
        text = _strip_accents(text)
    if PUNCTUATION not in skip:
        text = _strip_punctuation(text)
    tokens = text.split() if WHITESPACE not in skip else text.split(" ")
    if ARTICLE not in skip and len(tokens) > 1 and tokens[0].casefold() in LEADING_ARTICLES:
        tokens = tokens[1:]
    if TITLE not in skip:
        tokens = tokens[_title_length(tokens):]
    if SUFFIX not in skip:
        stripped = False
        while len(tokens) > 1 and _bare(tokens[-1]) in LEGAL_SUFFIXES:
            tokens, stripped = tokens[:-1], True
            while stripped and len(tokens) > 1 and _bare(tokens[-1]) in ("and", ""):
                tokens = tokens[:-1]  # "GmbH & Co. KG"
    return " ".join(tokens)


def _title_length(tokens: list[str]) -> int:
    """How many leading tokens are an honorific or vessel prefix ("Dr.", "MV", "M/V" or, punctuation gone, "m v")."""
    if len(tokens) > 1 and _bare(tokens[0]) in LEADING_TITLES:
        return 1
    if len(tokens) > 2 and len(tokens[0]) == len(tokens[1]) == 1 and (tokens[0] + tokens[1]).casefold() in (
            "mv", "mt", "ms"):
        return 2
    return 0


def normalise_entity_name(name: str) -> str:
    """The key entity names are matched by ("Kestrel Propulsion GmbH" and "the Kestrel Propulsion" → "kestrel propulsion").

    Steps: NFKC, case fold, accents, punctuation (possessives, dots and apostrophes dropped, other
    marks between words a space, "&" → "and"), whitespace, a leading article, a leading
    honorific or vessel prefix ("Dr.", "MV"), trailing legal suffixes.

    Empty only for a name without a letter or digit.
    """
    if not name:
        return ""
    key = _normalise(name)
    return key if any(c.isalnum() for c in key) else ""


def entity_key(name: str) -> str:
    """:func:`normalise_entity_name`, or for a name of punctuation only its folded text (so never empty for a non-blank name)."""
    key = normalise_entity_name(name or "")
    if key:
        return key
    folded = _SPACE.sub(" ", unicodedata.normalize("NFKC", name or "")).strip().casefold()
    return f"~{folded}" if folded else ""


def entity_id(name: str) -> str:
    """The id of the name's entity: a filesystem-safe hash of the normalised name. When the name is split
    by type (a person and a place), this is the larger family's id (:func:`entity_senses`)."""
    key = entity_key(name)
    if not key:
        raise ValueError("an entity needs a non-blank name")
    return entity_id_of_key(key)


def entity_id_of_key(key: str) -> str:
    """The entity id of a key made by :func:`normalise_entity_name` (or :func:`entity_key`)."""
    return f"ent-{short_hash(key, ID_LENGTH)}"


def normalise_predicate(predicate: str) -> str:
    """A fact's predicate for matching: case folded, whitespace collapsed, surrounding punctuation dropped."""
    text = _SPACE.sub(" ", unicodedata.normalize("NFKC", predicate or "").casefold()).strip()
    return text.strip(" .,;:!?\"'“”‘’()[]{}")


def fact_key(subject: str, predicate: str, object: str) -> str:
    parts = (entity_key(subject), normalise_predicate(predicate), entity_key(object))
    if not all(parts):
        raise ValueError(f"a fact needs a subject, a predicate and an object: {(subject, predicate, object)!r}")
    return "\x1f".join(parts)


def fact_id_of_key(key: str) -> str:
    """The Fact node id of a key made by :func:`fact_key`."""
    return f"fact-{short_hash(key, ID_LENGTH)}"


def fact_id(subject: str, predicate: str, object: str) -> str:
    """The Fact node's id: the same fact from two sources (any case, article or legal suffix) is one id."""
    return fact_id_of_key(fact_key(subject, predicate, object))


# -- merge reasons ----------------------------------------------------------------------------


def _suffixes(name: str) -> list[str]:
    """The legal suffixes at the end of a name, as written ("Kestrel GmbH & Co. KG" → ["GmbH", "Co.", "KG"])."""
    tokens = name.split()
    found: list[str] = []
    while len(tokens) > 1:
        bare = _bare(tokens[-1])
        if bare in LEGAL_SUFFIXES:
            found.append(tokens[-1].strip(",;:"))
        elif not (found and bare in ("and", "")):
            break
        tokens = tokens[:-1]
    return found[::-1]


def merge_reasons(surface: str, canonical: str) -> list[str]:
    """Why ``surface`` was folded into ``canonical``: the normalisation steps that make them one.

    First the steps without which they would differ; then, if those alone do not make them
    equal (two steps could each do it), the further steps that change either form, in order.
    Suffixes and titles are named as written: "legal suffix GmbH", "leading title Dr.".
    """
    if surface == canonical:
        return []
    every = frozenset(STEPS)

    def equal_with(steps: set[str]) -> bool:
        return _normalise(surface, every - steps) == _normalise(canonical, every - steps)

    chosen = {step for step in STEPS if not equal_with(set(STEPS) - {step})}
    for step in STEPS:
        if equal_with(chosen):
            break
        if step not in chosen and any(_normalise(form, every - chosen - {step}) != _normalise(form, every - chosen)
                                      for form in (surface, canonical)):
            chosen.add(step)
    reasons: list[str] = []
    for step in (step for step in STEPS if step in chosen):
        if step == TITLE:
            titles = [" ".join(form.split()[:_title_length(form.split())]) for form in (surface, canonical)]
            reasons.extend([f"{TITLE} {title}" for title in dict.fromkeys(titles) if title] or [TITLE])
        elif step == SUFFIX:
            ours, theirs = _suffixes(surface), _suffixes(canonical)
            theirs_bare, ours_bare = Counter(map(_bare, theirs)), Counter(map(_bare, ours))
            different = [s for s in ours if ours_bare[_bare(s)] > theirs_bare[_bare(s)]]
            different += [s for s in theirs if theirs_bare[_bare(s)] > ours_bare[_bare(s)]]
            reasons.extend([f"{SUFFIX} {suffix}" for suffix in dict.fromkeys(different)] or [SUFFIX])
        else:
            reasons.append(step)
    return reasons or ["normalised form"]
