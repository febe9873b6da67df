"""bench_similar_diff at 2,000 chunks on both graph backends: one line per backend that parses, SIMILAR counts
after the diff equal to what the diff implies (checked in each child against the KNN graph too), exit code 0;
and exit 1, with the problem named, when the cached graph no longer holds the KNN graph's edges."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

LINE = re.compile(r"^similar-diff chunks=2000 backend=(kuzu|ladybug) diff=(\S+) edges=(\d+) diff_deleted=(\d+) "
                  r"diff_added=(\d+) reweighted=(\d+) edges_after=(\d+) median_s=(\d+\.\d+) .*open_s=(\d+\.\d+) ",
                  re.MULTILINE)


@pytest.mark.subprocess
def test_similar_diff_on_both_backends_adds_up(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_similar_diff", "--chunks", "2000", "--repeats", "1",
                           "--diff-size", "200,500", "--cache", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PROBLEM" not in done.stdout
    found = {m[1]: m for m in LINE.finditer(done.stdout)}
    assert set(found) == {"kuzu", "ladybug"}, done.stdout
    built = dict(re.findall(r"^similar-diff-build chunks=2000 backend=(\w+) edges=(\d+) ", done.stdout, re.MULTILINE))
    for backend, m in found.items():
        edges, deleted, added, reweighted, after = (int(m[i]) for i in (3, 4, 5, 6, 7))
        assert m[2] == "200,500" and (deleted, added) == (200, 500)
        assert edges == int(built[backend]) > 40_000  # the cached graph, unchanged by the new document's nodes
        assert after == edges - deleted + added  # reweights are deleted and copied again
        assert 0 <= reweighted <= deleted
        assert float(m[8]) > 0 and float(m[9]) > 0
    # both backends wrote the same diff into the same graph
    assert found["kuzu"].group(3, 4, 5, 6, 7) == found["ladybug"].group(3, 4, 5, 6, 7)
    ratio = re.search(r"^ratio ladybug/kuzu=(\d+\.\d+)$", done.stdout, re.MULTILINE)
    assert ratio and float(ratio[1]) > 0
    # a re-run uses the cached input and graphs
    again = subprocess.run([sys.executable, "-m", "benchmarks.bench_similar_diff", "--chunks", "2000",
                            "--repeats", "1", "--backends", "kuzu", "--diff-size", "full", "--cache", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"^similar-diff-input chunks=2000 .* \(cached\)$", again.stdout, re.MULTILINE), again.stdout
    assert re.search(r"^similar-diff-build chunks=2000 backend=kuzu .* \(cached\)$", again.stdout, re.MULTILINE)
    full = re.search(r"^similar-diff chunks=2000 backend=kuzu diff=full edges=(\d+) diff_deleted=(\d+) "
                     r"diff_added=(\d+) reweighted=\d+ edges_after=(\d+) ", again.stdout, re.MULTILINE)
    edges, deleted, added, after = (int(full[i]) for i in (1, 2, 3, 4))
    assert after == edges - deleted + added and added > deleted  # the new document's 30 chunks are linked in
    assert "ratio" not in again.stdout

    # the cached graph loses edges the KNN graph has: the diff cannot leave the KNN graph's edges, and the run says so
    cached = tmp_path / "similar-diff-kuzu-2000" / "graph.kuzu"
    damage = ("import sys; from lexgraph.storage.graph_store import GraphStore\n"
              "with GraphStore.writer(sys.argv[1]) as graph:\n"
              "    graph.conn.execute('MATCH (:Chunk)-[r:SIMILAR]->(:Chunk) WITH r LIMIT 25 DELETE r')\n")
    subprocess.run([sys.executable, "-c", damage, str(cached)], cwd=ROOT, check=True, timeout=120,
                   env={**os.environ, "LEXGRAPH_GRAPH_BACKEND": "kuzu"})
    broken = subprocess.run([sys.executable, "-m", "benchmarks.bench_similar_diff", "--chunks", "2000",
                             "--repeats", "1", "--backends", "kuzu", "--diff-size", "full", "--cache", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert re.search(r"^PROBLEM kuzu: (SIMILAR edges: \d+ before|the diff did not leave)", broken.stdout,
                     re.MULTILINE), broken.stdout
