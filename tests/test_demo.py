"""`make demo` runs offline with the offline NLP extractor: no endpoint, no key, no network."""
import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.subprocess, pytest.mark.ingest]  # `make demo`

DEAD_PROXY = "http://127.0.0.1:9"  # any attempt to reach the network fails at once


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_runs_offline_with_the_nlp_extractor(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEXGRAPH_", "OPENAI_", "DAGSTER_HOME")) and k.lower() not in ("http_proxy", "https_proxy")}
    env.update(LEXGRAPH_HOME=str(tmp_path / "lexgraph"), DAGSTER_HOME=str(tmp_path / "dagster"), HF_HUB_OFFLINE="1",
               HTTP_PROXY=DEAD_PROXY, HTTPS_PROXY=DEAD_PROXY, http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY,
               NO_PROXY="", no_proxy="")
    # -o: the virtualenv is taken as installed (the test must not reinstall packages)
    done = subprocess.run(["make", "-s", "-o", ".venv/.installed", "demo"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    counts = {name: int(n) for name, n in re.findall(r"(Statement|Topic|Fact|Entity): (\d+)", out)}
    assert set(counts) == {"Statement", "Topic", "Fact", "Entity"} and min(counts.values()) > 0, out
    assert "extractor: nlp" in out and "LLM calls so far: 0" in out
    assert re.search(r"skeleton: \d+ of \d+ chunks selected", out)
    assert re.search(r"^1\. kestrel-propulsion-profile\.md ", out, re.M), out
