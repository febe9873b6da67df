"""Each question of a corpus once through the product's engine, recorded for lexgraph.evaluation.generalize.

The engine is the one `lexgraph ask` uses (the default router, the LLM-free reader) on an in-memory index;
the hybrid ranking is scored beside it on the same index, so `auto` is compared with the ranking it must
never fall below. The reader's answer is recorded before any threshold is applied.
"""
from __future__ import annotations

import sys
from typing import Sequence

from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.bench import single_threaded_torch, top_n_for
from lexgraph.evaluation.generalize import K, QuestionRun, gold_in
from lexgraph.query.retrieval import Retriever, load_index
from lexgraph.query.retrieval_types import RetrievalParams
from lexgraph.settings import Settings


def run_questions(corpus: str, settings: Settings, questions: Sequence[ev.Question], budget: int,
                  progress: bool = False) -> list[QuestionRun]:
    from lexgraph.evaluation.answers import build_engine
    from lexgraph.extract.embedder import Embedder

    params = RetrievalParams()
    index = load_index(settings, params)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    retriever = Retriever(index, embedder.embed_query, params, embedder.embed_queries)
    engine = build_engine(retriever, budget)
    out = []
    with single_threaded_torch():
        for number, question in enumerate(questions, 1):
            out.append(run_one(corpus, engine, question, budget))
            if progress and number % 50 == 0:
                print(f"  {corpus}: {number}/{len(questions)} questions", file=sys.stderr, flush=True)
    return out


def run_one(corpus: str, engine, question: ev.Question, budget: int) -> QuestionRun:
    retriever = engine.retriever
    retrieval = engine.retrieve(question.question, "auto")
    auto_hits = retriever.hits(retrieval.scores, top_n_for((K,), budget))
    hybrid_hits = retriever.hits(retriever.scores("hybrid", question.question), top_n_for((K,), budget))
    reading = engine.answerer.read(question.question, retrieval.context) if retrieval.context.items else None
    decision = retrieval.decision
    auto_keys, hybrid_keys = [h.doc_key for h in auto_hits], [h.doc_key for h in hybrid_hits]
    answer = reading.answer if reading is not None else ""
    return QuestionRun(
        corpus=corpus, qid=question.qid, qtype=question.qtype, answerable=not question.is_null,
        route=retrieval.route, confidence=float(decision.confidence) if decision else 1.0,
        reason=decision.reason if decision else "",
        recall_auto=ev.evidence_recall(auto_keys, question.evidence, K),
        recall_hybrid=ev.evidence_recall(hybrid_keys, question.evidence, K),
        all_found_auto=ev.all_evidence_found(auto_keys, question.evidence, K),
        all_found_hybrid=ev.all_evidence_found(hybrid_keys, question.evidence, K),
        coverage_auto=None if question.is_null else ev.coverage_at_budget(question.answer, auto_hits, budget),
        coverage_hybrid=None if question.is_null else ev.coverage_at_budget(question.answer, hybrid_hits, budget),
        asked=reading.asked if reading is not None else "sentence",
        answer_type=reading.answer_type if reading is not None else "sentence",
        answer=answer, score=float(reading.score) if reading is not None else 0.0,
        correct=gold_in(question, answer) if answer else (None if question.is_null else False))
