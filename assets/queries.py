"""The query log as an asset: what users asked and how the router coped (issue 9, DESIGN §5).

Thin: lexgraph.query.service.QueryLog reads the log `lexgraph ask` and `lexgraph serve` append to;
this asset publishes its summary (route mix, retry and abstention rates, p50/p95 latency per route)."""
from pathlib import Path

import dagster as dg

from assets.catalog import QUALITY, spec_kwargs
from lexgraph.query.service import QueryLog
from resources import IndexResource


@dg.asset(
    kinds={"python", "json"}, **spec_kwargs("query_log", QUALITY),
    description="Summary of the question log (queries/log.jsonl under the index home, one line per question "
    "asked through `lexgraph ask`, `lexgraph serve` or the Python API): route mix, retry, abstention and "
    "uncertainty rates, questions sent to human review, and p50/p95 latency per route.",
)
def query_log(index: IndexResource) -> dg.MaterializeResult:
    log = QueryLog(Path(index.settings().home) / "queries")
    summary = log.summary()
    latency = "\n".join(["| route | questions | p50 ms | p95 ms |", "|---|---|---|---|"] + [
        f"| {route} | {summary['route_mix'][route]} | {v['p50']:.1f} | {v['p95']:.1f} |"
        for route, v in summary["latency_ms"].items()])
    return dg.MaterializeResult(metadata={
        "questions": summary["questions"], "route_mix": dg.MetadataValue.json(summary["route_mix"]),
        "retry_rate": summary["retry_rate"], "abstention_rate": summary["abstention_rate"],
        "uncertain_rate": summary["uncertain_rate"], "sent_to_review": summary["sent_to_review"],
        "llm_calls": summary["llm_calls"], "latency": dg.MetadataValue.md(latency),
        "log_path": dg.MetadataValue.path(str(log.log))})
