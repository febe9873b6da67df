"""The query engine over the lance backend (lexgraph.query.lance_backend): the graph channels (statements,
entities, paths) are not loaded there, so the graph and agentic routes would silently be the semantic
ranking under another name. Instead they fall back to the semantic route, and the answer's log line says so
(a retry from the route to semantic, with the reason); the semantic route's thin-evidence retry to the graph
route is skipped, since it would rank the same chunks again."""
from __future__ import annotations

from lexgraph.query.engine import QueryEngine, Retrieval


class ScaleQueryEngine(QueryEngine):
    def __init__(self, *args, chunks: int, threshold: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fallback_reason = (f"graph channels not loaded on the lance query backend ({chunks} chunks; "
                                f"LEXGRAPH_LANCE_THRESHOLD={threshold}): answered on the semantic route")

    def _run(self, question: str, route: str, decision, latency: dict) -> Retrieval:
        if route == "semantic":
            return super()._run(question, route, decision, latency)
        result = super()._run(question, "semantic", decision, latency)
        result.retries = [{"from": route, "to": "semantic", "reason": self.fallback_reason}]
        return result

    def _thin(self, question: str, context) -> bool:
        return False
