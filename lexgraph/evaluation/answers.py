"""The bench's `auto` (the router's retrieval) and `answer` (the extractive answerer) methods.

`auto` is scored like every retrieval method (recall@k, all-found, coverage at the budget) on the
chunks the routed retrieval ranks. `answer` adds what only an answer has:
- answer coverage: the normalised gold answer occurs in the answer or in its cited spans;
- citation precision: the share of cited sources that are evidence documents of the question;
- abstention: the rate on Null questions (should abstain) against the rate on answerable ones (false
  abstentions).
"""
from __future__ import annotations

from typing import Sequence

from lexgraph.evaluation import metrics as ev
from lexgraph.ids import document_key
from lexgraph.query.retrieval import Retriever
from lexgraph.query.retrieval_types import Hit

ROUTE_METHODS = ("semantic", "graph", "agentic")  # the engine forced onto one route
ENGINE_METHODS = ("auto", "answer", *ROUTE_METHODS)


def build_engine(retriever: Retriever, budget: int):
    """The product's engine on this index: the default router and the extractive reader."""
    from lexgraph.query.answer import ExtractiveAnswerer
    from lexgraph.query.engine import QueryEngine, QueryParams
    from lexgraph.query.router import default_router

    router = default_router(retriever.index.settings.router_exemplars if retriever.index.settings else (),
                            retriever.embed_batch or (lambda qs: [retriever.embed(q) for q in qs]))
    answerer, params = ExtractiveAnswerer(retriever.index.bm25), QueryParams(budget=budget)
    index = retriever.index
    if index.graph_missing:  # as the service does: the graph routes say they fell back
        from lexgraph.query.scale_engine import ScaleQueryEngine

        settings = index.settings
        return ScaleQueryEngine(retriever, router, answerer, params, chunks=index.size,
                                threshold=settings.lance_threshold if settings else 0, why=index.graph_missing)
    return QueryEngine(retriever, router, answerer, params)


class EngineSearcher:
    """`search(method, query, top_n)` for every bench method: the engine's for auto/answer (the last
    answer is kept for `answer_figures`), the retriever's for the channels."""

    def __init__(self, retriever: Retriever, engine=None):
        self.retriever, self.engine = retriever, engine
        self.last: dict | None = None

    def search(self, method: str, query: str, top_n: int) -> list[Hit]:
        if method not in ENGINE_METHODS:
            self.last = None
            return self.retriever.search(method, query, top_n)
        if method in ("auto", *ROUTE_METHODS):
            retrieval, answer = self.engine.retrieve(query, method), None
        else:
            retrieval, answer = self.engine.answer(query, "auto")
        self.last = {"route": retrieval.route, "retried": bool(retrieval.retries), "answer": answer}
        return self.retriever.hits(retrieval.scores, top_n)


def answer_figures(question: ev.Question, answer) -> dict:
    cited = [document_key(c.source) for c in answer.citations]
    evidence = set(question.evidence)
    texts = [answer.text, *[c.text for c in answer.citations]]
    return {"abstained": answer.abstained, "confidence": round(answer.confidence, 4),
            "covered": None if question.is_null or answer.abstained else ev.answer_covered(question.answer, texts),
            "citation_precision": (sum(c in evidence for c in cited) / len(cited)) if cited and evidence else None}


def summarise_answers(rows: Sequence[tuple[bool, dict]]) -> dict:
    """rows: (is the question Null?, answer_figures) per question."""
    answerable = [f for is_null, f in rows if not is_null]
    null = [f for is_null, f in rows if is_null]
    return {"answer_coverage": ev.mean((f["covered"] or False) for f in answerable),
            "citation_precision": ev.mean(f["citation_precision"] for f in answerable),
            "abstention_on_null": ev.mean(f["abstained"] for f in null),
            "false_abstention": ev.mean(f["abstained"] for f in answerable),
            "answerable": len(answerable), "null": len(null)}
