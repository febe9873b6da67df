"""Question → route → evidence → answer, in memory, with the router's recovery rules (DESIGN §5).

Routes:
- semantic: the hybrid ranking (dense + BM25 + keyword fused);
- graph: rank fusion of the statement, entity and path channels with the hybrid ranking, weighted by how
  selective the index's graph is (see QueryParams), each channel given its θ share of the context;
- agentic: the question split into steps (by the LLM when one is configured, else at its clauses),
  each step retrieved like the graph route, the rankings merged by rank fusion.

Recovery:
- too little evidence on the semantic route (its best sentence covers less of the question than the
  answerer's abstention threshold) → the graph route, logged as a retry;
- graph expansion over budget (the traversal reached its node limit) → cut to 2 hops, and the answer
  is marked uncertain;
- an agentic step failing 3 times → the question goes to the human-review queue (the caller persists
  it) and the answer abstains;
- no evidence → abstain.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from lexgraph.query.answer import Answer, QuestionTerms, abstention, best_sentence
from lexgraph.query.context import Context, build_context
from lexgraph.query.fusion import ranks_of, reciprocal_rank_fusion
from lexgraph.query.graph_channels import scores_of_statements, traverse_statements
from lexgraph.query.retrieval import METHODS, Retriever, sub_queries, with_params
from lexgraph.query.router import ROUTES, RouteDecision, Router

ROUTE_CHOICES = ("auto", *ROUTES)
STEP_ATTEMPTS = 3


@dataclass(frozen=True)
class QueryParams:
    budget: int = 2048  # context tokens handed to the answerer
    # The graph route's rank-fusion weights lie between two ends, by how selective the index's graph is: the
    # share of chunk pairs that share a fact or entity (graph_channels.bridge_pair_share). On a hub graph (every
    # chat names its speaker: LiHua-World 0.48) traversal reaches everything and the graph channels add no
    # selective evidence, so the hybrid ranking leads; on a selective one (Wikipedia, MuSiQue 0.07) statements
    # lead. No fixed weighting matched hybrid on LiHua and statement on MuSiQue (best worst-case ratio 0.958,
    # docs/decisions/graph-route.md); the ends were measured on both dev sets together.
    graph_channels_hub: tuple[tuple[str, float], ...] = (("hybrid", 1.0),)
    graph_channels_selective: tuple[tuple[str, float], ...] = (("statement", 2.0), ("entity", 0.5), ("path", 0.5),
                                                               ("hybrid", 0.5))
    hub_pair_share: float = 0.4  # at or above: the hub end
    selective_pair_share: float = 0.1  # at or below: the selective end; linear in between
    # θ shares of the context at the selective end (scaled down with the graph's selectivity)
    graph_shares: tuple[tuple[str, float], ...] = (("statement", 0.15), ("entity", 0.1), ("path", 0.1))
    rrf_k: float = 60.0
    fusion_depth: int = 200
    max_question_chars: int = 4000  # longer questions are refused (the embedder windows anyway)
    graph_hops: int = 3  # statement traversal depth on the graph route; cut to 2 when over budget
    # The graph route's fusion holds the hybrid ranking, so on a hub graph (selectivity 0) it ranks exactly as the
    # semantic route, and on a selective one it adds the graph's evidence: there the router's semantic choice is
    # taken on the graph route (MuSiQue dev, selectivity 1: the 93 questions routed semantic cover 0.624 on the
    # semantic route, 0.828 on the graph route; LiHua-World, selectivity 0: nothing changes). 1.01: never.
    semantic_to_graph_at: float = 0.5
    # the agentic route: the whole question's ranking weighs this much, its steps 1 together (each 1 / steps).
    # Equal weights let two clause rankings outvote the whole question, whose own hybrid ranking already fuses
    # the clauses (LiHua-World dev Multi recall@5 0.705 → 0.780 on the questions routed agentic)
    agentic_whole_weight: float = 2.0
    # The graph and agentic routes keep the hybrid ranking's chunks up to its 5th distinct document first (the
    # top five documents are what a reader sees first and what recall@5 counts); 0 turns the lead off. Not
    # tuned: it is the cut of the fail-safe target (auto never below hybrid at recall@5), docs/BENCHMARKS.md.
    hybrid_lead_documents: int = 5
    # the semantic route's evidence is thin (retried on the graph route) when its best sentence scores below
    # this. 0.40 was the extractive answerer's threshold, chosen on LiHua-World dev's Null questions (a dev
    # figure); with the hybrid lead the retry changes only the evidence after the first five documents
    thin_below: float = 0.40


class StepFailed(RuntimeError):
    """An agentic step failed STEP_ATTEMPTS times: the question needs a person."""


@dataclass
class Retrieval:
    route: str
    decision: RouteDecision | None
    scores: np.ndarray
    context: Context
    retries: list[dict] = field(default_factory=list)
    uncertain: bool = False
    steps: list[str] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    review: str | None = None  # why the question went to the human-review queue
    weights: dict[str, float] = field(default_factory=dict)  # the graph route's fusion weights, for the log


class QueryEngine:
    """One loaded index; thread-safe for concurrent questions (every call only reads the index)."""

    def __init__(self, retriever: Retriever, router: Router | None, answerer, params: QueryParams | None = None,
                 decompose: Callable[[str], list[str]] | None = None):
        self.router, self.answerer = router, answerer
        self.catalog: dict[str, str] = {}  # doc_id -> content hash of the index it was loaded from
        self.params = params or QueryParams()
        # every channel of one question embeds it: once is enough
        embed = functools.lru_cache(maxsize=256)(retriever.embed)
        self.retriever = Retriever(retriever.index, embed, retriever.params, retriever.embed_batch)
        # the graph route's statement traversal, and the same cut to 2 hops when it overruns its budget
        self._deep = with_params(self.retriever, statement_hops=self.params.graph_hops)
        self._cut = with_params(self.retriever, statement_hops=min(2, self.params.graph_hops))
        self.decompose = decompose or clause_steps
        self.available = [m for m in METHODS if m not in ("dense", "bm25")]
        graph = self.retriever.index.graph
        self.graph_selectivity = graph_selectivity(graph.bridge_pair_share if graph is not None else 1.0, self.params)
        self.graph_weights = graph_weights(self.graph_selectivity, self.params, self.available)

    # -- routing ----------------------------------------------------------------------------------------

    def decide(self, question: str, route: str = "auto") -> tuple[str, RouteDecision | None]:
        if route not in ROUTE_CHOICES:
            raise ValueError(f"unknown route {route!r}; expected one of {', '.join(ROUTE_CHOICES)}")
        if route != "auto":
            return route, None
        if self.router is None:
            return "semantic", None
        decision = self.router.route(question, self.retriever.embed(question))
        if decision.route == "semantic" and self.graph_selectivity >= self.params.semantic_to_graph_at:
            decision = replace(decision, route="graph", reason=f"{decision.reason} (taken on the graph route: the "
                               f"index's graph is selective, {self.graph_selectivity:.2f})")
        return decision.route, decision

    def retrieve(self, question: str, route: str = "auto") -> Retrieval:
        started = time.perf_counter()
        chosen, decision = self.decide(question, route)
        latency = {"route": _ms(started)}
        result = self._run(question, chosen, decision, latency)
        if chosen == "semantic" and self._thin(question, result.context):
            retry = self._run(question, "graph", decision, latency)
            retry.retries = [{"from": "semantic", "to": "graph", "reason": "too little evidence on the semantic "
                              "route (best sentence below the evidence threshold)"}]
            result = retry
        latency["total"] = _ms(started)
        return result

    def _run(self, question: str, route: str, decision: RouteDecision | None, latency: dict) -> Retrieval:
        started = time.perf_counter()
        if route == "semantic":
            scores = self.retriever.scores("hybrid", question)
            result = Retrieval(route, decision, scores, self._context(scores))
        elif route == "graph":
            result = self._graph(question, decision)
        else:
            result = self._agentic(question, decision)
        latency[route] = _ms(started)
        result.latency_ms = latency
        return result

    def _graph(self, question: str, decision: RouteDecision | None) -> Retrieval:
        fused, channels, uncertain = self._graph_ranking(question)
        fused = self._led_by_hybrid(question, fused, channels.get("hybrid"))
        shares = {n: share * self.graph_selectivity for n, share in self.params.graph_shares if n in channels}
        context = self._context(fused, channels, shares)
        return Retrieval("graph", decision, fused, context, uncertain=uncertain, weights=self.graph_weights)

    def _graph_ranking(self, question: str) -> tuple[np.ndarray, dict[str, np.ndarray], bool]:
        """The graph route's fused ranking, its channels' own rankings, and whether the expansion was cut."""
        weights = self.graph_weights
        channels = {name: self.retriever.scores(name, question) for name in weights if name != "statement"}
        uncertain = False
        if "statement" in weights:
            channels["statement"], uncertain = self._statement_channel(question)
        fused = reciprocal_rank_fusion([(channels[name], weight) for name, weight in weights.items()],
                                       self.retriever.index.size, self.params.rrf_k, self.params.fusion_depth)
        return fused, channels, uncertain

    def _agentic(self, question: str, decision: RouteDecision | None) -> Retrieval:
        # each step is retrieved like the graph route (on a hub graph that is the hybrid ranking alone)
        steps = self._step("decompose the question", lambda: self.decompose(question)) or [question]
        whole, channels, uncertain = self._graph_ranking(question)
        rankings = [(whole, self.params.agentic_whole_weight)]
        for step in steps:
            ranked = self._step(step, lambda: self._graph_ranking(step))
            rankings.append((ranked[0], 1.0 / len(steps)))
            uncertain |= ranked[2]
        fused = reciprocal_rank_fusion(rankings, self.retriever.index.size, self.params.rrf_k,
                                       self.params.fusion_depth)
        fused = self._led_by_hybrid(question, fused, channels.get("hybrid"))
        return Retrieval("agentic", decision, fused, self._context(fused), steps=steps, uncertain=uncertain,
                         weights=self.graph_weights)

    def _led_by_hybrid(self, question: str, fused: np.ndarray, hybrid: np.ndarray | None = None) -> np.ndarray:
        """The fail-safe: the graph and agentic routes add evidence to the hybrid ranking, never displace its
        lead. The hybrid's chunks up to its `hybrid_lead_documents`-th distinct document come first, in its
        order; the route's own ranking follows. So no route ranks the first documents worse than the semantic
        route on any corpus, whatever the graph is like, and the graph's evidence fills the rest of the context."""
        lead = self.params.hybrid_lead_documents
        if lead <= 0:
            return fused
        hybrid = self.retriever.scores("hybrid", question) if hybrid is None else hybrid
        rows, _ = ranks_of(hybrid, max(lead * 8, 50))
        index = self.retriever.index
        chunks = index.chunks
        index.backend.fetch(index, rows)
        documents, head = set(), []
        for row in rows.tolist():
            doc = chunks.row(row, named=True)["doc_id"]
            if doc not in documents and len(documents) == lead:
                break
            documents.add(doc)
            head.append(row)
        if not head:
            return fused
        out = fused.copy()
        finite = out[np.isfinite(out)]
        top = float(finite.max()) if len(finite) else 0.0
        out[head] = top + 1.0 + np.arange(len(head), 0, -1, dtype=np.float64)
        return out

    def _statement_channel(self, question: str) -> tuple[np.ndarray, bool]:
        """The statement channel at graph_hops, walked once. When that traversal fills its whole statement
        budget, the expansion is cut to 2 hops and the answer marked uncertain, since what lies beyond the
        budget was not read."""
        index, vector = self.retriever.index, self.retriever.embed(question)
        graph = index.graph.statements if index.graph is not None else None
        if graph is None or graph.size == 0:
            return np.full(index.size, -np.inf), False
        found = traverse_statements(graph, vector, self._deep.params)
        if len(found) < self._deep.params.statement_limit:
            return scores_of_statements(index, found, vector, self._deep.params), False
        return self._cut.scores("statement", question), True

    @staticmethod
    def _step(step: str, run: Callable):
        errors = []
        for _ in range(STEP_ATTEMPTS):
            try:
                return run()
            except Exception as error:  # noqa: BLE001 - a step is retried, then handed to a person
                errors.append(f"{type(error).__name__}: {error}")
        raise StepFailed(f"step {step!r} failed {STEP_ATTEMPTS} times: {errors[-1]}")

    def _context(self, fused: np.ndarray, channels: dict | None = None, shares: dict | None = None) -> Context:
        return build_context(self.retriever.index, fused, channels, shares, self.params.budget)

    def _thin(self, question: str, context: Context) -> bool:
        if not context.items:
            return True
        found = best_sentence(question, context.items, QuestionTerms(question, self.retriever.index.bm25))
        return found is None or found[0] < self.params.thin_below

    # -- answering --------------------------------------------------------------------------------------

    def answer(self, question: str, route: str = "auto") -> tuple[Retrieval, Answer]:
        try:
            retrieval = self.retrieve(question, route)
        except StepFailed as failure:
            empty = np.full(self.retriever.index.size, -np.inf)
            retrieval = Retrieval("agentic", None, empty, Context([], self.params.budget, 0, {}),
                                  review=str(failure))
            return retrieval, abstention(f"sent to human review: {failure}", self.answerer.name)
        started = time.perf_counter()
        answer = self.answerer.answer(question, retrieval.context)
        retrieval.latency_ms["answer"] = _ms(started)
        return retrieval, answer


def graph_selectivity(pair_share: float, params: QueryParams) -> float:
    """0 at the hub end of the graph route's weights, 1 at the selective end."""
    span = params.hub_pair_share - params.selective_pair_share
    return float(np.clip((params.hub_pair_share - pair_share) / span, 0.0, 1.0)) if span > 0 else 1.0


def graph_weights(selectivity: float, params: QueryParams, available: list[str]) -> dict[str, float]:
    hub, selective = dict(params.graph_channels_hub), dict(params.graph_channels_selective)
    weights = {name: round((1 - selectivity) * hub.get(name, 0.0) + selectivity * selective.get(name, 0.0), 4)
               for name in dict.fromkeys([*hub, *selective])}
    return {name: weight for name, weight in weights.items() if weight > 0 and name in available}


def clause_steps(question: str) -> list[str]:
    """LLM-free decomposition: the question's clauses ([] for a one-clause question)."""
    return sub_queries(question)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)
