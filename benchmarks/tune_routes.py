"""Tune the graph route's rank-fusion weights on LiHua-World dev and MuSiQue dev together.

Each channel's scores are computed once per question; every weight combination is then plain rank
fusion over them. A combination is judged by its worst ratio to the best single channel across the
two sets (LiHua: recall@5 over Single and Multi questions; MuSiQue: answer coverage at 12,000 tokens),
so a weight that wins on one corpus and loses on the other is not chosen.

    python -m benchmarks.tune_routes --lihua HOME --musique HOME [--shared ../shared]
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from lexgraph.evaluation import metrics as ev
from lexgraph.index import LexIndex
from lexgraph.query.retrieval import reciprocal_rank_fusion
from lexgraph.settings import Settings

CHANNELS = ("hybrid", "keyword", "statement", "entity")
GRID = {"hybrid": (1.0, 2.0, 3.0, 4.0), "keyword": (0.0, 0.5, 1.0), "statement": (0.0, 0.5, 1.0),
        "entity": (0.0, 0.5, 1.0)}


def channel_scores(home: Path, questions_path: Path):
    retriever = LexIndex(Settings.from_env(home=home)).retriever()
    questions = [q for q in ev.load_questions(questions_path) if not q.is_null]
    scores = [{c: retriever.scores(c, q.question) for c in CHANNELS} for q in questions]
    return retriever, questions, scores


def figure(retriever, questions, fused_list, metric: str, budget: int) -> float:
    values = []
    for question, fused in zip(questions, fused_list):
        hits = retriever.hits(fused, 60 if metric == "recall" else max(60, budget // 32))
        if metric == "recall":
            values.append(ev.evidence_recall([h.doc_key for h in hits], question.evidence, 5))
        else:
            values.append(ev.coverage_at_budget(question.answer, hits, budget))
    return float(ev.mean(values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lihua", required=True)
    parser.add_argument("--musique", required=True)
    parser.add_argument("--shared", default="../shared")
    args = parser.parse_args(argv)
    shared = Path(args.shared) / "datasets"
    sets = {"lihua": (channel_scores(Path(args.lihua), shared / "lihua-world" / "questions.dev.json"), "recall", 1024),
            "musique": (channel_scores(Path(args.musique), shared / "musique" / "questions.dev.json"), "coverage",
                        12000)}
    single = {}
    for name, ((retriever, questions, scores), metric, budget) in sets.items():
        single[name] = {c: figure(retriever, questions, [s[c] for s in scores], metric, budget) for c in CHANNELS}
        print(name, metric, {c: round(v, 3) for c, v in single[name].items()}, flush=True)
    results = []
    for combo in itertools.product(*(GRID[c] for c in CHANNELS)):
        weights = dict(zip(CHANNELS, combo))
        row = {}
        for name, ((retriever, questions, scores), metric, budget) in sets.items():
            fused = [reciprocal_rank_fusion([(s[c], w) for c, w in weights.items() if w], retriever.index.size,
                                            60.0, 50) for s in scores]
            row[name] = figure(retriever, questions, fused, metric, budget)
        worst = min(row[name] / max(single[name].values()) for name in row)
        results.append((worst, weights, row))
    results.sort(key=lambda r: -r[0])
    for worst, weights, row in results[:10]:
        print(f"worst ratio {worst:.3f}  {weights}  " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
