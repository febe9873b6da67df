"""Emptying the lexical graph before its rewrite: DETACH DELETE row by row (before) against dropping and
recreating the tables (now), each on a fresh copy of a Kùzu graph, medians of 3.

    .venv/bin/python benchmarks/bench_lexical_rewrite.py .lexgraph/bench/<corpus>/index/default/<version>/graph.kuzu
"""
import shutil, sys, time, statistics
from lexgraph.storage.graph_store import GraphStore, LEXICAL_NODES, LEXICAL_RELS
src = sys.argv[1]
res = {"delete": [], "recreate": []}
for i in range(3):
    for how in ("delete", "recreate"):
        dst = f"/tmp/bench_lexical_rewrite_{how}"
        shutil.rmtree(dst, ignore_errors=True); shutil.rmtree(dst + ".wal", ignore_errors=True)
        (shutil.copytree if __import__("os").path.isdir(src) else shutil.copy)(src, dst)
        with GraphStore.writer(dst) as g:
            n = sum(g.count(t) for t in LEXICAL_NODES)
            t = time.perf_counter()
            if how == "delete":
                for table in LEXICAL_NODES:
                    g.conn.execute(f"MATCH (n:{table}) DETACH DELETE n")
            else:
                g._recreate(*LEXICAL_RELS, *LEXICAL_NODES)
            res[how].append(time.perf_counter() - t)
            assert sum(g.count(t) for t in LEXICAL_NODES) == 0
print("lexical nodes", n, {k: round(statistics.median(v), 3) for k, v in res.items()},
      "ratio", round(statistics.median(res["recreate"]) / statistics.median(res["delete"]), 3))
