"""Named crash points, for testing that a killed process leaves stores the next run repairs.

`crash_point(name)` does nothing unless the environment variable LEXGRAPH_CRASH_AT equals name;
then the process sends itself SIGKILL at that spot: no cleanup, no flushing, no `finally`, exactly
as if the machine lost power or an operator ran `kill -9`. `name:n` (e.g. `extraction:3`) kills at
the n-th time the process passes the point instead of the first.
"""
from __future__ import annotations

import os
import signal

CRASH_ENV = "LEXGRAPH_CRASH_AT"

# The points the engine places, in the order an ingestion passes them.
EMBEDDING = "embedding"  # in embed_documents, after the first group of vectors is written
CATALOG = "catalog"  # at the end of load_graph, right after the catalog write
KEYWORD_INDEX = "keyword_index"  # in the corpus keyword-index update, contributions written, index not yet
# at the end of the lexical graph build, its writes committed but not yet checkpointed (the corpus run's steps
# share one graph writer, closed when the run ends), the step's record not yet written
LEXICAL_GRAPH = "lexical_graph"
POINTS = (EMBEDDING, CATALOG, KEYWORD_INDEX, LEXICAL_GRAPH)
# Reached only with an LLM configured, so not in POINTS: in extract_documents, right after a paid LLM call
# is in the cost ledger and its answer in the extraction cache, before the document's extractions are written.
EXTRACTION = "extraction"
# Reached only above the lance threshold, so not in POINTS either: in the graph tables' update by difference,
# after the statements, topics and nodes are written, before the entities.
GRAPH_TABLES_DIFF = "graph_tables_diff"

_passes: dict[str, int] = {}


def crash_point(name: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    point, _, times = wanted.partition(":")
    if point != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] >= int(times or 1):
        os.kill(os.getpid(), signal.SIGKILL)
