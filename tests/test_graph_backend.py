"""LEXGRAPH_GRAPH_BACKEND=ladybug: the same ingestion, graph and questions on LadybugDB, Kùzu's maintained fork,
in an index of its own (another graph database is another index version), with the same graph as on Kùzu.
Kùzu and LadybugDB register the same native types, so one process loads only one of them: each side runs as the
user would, through `lexgraph` commands in processes of their own."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from lexgraph.settings import Settings, SettingsError
from tests.conftest import ROOT

# never imported here: this process has Kùzu loaded
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ladybug") is None, reason="the ladybug package is not installed")

COUNT = ("import json, sys\nfrom lexgraph.settings import Settings\nfrom lexgraph.storage.graph_store import GraphStore\n"
         "g = GraphStore(Settings.from_env(home=sys.argv[1]).graph_path)\n"
         "print(json.dumps({t: g.count(t) for t in sys.argv[2:]}))")
TABLES = ("Source", "Chunk", "PART_OF", "NEXT", "SIMILAR", "Keyword", "KEYWORD_IN", "Statement", "Topic", "Fact",
          "Entity")


def _run(args: list[str], backend: str) -> str:
    env = {**os.environ, "LEXGRAPH_GRAPH_BACKEND": backend, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.subprocess
def test_ladybug_builds_the_same_graph_as_kuzu_and_answers(tiny_corpus, tmp_path):
    counts = {}
    for backend in ("kuzu", "ladybug"):
        home = tmp_path / backend
        out = _run(["-m", "orchestration.cli", "--home", str(home), "ingest", str(tiny_corpus), "--quiet"], backend)
        assert "0 failed" in out or "failed" not in out, out
        counts[backend] = json.loads(_run(["-c", COUNT, str(home), *TABLES], backend))
        answer = json.loads(_run(["-m", "orchestration.cli", "--home", str(home), "ask", "Who runs Bolt Engines?",
                                  "--route", "graph", "--json"], backend))
        assert answer["citations"] and answer["route"] == "graph"
    assert list((tmp_path / "ladybug").rglob("graph.lbug")) and not list((tmp_path / "ladybug").rglob("graph.kuzu"))
    assert counts["ladybug"] == counts["kuzu"] and counts["kuzu"]["Entity"] > 0 and counts["kuzu"]["SIMILAR"] > 0


def test_a_process_opens_one_graph_database_and_says_so(tmp_path):
    probe = ("import sys\nfrom lexgraph.storage.graph_store import GraphStore\n"
             "GraphStore(sys.argv[1] + '/a.kuzu', writable=True).close()\n"
             "try:\n    GraphStore(sys.argv[1] + '/b.lbug', writable=True)\n"
             "except RuntimeError as error:\n    print(error)")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert "cannot open a LadybugDB one" in out.stdout, out.stderr[-2000:]


def test_graph_backend_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("LEXGRAPH_GRAPH_BACKEND", raising=False)  # the default, whichever backend the suite runs on
    kuzu = Settings.from_env(home=tmp_path, graph_backend="kuzu")
    ladybug = Settings.from_env(home=tmp_path, graph_backend="ladybug")
    assert ladybug.index_version != kuzu.index_version and ladybug.graph_path.endswith("graph.lbug")
    assert kuzu.index_version == Settings.from_env(home=tmp_path).index_version  # Kùzu indexes keep their version
    monkeypatch.setenv("LEXGRAPH_GRAPH_BACKEND", "neo4j")
    with pytest.raises(SettingsError, match="LEXGRAPH_GRAPH_BACKEND must be one of kuzu, ladybug"):
        Settings.from_env(home=tmp_path)
