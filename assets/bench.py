"""The retrieval benchmark as an asset: after the corpus index is current, ask the questions of
every retrieval method over the inbox's index and publish the side-by-side table.

Thin by design: lexgraph.evaluation.bench does the work; this file only finds the questions, the index and
the embedding cost that Dagster itself recorded, and shapes the metadata.
"""
from pathlib import Path

import dagster as dg

from assets.catalog import QUALITY, spec_kwargs
from lexgraph.evaluation import bench
from lexgraph.evaluation.report import recall_bars_markdown
from resources import IndexResource, InboxResource

GROUP = QUALITY
# Per-document assets whose materializations record the embedding tokens they spent.
EMBEDDING_ASSETS = ("chunk_vectors", "document_keywords")
PAGE = 10_000  # the most event records Dagster returns at once


class RetrievalBenchmarkConfig(dg.Config):
    questions: str = ""  # empty: the settings' ($LEXGRAPH_QUESTIONS, else sample/questions.json)
    budget: int = bench.DEFAULT_BUDGET
    ks: list[int] = list(bench.DEFAULT_KS)
    out_dir: str = ""  # empty: bench-report/ beside the index version


def _embedding_tokens(instance: dg.DagsterInstance) -> int:
    """Embedding tokens from the materialization metadata; a batched run reports its total
    (batch_embedding_tokens; embedding_tokens before it was so labelled) on every partition it covers,
    so each run is counted once."""
    total = 0
    for asset in EMBEDDING_ASSETS:
        per_run: dict[str, int] = {}
        cursor, more = None, True
        while more:
            page = instance.fetch_materializations(dg.AssetKey(asset), limit=PAGE, cursor=cursor)
            for record in page.records:
                metadata = record.asset_materialization.metadata
                entry = metadata.get("batch_embedding_tokens") or metadata.get("embedding_tokens")
                if entry is not None:
                    per_run[record.run_id] = int(entry.value)
            cursor, more = page.cursor, page.has_more
        total += sum(per_run.values())
    return total


@dg.asset(
    kinds={"python", "lancedb", "parquet"}, **spec_kwargs("retrieval_benchmark", GROUP),
    deps=[dg.AssetKey("keyword_index"), dg.AssetKey("skeleton_selection")],
    description="Evidence recall@k, answer coverage at a token budget and latency of the dense (NaiveRAG), "
    "BM25, KET-RAG keyword and hybrid retrieval methods over the inbox's index (LanceDB vectors and the "
    "corpus Parquet state), on a questions file ($LEXGRAPH_QUESTIONS, default sample/questions.json); "
    "writes report.md, report.json and a recall plot.",
)
def retrieval_benchmark(context: dg.AssetExecutionContext, config: RetrievalBenchmarkConfig,
                        index: IndexResource, inbox: InboxResource) -> dg.MaterializeResult:
    settings = index.settings()
    questions = config.questions or str(settings.questions)
    tokens = _embedding_tokens(context.instance)  # 0 when this instance never ran the ingestion
    try:
        report = bench.evaluate_index(
            settings, questions, config.budget, config.ks, config.out_dir or None,
            corpus_info={"path": str(inbox.root()), "kind": "inbox", "index_dir": str(settings.index_dir)},
            cost={"embedding_tokens": tokens} if tokens else None)
    except (bench.BenchError, ValueError) as error:
        raise dg.Failure(description=str(error)) from None
    data, out = report.data, Path(report.out_dir)
    best = max(data["summary"], key=lambda m: data["summary"][m]["overall"]["recall"].get(5) or 0.0)
    return dg.MaterializeResult(metadata={
        "table": dg.MetadataValue.md(report.table),
        "recall_at_k": dg.MetadataValue.md(recall_bars_markdown(data["summary"], data["settings"]["ks"])),
        "recall_plot": dg.MetadataValue.path(str(out / "recall_at_k.svg")),
        "report": dg.MetadataValue.path(str(out / "report.md")),
        "questions": data["questions"]["count"],
        "best_method_recall_at_5": best,
        "index_bytes": data["index"]["size_bytes"]["total"],
        "unmatched_evidence_ids": len(data["questions"]["unmatched_evidence_ids"]),
    })
