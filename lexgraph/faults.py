"""Named crash points, for testing that a killed process leaves stores the next run repairs.

`crash_point(name)` does nothing unless the environment variable LEXGRAPH_CRASH_AT equals name;
then the process sends itself SIGKILL at that spot: no cleanup, no flushing, no `finally`, exactly
as if the machine lost power or an operator ran `kill -9`.
"""
from __future__ import annotations

import os
import signal

CRASH_ENV = "LEXGRAPH_CRASH_AT"

# The points the engine places, in the order an ingestion passes them.
EMBEDDING = "embedding"  # in embed_documents, after the first group of vectors is written
CATALOG = "catalog"  # at the end of load_graph, right after the catalog write
KEYWORD_INDEX = "keyword_index"  # in the corpus keyword-index update, contributions written, index not yet
POINTS = (EMBEDDING, CATALOG, KEYWORD_INDEX)


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
