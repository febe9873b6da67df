"""The query engine over the lance backend (lexgraph.query.lance_backend) of an index whose lexical graph has no
LanceDB tables yet (lexgraph.query.lance_graph_tables: written by the corpus job; an index built before them, or
a corpus job that has not run since): the graph channels have nothing to read, so the graph and agentic routes
would silently be the semantic ranking under another name. Instead they fall back to the semantic route, and the
answer's log line says so (a retry from the route to semantic, with the reason); the semantic route's
thin-evidence retry to the graph route is skipped, since it would rank the same chunks again. With the tables,
the service uses the plain QueryEngine."""
from __future__ import annotations

from lexgraph.query.engine import QueryEngine, Retrieval


class ScaleQueryEngine(QueryEngine):
    def __init__(self, *args, chunks: int, threshold: int, why: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.fallback_reason = (f"no lexical graph on the lance query backend ({chunks} chunks; "
                                f"LEXGRAPH_LANCE_THRESHOLD={threshold}): {why or 'its tables are missing'}; "
                                "answered on the semantic route")

    def _run(self, question: str, route: str, decision, latency: dict) -> Retrieval:
        if route == "semantic":
            return super()._run(question, route, decision, latency)
        result = super()._run(question, "semantic", decision, latency)
        result.retries = [{"from": route, "to": "semantic", "reason": self.fallback_reason}]
        return result

    def _thin(self, question: str, context) -> bool:
        return False
