"""Figures that hold on what was not tuned on (DESIGN.md §7, `make bench-generalize`).

Every question of every corpus is run once through the product's engine (`auto` route, the LLM-free reader)
and recorded as a `QuestionRun`: the router's choice and confidence, the auto and hybrid rankings' recall,
and the reader's best reading with its score. The reader's abstention thresholds are then chosen on some
runs and measured on others, without running anything again:

- leave one corpus out: chosen on every other corpus, measured on the held-out one;
- 5-fold within a corpus: chosen on four folds of its questions, measured on the fifth.

The choice (`calibrate`) never looks at the runs it is measured on; `leave_one_corpus_out` hands it only
the other corpora's runs, and a test checks that changing a held-out corpus cannot change its thresholds.
A figure from thresholds chosen on the same questions is an in-sample (dev) figure and is labelled so.

The rule that chooses: among the grid's threshold pairs whose false abstention (answerable questions not
answered) stays within FALSE_ABSTENTION_BUDGET on every training corpus, the one with the best sum of two
means over the training corpora: the share of answers that are right (answering an unanswerable question
counts as wrong), and the abstention rate on unanswerable questions (over the corpora that have them).
Ties go to the higher thresholds: the false-abstention budget is there to be spent on doubtful answers.
Only LiHua-World and the sample corpus have unanswerable questions, so the sample's own questions and its
unanswerable ones train every choice (`always`) and are measured only under thresholds chosen without them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Sequence

from lexgraph.evaluation import metrics as ev
from lexgraph.query.answer import abstain_reason, threshold_kind

FALSE_ABSTENTION_BUDGET = 0.10  # the target is 0.15 on every corpus; the choice keeps a margin below it
GRID = tuple(round(0.05 * i, 2) for i in range(0, 17))  # 0.00 … 0.80 for each threshold
FOLDS = 5
CONFIDENCE_BUCKETS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01))
K = 5


@dataclass(frozen=True)
class Thresholds:
    span_below: float
    sentence_below: float


@dataclass(frozen=True)
class QuestionRun:
    """One question through the engine: everything the calibration and the report need."""

    corpus: str
    qid: str
    qtype: str
    answerable: bool
    route: str
    confidence: float
    reason: str
    recall_auto: float | None  # recall@K of the documents, None without evidence
    recall_hybrid: float | None
    all_found_auto: bool | None
    all_found_hybrid: bool | None
    coverage_auto: bool | None  # gold answer in the context at the corpus's budget
    coverage_hybrid: bool | None
    asked: str  # the answer type the question asks for
    answer_type: str  # what the reading is
    answer: str  # the reading's answer: a span, yes/no, or a sentence ("" when no span of the type stands)
    score: float
    correct: bool | None  # the gold answer (or an alias) is in the answer; None for unanswerable questions

    def abstains(self, thresholds: Thresholds) -> bool:
        if not self.answer and self.kind == "sentence":  # no evidence sentence at all
            return True
        return abstain_reason(self, thresholds.span_below, thresholds.sentence_below) is not None

    @property
    def kind(self) -> str:
        return threshold_kind(self)


def gold_in(question: ev.Question, text: str) -> bool | None:
    """The normalised gold answer or one of its aliases occurs in `text` (None for unanswerable questions)."""
    if question.is_null:
        return None
    return any(ev.answer_covered(gold, [text]) for gold in (question.answer, *question.aliases))


# ---------------------------------------------------------------------------------------------
# figures of a set of runs under thresholds


def answer_figures(runs: Sequence[QuestionRun], thresholds: Thresholds) -> dict:
    """gold in answer (share of answerable questions), false abstention, abstention on unanswerable
    questions, and the share of answers that are right (precision)."""
    return _pooled((r, thresholds) for r in runs)


def retrieval_figures(runs: Sequence[QuestionRun]) -> dict:
    return {
        "questions": len(runs),
        "with_evidence": sum(r.recall_hybrid is not None for r in runs),
        f"hybrid_recall@{K}": ev.mean(r.recall_hybrid for r in runs),
        f"auto_recall@{K}": ev.mean(r.recall_auto for r in runs),
        f"hybrid_all@{K}": ev.mean(r.all_found_hybrid for r in runs),
        f"auto_all@{K}": ev.mean(r.all_found_auto for r in runs),
        "hybrid_coverage": ev.mean(r.coverage_hybrid for r in runs),
        "auto_coverage": ev.mean(r.coverage_auto for r in runs),
        "routes": {route: sum(r.route == route for r in runs) for route in sorted({r.route for r in runs})},
    }


def confidence_buckets(runs: Sequence[QuestionRun], thresholds_of: Callable[[QuestionRun], Thresholds]) -> list[dict]:
    """The router's confidence against what it bought: per bucket, the route mix, auto's and hybrid's
    recall, and the answers' precision (each run under its own thresholds, `thresholds_of`). Confidence
    means something when the figures rise with it."""
    out = []
    for low, high in CONFIDENCE_BUCKETS:
        mine = [r for r in runs if low <= r.confidence < high]
        if not mine:
            continue
        pooled = _pooled((r, thresholds_of(r)) for r in mine)
        out.append({"confidence": f"[{low:.1f}, {min(high, 1.0):.1f}{']' if high > 1 else ')'}",
                    "questions": len(mine),
                    "routes": {route: sum(r.route == route for r in mine) for route in sorted({r.route for r in mine})},
                    f"auto_recall@{K}": ev.mean(r.recall_auto for r in mine),
                    f"hybrid_recall@{K}": ev.mean(r.recall_hybrid for r in mine),
                    "precision": pooled["precision"], "gold_in_answer": pooled["gold_in_answer"]})
    return out


# ---------------------------------------------------------------------------------------------
# choosing the thresholds, and measuring them where they were not chosen


def calibrate(training: dict[str, Sequence[QuestionRun]], budget: float = FALSE_ABSTENTION_BUDGET,
              grid: Sequence[float] = GRID) -> Thresholds:
    """The thresholds chosen on `training` (corpus name → runs); see the module's docstring."""
    if not training:
        raise ValueError("calibration needs at least one training corpus")
    best: tuple | None = None
    for span in grid:
        for sentence in grid:
            chosen = Thresholds(span, sentence)
            figures = [answer_figures(runs, chosen) for runs in training.values() if runs]
            worst = max((f["false_abstention"] or 0.0) for f in figures)
            if worst > budget + 1e-9:
                continue
            precision = sum((f["precision"] or 0.0) for f in figures) / len(figures)
            null = [f["abstention_on_unanswerable"] for f in figures if f["abstention_on_unanswerable"] is not None]
            key = (round(precision + (sum(null) / len(null) if null else 0.0), 9), span + sentence, span)
            if best is None or key > best[0]:
                best = (key, chosen)
    return best[1] if best else Thresholds(0.0, 0.0)


def leave_one_corpus_out(runs: dict[str, Sequence[QuestionRun]],
                         choose: Callable[[dict[str, Sequence[QuestionRun]]], Thresholds] = calibrate,
                         always: dict[str, Sequence[QuestionRun]] | None = None) -> dict:
    """Per corpus: the thresholds chosen on all the others (and on `always`, never measured here), and its
    figures under them."""
    out = {}
    for held in runs:
        thresholds = choose({**{name: r for name, r in runs.items() if name != held}, **(always or {})})
        out[held] = {"thresholds": asdict(thresholds), **answer_figures(runs[held], thresholds)}
    return out


def k_fold(runs: Sequence[QuestionRun], folds: int = FOLDS,
           choose: Callable[[dict[str, Sequence[QuestionRun]]], Thresholds] = calibrate,
           always: dict[str, Sequence[QuestionRun]] | None = None) -> dict:
    """Within one corpus: each fold's answers under thresholds chosen on the other folds (and `always`),
    pooled."""
    decided: list[tuple[QuestionRun, Thresholds]] = []
    chosen = []
    for fold in range(folds):
        train = [r for i, r in enumerate(runs) if i % folds != fold]
        thresholds = choose({"train": train, **(always or {})})
        chosen.append(asdict(thresholds))
        decided += [(r, thresholds) for i, r in enumerate(runs) if i % folds == fold]
    pooled = _pooled(decided)
    return {"thresholds_per_fold": chosen, **pooled}


def _pooled(decided: Iterable[tuple[QuestionRun, Thresholds]]) -> dict:
    decided = list(decided)
    answerable = [(r, t) for r, t in decided if r.answerable]
    null = [(r, t) for r, t in decided if not r.answerable]
    answered = [r for r, t in decided if not r.abstains(t)]
    return {"questions": len(decided), "answerable": len(answerable), "unanswerable": len(null),
            "gold_in_answer": ev.mean(bool(r.correct) and not r.abstains(t) for r, t in answerable),
            "false_abstention": ev.mean(r.abstains(t) for r, t in answerable),
            "abstention_on_unanswerable": ev.mean(r.abstains(t) for r, t in null),
            "precision": ev.mean(bool(r.correct) for r in answered)}


def worst(per_corpus: dict[str, dict], name: str, lower_is_worse: bool = True) -> tuple[str, float] | None:
    values = [(corpus, f[name]) for corpus, f in per_corpus.items() if f.get(name) is not None]
    if not values:
        return None
    return (min if lower_is_worse else max)(values, key=lambda v: v[1])
