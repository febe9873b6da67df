"""Rewrite the saved KNN state of an index home in the current format (format 3: lists as row positions,
the lexical corpus as word ids), unchanged: what the first corpus update after the upgrade does by itself,
done once on a cached benchmark index so the timed fresh-process adds do not each pay for reading format 2.

    .venv/bin/python -m benchmarks.migrate_knn_state <index home>
"""
import sys
import time

from lexgraph.build import corpus_index as ci
from lexgraph.settings import Settings

started = time.time()
print(ci.resave_knn(ci.CorpusFiles(Settings.from_env(home=sys.argv[1]).index_dir)))
print("done in", round(time.time() - started, 1), "s")
