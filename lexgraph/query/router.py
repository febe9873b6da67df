"""The question router: semantic, graph or agentic, decided from cheap features and labelled exemplars.

Features a reader would use to tell the routes apart: how long the question is, how many clauses it
splits into, temporal and sequence connectives ("before", "and then"), comparison and aggregation
words, relation words ("connected to", "between"), how many names it holds, and the question word.
Beside them, the question's similarity to the exemplars of each route (the best and the mean of the
five nearest, cosine of the query embeddings). A multinomial logistic regression over both is fitted
on the exemplars when the router is built (a few hundred rows: milliseconds), so new exemplars need
no code change. No LLM is needed; confidence is the winning route's probability.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from lexgraph.query.bm25 import tokenize
from lexgraph.query.retrieval import sub_queries

ROUTES = ("semantic", "graph", "agentic")
SAMPLE = Path(__file__).resolve().parents[2] / "sample"
# The shipped exemplars: written for the sample corpus, plus chat-log style questions written for messaging
# corpora (none taken from a benchmark; LiHua-World's own are added only by the benchmark).
EXEMPLAR_FILES = ("questions.router.json", "questions.router.chat.json", "questions.agentic.json")

_TEMPORAL = re.compile(r"\b(before|after|when|while|once|until|since|earlier|later|first|last)\b", re.I)
_SEQUENCE = re.compile(r"\b(then|and then|next|afterwards|followed|step|finally)\b", re.I)
_COMPARE = re.compile(r"\b(compare|compared|comparison|versus|vs|more|less|fewer|larger|smaller|bigger|older|"
                      r"younger|both|either|neither|difference|differ|same|than|which of|whichever)\b", re.I)
_AGGREGATE = re.compile(r"\b(how many|total|sum|count|all the|every|each|across|combined|altogether|average)\b",
                        re.I)
_RELATION = re.compile(r"\b(connected|connection|related|relationship|relation|link|links|linked|between|"
                       r"associated|involved|partner|owns|owned|supplies|supplied|works? (?:for|with))\b", re.I)
_NAME = re.compile(r"\b[A-Z][\w'’-]+")
_WH = ("who", "what", "when", "where", "which", "why", "how", "did", "does", "is", "was", "are", "were", "can")


@dataclass(frozen=True)
class Exemplar:
    question: str
    route: str


@dataclass(frozen=True)
class RouteDecision:
    route: str
    confidence: float
    reason: str
    probabilities: dict[str, float]


def load_exemplars(paths: Iterable[Path]) -> list[Exemplar]:
    """Exemplars from JSON lists of {question, route}; a missing file is skipped, a bad one raises ValueError
    naming it (a record whose route is not one of ROUTES too: a typo must not silently drop exemplars)."""
    out = []
    for path in paths:
        if not Path(path).exists():
            continue
        try:
            records = json.loads(Path(path).read_text(encoding="utf-8"))
            out += [Exemplar(r["question"], r["route"]) for r in records]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{path}: not a list of {{question, route}} exemplars ({error})") from None
        wrong = sorted({e.route for e in out} - set(ROUTES))
        if wrong:
            raise ValueError(f"{path}: unknown route(s) {', '.join(map(str, wrong))}; expected {', '.join(ROUTES)}")
    return out


def default_exemplars(extra: Iterable[Path] = ()) -> list[Exemplar]:
    """The shipped exemplars, plus a deployment's own labelled questions (LEXGRAPH_ROUTER_EXEMPLARS)."""
    return load_exemplars([*(SAMPLE / name for name in EXEMPLAR_FILES), *extra])


def features(question: str) -> np.ndarray:
    words = tokenize(question, False)
    lowered = question.strip().lower()
    first = lowered.split(" ", 1)[0] if lowered else ""
    names = {m.group() for m in _NAME.finditer(question[1:])}  # the first word is capitalised anyway
    return np.array([
        min(len(question.split()), 60) / 30,
        len(sub_queries(question)) / 2,
        len(_TEMPORAL.findall(question)) / 2,
        len(_SEQUENCE.findall(question)),
        len(_COMPARE.findall(question)) / 2,
        len(_AGGREGATE.findall(question)),
        len(_RELATION.findall(question)),
        min(len(names), 8) / 4,
        question.count(",") / 2,
        question.count("?") - 1 if question.count("?") > 1 else 0,
        len(words) / 20,
        *[float(first == w) for w in _WH],
    ], dtype=np.float64)


class Router:
    """Fitted on exemplars at construction; `route(question, vector)` needs the question's embedding."""

    def __init__(self, exemplars: Sequence[Exemplar], embed_many: Callable[[list[str]], np.ndarray],
                 neighbours: int = 5, l2: float = 0.3, steps: int = 400):
        present = sorted({e.route for e in exemplars}, key=ROUTES.index)
        if len(present) < 2:
            raise ValueError(f"the router needs exemplars of at least two routes, got {present or 'none'}")
        self.routes, self.neighbours = present, neighbours
        self.vectors = np.asarray(embed_many([e.question for e in exemplars]), dtype=np.float64)
        self.labels = np.array([present.index(e.route) for e in exemplars])
        rows = np.stack([self._row(e.question, v, exclude=i) for i, (e, v) in enumerate(zip(exemplars, self.vectors))])
        self.mean, self.scale = rows.mean(axis=0), rows.std(axis=0) + 1e-6
        self.weights = _fit_softmax((rows - self.mean) / self.scale, self.labels, len(present), l2, steps)

    def _similarities(self, vector: np.ndarray, exclude: int | None = None) -> list[float]:
        cosine = self.vectors @ vector
        out = []
        for label in range(len(self.routes)):
            mine = cosine[(self.labels == label) & (np.arange(len(cosine)) != (-1 if exclude is None else exclude))]
            top = np.sort(mine)[-self.neighbours:] if len(mine) else np.zeros(1)
            out += [float(top.max()), float(top.mean())]
        return out

    def _row(self, question: str, vector: np.ndarray, exclude: int | None = None) -> np.ndarray:
        # Leave-one-out similarities while fitting: an exemplar's nearest neighbour is not itself.
        return np.concatenate([features(question), self._similarities(vector, exclude), [1.0]])

    def route(self, question: str, vector: np.ndarray) -> RouteDecision:
        row = (self._row(question, np.asarray(vector, dtype=np.float64)) - self.mean) / self.scale
        row[-1] = 1.0  # the bias column is not standardised
        probabilities = _softmax(row @ self.weights)
        best = int(np.argmax(probabilities))
        named = {route: round(float(p), 3) for route, p in zip(self.routes, probabilities)}
        return RouteDecision(self.routes[best], float(probabilities[best]), _reason(question, self.routes[best]), named)


def _reason(question: str, route: str) -> str:
    cues = []
    if len(sub_queries(question)) > 1:
        cues.append(f"{len(sub_queries(question))} clauses")
    for label, pattern in (("temporal", _TEMPORAL), ("sequence", _SEQUENCE), ("comparison", _COMPARE),
                           ("aggregation", _AGGREGATE), ("relation", _RELATION)):
        found = pattern.findall(question)
        if found:
            cues.append(f"{label} words ({', '.join(dict.fromkeys(f.lower() for f in found))})")
    return f"{route}: " + ("; ".join(cues) if cues else "closest to the exemplars of this route")


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _fit_softmax(x: np.ndarray, y: np.ndarray, classes: int, l2: float, steps: int) -> np.ndarray:
    """Multinomial logistic regression by gradient descent (convex: a fixed step count converges here)."""
    x = x.copy()
    x[:, -1] = 1.0
    onehot = np.eye(classes)[y]
    weights = np.zeros((x.shape[1], classes))
    # class weights: a route with few exemplars still counts as much as a common one
    balance = (len(y) / (classes * np.maximum(np.bincount(y, minlength=classes), 1)))[y][:, None]
    for _ in range(steps):
        gradient = x.T @ (balance * (_softmax(x @ weights) - onehot)) / len(y) + l2 * weights / len(y)
        weights -= 0.5 * gradient
    return weights


# ---------------------------------------------------------------------------------------------
# The structural router (the default): it decomposes a question only when its grammar says it holds more
# than one question, and otherwise sends it to the route that ranks like the hybrid ranking, so that no
# wording it has not seen can send a question where it loses evidence.

STRUCTURE_CONFIDENT = 0.5  # below: the cue is weak and the question takes the safe route (logged)


@dataclass(frozen=True)
class Structure:
    cue: str  # what was found, for the log
    confidence: float


def question_structure(question: str, parse) -> Structure | None:
    """The explicit structure that makes a question several questions, from its spaCy parse:
    - two questions: two question marks, or a second question word opening a clause after "and" / ";";
    - order in time: "before" / "after" / "until" / "while" introducing a clause (a subordinating mark,
      not a preposition: "before he told her", not "before the meeting");
    - a comparison: a comparative with "than" or between alternatives joined by "or", "compare", "versus",
      "both … and", "the same … as" / "in the same".
    None when there is none."""
    text = " ".join(question.split())
    if text.count("?") >= 2:
        return Structure("two questions (two question marks)", 0.9)
    doc = parse(text)
    lowered = [t.lower_ for t in doc]
    for i, token in enumerate(doc):
        if token.lower_ in ("and", ";") and i + 1 < len(doc) and doc[i + 1].tag_ in ("WP", "WRB", "WDT", "WP$") \
                and i > 3 and (doc[i + 1].dep_ != "det" or _clause_verb(doc[i + 1]).dep_ == "conj"):
            # "which yard built …" after "and" asks a second question when its verb is a conjoined clause's
            # ("Who chairs Kestrel, and which yard built the hull?"), not in "which yard and which maker worked"
            return Structure(f"two questions joined by '{token.text} {doc[i + 1].text}'", 0.8)
    marks = [t for t in doc if t.lower_ in ("before", "after", "until", "while") and t.dep_ == "mark"]
    if marks:
        return Structure(f"order in time ('{marks[0].text}' opens a clause)", 0.8)
    if any(w in ("compare", "compared", "comparing", "versus", "vs", "vs.") for w in lowered):
        return Structure("a comparison ('compare' / 'versus')", 0.8)
    comparatives = [t for t in doc if t.tag_ in ("JJR", "RBR")]
    if comparatives and ("than" in lowered or "or" in lowered):
        return Structure(f"a comparison ('{comparatives[0].text}' {'than' if 'than' in lowered else 'or'})", 0.7)
    if "both" in lowered and "and" in lowered[lowered.index("both"):] or \
            ("both" in lowered and "and" in lowered and doc[0].lower_ in ("are", "were", "is", "was", "do", "did")):
        return Structure("a comparison ('both … and')", 0.6)
    if "same" in lowered and ("as" in lowered[lowered.index("same"):] or "and" in lowered):
        return Structure("a comparison ('the same')", 0.6)
    superlatives = [t for t in doc if t.tag_ in ("JJS", "RBS")]
    if superlatives and " or " in f" {text.lower()} ":
        return Structure(f"a choice between alternatives ('{superlatives[0].text}' … or)", 0.6)
    if doc[0].lower_ in ("which", "who") and " or " in f" {text.lower()} " and comparatives:
        return Structure("a choice between alternatives", 0.6)
    return None


def _clause_verb(token):
    """The verb of the clause a token stands in (its nearest verb or auxiliary head)."""
    while token.pos_ not in ("VERB", "AUX") and token.head.i != token.i:
        token = token.head
    return token


class StructuralRouter:
    """semantic (the hybrid ranking) by default; agentic only on explicit structure (question_structure),
    with that as the logged reason. The engine may take semantic on the graph route where the index's graph
    is selective (QueryEngine.decide). Confidence: the structure's strength for agentic; for semantic, one
    minus the strongest weak cue (a cue below STRUCTURE_CONFIDENT falls back to semantic, said in the reason)."""

    routes = list(ROUTES)

    def __init__(self, parse=None):
        if parse is None:
            from lexgraph.extract.nlp import load

            nlp = load(("ner", "lemmatizer"))
            parse = nlp
        self.parse = parse

    def route(self, question: str, vector=None) -> RouteDecision:
        found = question_structure(question, self.parse)
        if found is not None and found.confidence >= STRUCTURE_CONFIDENT:
            probabilities = {"semantic": round(1 - found.confidence, 3), "graph": 0.0,
                             "agentic": round(found.confidence, 3)}
            return RouteDecision("agentic", found.confidence, f"agentic: {found.cue}", probabilities)
        if found is not None:
            return RouteDecision("semantic", 1 - found.confidence, f"semantic: low confidence in {found.cue} "
                                 f"({found.confidence:.2f} < {STRUCTURE_CONFIDENT}): the safe route",
                                 {"semantic": round(1 - found.confidence, 3), "graph": 0.0,
                                  "agentic": round(found.confidence, 3)})
        return RouteDecision("semantic", 0.9, "semantic: one question (no explicit structure to decompose)",
                             {"semantic": 0.9, "graph": 0.0, "agentic": 0.1})


def default_router(extra_exemplars: Iterable[Path] = (), embed_many: Callable[[list[str]], np.ndarray] | None = None):
    """The structural router; a deployment that labels its own questions (LEXGRAPH_ROUTER_EXEMPLARS) gets the
    exemplar router fitted on them and the shipped exemplars instead (measure it on questions it did not see)."""
    extra = [Path(p) for p in extra_exemplars or ()]
    if extra and embed_many is not None:
        return Router(default_exemplars(extra), embed_many)
    return StructuralRouter()
