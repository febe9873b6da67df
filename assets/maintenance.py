"""Compaction of the LanceDB tables, last in the corpus job (lexgraph.storage.lance_maintenance decides
which tables need it and does it; this asset only runs it and shows what it did)."""

import dagster as dg

from assets.catalog import CORPUS, spec_kwargs
from assets.lexical import lexical_graph
from assets.partitions import GRAPH_WRITER_POOL
from assets.search_indexes import search_indexes
from assets.skeleton import keyword_index
from lexgraph.storage import lance_maintenance
from resources import LanceDBResource


@dg.asset(
    kinds={"python", "lancedb"}, **spec_kwargs("lance_compaction", CORPUS),
    deps=[keyword_index, search_indexes, lexical_graph], pool=GRAPH_WRITER_POOL,
    description="Compacts the LanceDB tables that per-document writes fragment (each document adds a fragment "
    f"and a version): a table with {lance_maintenance.SMALL_FRAGMENTS} small fragments, or with "
    f"{lance_maintenance.VERSIONS} versions older than {lance_maintenance.KEEP_VERSIONS}, is rewritten into a few "
    f"fragments and those old versions are pruned. Tables with a LanceDB index are left to search_indexes. "
    "A failure (a concurrent writer) is shown and retried by the next corpus run; nothing is lost.",
)
def lance_compaction(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
    tables = lance_maintenance.compact_tables(lancedb.get())
    compacted = [t["table"] for t in tables if t["decision"] == "compacted"]
    failed = [f"{t['table']}: {t['decision']}" for t in tables if t["decision"].startswith("failed")]
    for line in failed:
        context.log.warning(f"not compacted, {line}")
    context.log.info(f"compacted {len(compacted)} of {len(tables)} LanceDB table(s): {', '.join(compacted) or 'none'}")
    return dg.MaterializeResult(metadata={
        "compacted": dg.MetadataValue.json(compacted), "failed": dg.MetadataValue.json(failed),
        "tables": dg.MetadataValue.md(_table_markdown(tables))})


def _table_markdown(tables: list[dict]) -> str:
    lines = ["| table | decision | fragments | versions | MB | seconds |", "|---|---|---|---|---|---|"]
    for t in tables:
        lines.append(f"| {t['table']} | {t['decision']} | {t['fragments_before']} → {t['fragments_after']} | "
                     f"{t['versions_before']} → {t['versions_after']} | {t['bytes_before'] / 1e6:.1f} → "
                     f"{t['bytes_after'] / 1e6:.1f} | {t['seconds']} |")
    return "\n".join(lines)
