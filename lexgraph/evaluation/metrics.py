"""Questions and retrieval metrics for the benchmark: evidence recall, answer coverage, latency.

Why a module of its own: the metrics decide what every figure in docs/BENCHMARKS.md means, so
they are small pure functions with hand-made tests, independent of how hits are retrieved.

Two question formats are read (DESIGN.md §7):
- LiHua-World's JSON object ``{"0": {question, answer, evidence, type}, ...}``, evidence being
  document names joined by ``<and>`` (``"20260121_10:00<and>20260701_10:00"``; the files are
  ``20260121_1000.txt``, so ids are normalised before they are compared with file names);
- a JSON list of ``{id, question, answer}`` records (evidence and type optional).
"""
from __future__ import annotations

import json
import re
import string
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import numpy as np

from lexgraph.errors import FileProblem
from lexgraph.ids import normalise_evidence_id

NULL_ANSWER = "insufficient information"
EVIDENCE_SEPARATOR = "<and>"
# Evidence values that mean "no evidence" (LiHua-World writes N/A for its Null questions).
_NO_EVIDENCE = {"", "n/a", "na", "none", "null", "-"}
# Some LiHua-World records carry their field name inside the value ("Answer: Yes").
_LABEL = re.compile(r"^\s*(question|answer)\s*:\s*", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
QUESTION_TYPES = ("Single", "Multi", "Null")


class QuestionsFileError(FileProblem, ValueError):
    """A questions file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    answer: str
    evidence: tuple[str, ...]  # normalised document keys (see lexgraph.ids.normalise_evidence_id)
    qtype: str  # Single | Multi | Null | Other
    aliases: tuple[str, ...] = ()  # other accepted forms of the answer (MuSiQue's answer_aliases)

    @property
    def is_null(self) -> bool:
        return self.qtype == "Null" or normalise_answer(self.answer) == NULL_ANSWER


# ---------------------------------------------------------------------------------------------
# normalisation


def normalise_answer(text: str) -> str:
    """Lowercase, punctuation deleted, the articles a/an/the removed, whitespace collapsed (SQuAD
    style, as KET-RAG's coverage uses it), so "The EUR 19.1 million." matches "eur 191 million"."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(c for c in text if not _is_punctuation(c))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _is_punctuation(character: str) -> bool:
    return character in string.punctuation or unicodedata.category(character).startswith("P")


def split_evidence(value: object) -> tuple[str, ...]:
    """Evidence as normalised keys: a "<and>"-joined string or a list; "N/A" and "" mean none."""
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).split(EVIDENCE_SEPARATOR)
    raw = [str(item).strip() for item in items]
    keys = [normalise_evidence_id(item) for item in raw if item.lower() not in _NO_EVIDENCE]
    return tuple(dict.fromkeys(k for k in keys if k))


# ---------------------------------------------------------------------------------------------
# loading


def _strip_label(text: str) -> str:
    return _LABEL.sub("", text, count=1).strip()


def _infer_type(answer: str, evidence: tuple[str, ...]) -> str:
    if normalise_answer(answer) == NULL_ANSWER:
        return "Null"
    return {0: "Other", 1: "Single"}.get(len(evidence), "Multi")


def _record(path: Path, qid: str, record: object) -> Question:
    if not isinstance(record, dict):
        raise QuestionsFileError(path, f"question {qid!r} is a {type(record).__name__}, expected an object")
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise QuestionsFileError(path, f"question {qid!r} has no 'question' text")
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise QuestionsFileError(path, f"question {qid!r} has no 'answer' string")
    evidence = record.get("evidence")
    if evidence is not None and not isinstance(evidence, (str, list)):
        raise QuestionsFileError(path, f"question {qid!r}: 'evidence' must be a string or a list of strings")
    keys = split_evidence(evidence)
    answer = _strip_label(str(answer))
    qtype = record.get("type")
    if qtype is not None and (not isinstance(qtype, str) or not qtype.strip()):
        raise QuestionsFileError(path, f"question {qid!r}: 'type' must be a non-empty string")
    qtype = qtype.strip().capitalize() if qtype else _infer_type(answer, keys)
    aliases = record.get("answer_aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, (str, int, float)) for a in aliases):
        raise QuestionsFileError(path, f"question {qid!r}: 'answer_aliases' must be a list of strings")
    return Question(qid, _strip_label(question), answer, keys, qtype, tuple(str(a) for a in aliases))


def load_questions(path: str | Path) -> list[Question]:
    """Read either question format; QuestionsFileError (a ValueError) names the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise QuestionsFileError(path, "questions file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as error:
        raise QuestionsFileError(path, f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise QuestionsFileError(path, f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    if isinstance(data, dict):
        items = [(str(qid), record) for qid, record in data.items()]
    elif isinstance(data, list):
        items = []
        for position, record in enumerate(data):
            qid = record.get("id", position) if isinstance(record, dict) else position
            items.append((str(qid), record))
    else:
        raise QuestionsFileError(path, f"top level is a JSON {type(data).__name__}; expected an object of "
                                       "{question, answer, evidence, type} records or a list of {id, question, answer}")
    if not items:
        raise QuestionsFileError(path, "contains no questions")
    ids = [qid for qid, _ in items]
    duplicates = sorted({qid for qid in ids if ids.count(qid) > 1})
    if duplicates:
        raise QuestionsFileError(path, f"duplicate question ids: {', '.join(duplicates[:5])}")
    return [_record(path, qid, record) for qid, record in items]


# ---------------------------------------------------------------------------------------------
# metrics


class RankedHit(Protocol):
    doc_key: str
    text: str
    token_count: int


def ranked_documents(doc_keys: Iterable[str], k: int | None = None) -> list[str]:
    """The first k distinct documents in rank order (a document counts once, at its best chunk)."""
    seen: list[str] = []
    for key in doc_keys:
        if key not in seen:
            seen.append(key)
            if k is not None and len(seen) >= k:
                break
    return seen


def evidence_recall(doc_keys: Sequence[str], evidence: Sequence[str], k: int) -> float | None:
    """Share of the evidence documents among the top-k distinct documents; None without evidence."""
    if not evidence:
        return None
    top = set(ranked_documents(doc_keys, k))
    return sum(1 for e in set(evidence) if e in top) / len(set(evidence))


def all_evidence_found(doc_keys: Sequence[str], evidence: Sequence[str], k: int) -> bool | None:
    recall = evidence_recall(doc_keys, evidence, k)
    return None if recall is None else recall == 1.0


def context_within_budget(hits: Sequence[RankedHit], budget: int) -> list[RankedHit]:
    """Hits in rank order while their word pieces (chunk token_count) fit in the budget.

    The first hit that would overflow ends the context: a context builder does not reorder
    evidence to fill the last tokens, so neither does the metric.
    """
    taken, used = [], 0
    for hit in hits:
        if used + hit.token_count > budget:
            break
        taken.append(hit)
        used += hit.token_count
    return taken


def answer_covered(answer: str, texts: Iterable[str]) -> bool | None:
    """The normalised gold answer occurs, on token boundaries, in the normalised joined context.
    None when the answer normalises to nothing (it cannot be looked for)."""
    gold = normalise_answer(answer)
    if not gold:
        return None
    context = normalise_answer(" ".join(texts))
    return f" {gold} " in f" {context} "


def coverage_at_budget(answer: str, hits: Sequence[RankedHit], budget: int) -> bool | None:
    return answer_covered(answer, (h.text for h in context_within_budget(hits, budget)))


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def mean(values: Iterable[float | bool | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None
