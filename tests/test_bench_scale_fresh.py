"""The fresh-process add of bench_scale on a tiny synthetic index: the figure is printed, the new document
is really in LanceDB and Kùzu afterwards, and bad arguments are refused with a clear message."""
import re
import subprocess
import sys

import pytest

from benchmarks.synthetic_index import CorpusSpec, SyntheticIndex, document_name, markers, word
from lexgraph.ids import document_id
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import VERIFIED_FILE
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from tests.conftest import ROOT

SPEC = CorpusSpec(chunks=300, doc_chunks=10)
NEW_CHUNKS = 4


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.bench_scale", "--fresh-only", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.subprocess
def test_fresh_add_is_timed_and_the_document_is_stored(tmp_path):
    done = _bench("--fresh-chunks", str(SPEC.chunks), "--fresh-doc-chunks", str(SPEC.doc_chunks),
                  "--fresh-new-chunks", str(NEW_CHUNKS), "--fresh-repeats", "1", "--no-breakdown",
                  "--fresh-cache", str(tmp_path), "--guard-chunks", "100")
    # the guard: the same add on a 100-chunk index first, then the ratio and its verdict, which sets the exit code
    guard = re.search(r"^add-guard chunks=300 baseline_chunks=100 add_s=(\S+) baseline_s=(\S+) ratio=(\S+) "
                      r"limit=3 (ok|REGRESSION)$", done.stdout, re.MULTILINE)
    assert guard, done.stdout + done.stderr
    add, baseline, ratio = (float(guard[i]) for i in (1, 2, 3))
    # the seconds are printed to 0.01 s, the ratio to 0.01: allow both roundings
    slack = 0.005 / baseline * (1 + add / baseline) + 0.005
    assert abs(ratio - add / baseline) <= slack, (ratio, add, baseline)
    assert done.returncode == (0 if guard[4] == "ok" else 1) and (guard[4] == "ok") == (ratio <= 3)
    assert "fresh-process add at 100 chunks:" in done.stdout.split("fresh-process add at 300 chunks:")[0]
    assert re.search(r"^fresh-process add at 300 chunks: \d+\.\d s$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^fresh-process add at 300 chunks: peak RSS \d+ MiB$", done.stdout, re.MULTILINE)
    assert "started no run and no corpus update" in done.stdout
    assert re.search(r"built in \d+ s \(peak RSS \d+ MiB\), settled in \d+ s", done.stdout), done.stdout
    # the last repeat's copy: the new document's chunks are in both stores, next to the 300 synthetic ones
    work = SyntheticIndex.under(SPEC, tmp_path).root.parent / f"{SPEC.key()}.work"
    settings = Settings.from_env(home=work / "home")
    doc_id = document_id(document_name(SPEC.documents))
    vectors = VectorStore(settings.lance_uri)
    assert vectors.count("chunks", f"doc_id = '{doc_id}'") == NEW_CHUNKS
    assert vectors.count("chunks") == SPEC.chunks + NEW_CHUNKS
    graph = GraphStore(settings.graph_path)
    try:
        nodes = graph.query("MATCH (c:Chunk) WHERE c.doc_id = $d RETURN count(c) AS n", {"d": doc_id})["n"][0]
        similar = graph.query("MATCH (c:Chunk)-[:SIMILAR]-(:Chunk) WHERE c.doc_id = $d RETURN count(*) AS n",
                              {"d": doc_id})["n"][0]
    finally:
        graph.close()
    assert nodes == NEW_CHUNKS
    assert similar > 0  # the corpus update linked it into the KNN graph
    # the verdict follows the limit: the same adds (indexes cached now) fail a limit no add meets, pass a loose one
    for limit, verdict, code in (("0.01", "REGRESSION", 1), ("1000", "ok", 0)):
        again = _bench("--fresh-chunks", str(SPEC.chunks), "--fresh-doc-chunks", str(SPEC.doc_chunks),
                       "--fresh-new-chunks", str(NEW_CHUNKS), "--fresh-repeats", "1", "--no-breakdown",
                       "--fresh-cache", str(tmp_path), "--guard-chunks", "100", "--guard-limit", limit)
        assert re.search(rf"^add-guard chunks=300 baseline_chunks=100 .* limit={limit} {verdict}$", again.stdout,
                         re.MULTILINE), again.stdout + again.stderr
        assert again.returncode == code, again.stderr
    # the pristine cached index was not touched by the add
    pristine = Settings.from_env(home=SyntheticIndex.under(SPEC, tmp_path).home)
    assert VectorStore(pristine.lance_uri).count("chunks") == SPEC.chunks
    # settled once after the build: the extract files' verified record is there for every copy to start from
    assert (pristine.extract_dir / VERIFIED_FILE).is_file()


@pytest.mark.subprocess
@pytest.mark.parametrize("args, message", [
    (["--fresh-chunks", "0"], "argument --fresh-chunks: must be at least 1, got 0"),
    (["--fresh-repeats", "-2"], "argument --fresh-repeats: must be at least 1, got -2"),
    (["--fresh-doc-chunks", "ten"], "argument --fresh-doc-chunks: expected a whole number, got 'ten'"),
    (["--no-fresh"], "--fresh-only and --no-fresh exclude each other"),
    (["--guard-limit", "0"], "argument --guard-limit: must be a positive number, got 0"),
    (["--guard-limit", "three"], "argument --guard-limit: expected a number, got 'three'"),
])
def test_bad_arguments_exit_2_with_a_message(args, message):
    done = _bench(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "fresh-process add at" not in done.stdout


def test_generator_markers_round_trip_and_bad_specs():
    assert markers(f"## Qu{word(1234)} Xe{word(56789)} part 3\n\nBaba.") == (1234, 56789)
    assert markers("no markers here") == (None, None)
    with pytest.raises(ValueError, match="at least 1 chunk"):
        CorpusSpec(chunks=0)
    with pytest.raises(ValueError, match="at least 1 chunk each"):
        CorpusSpec(chunks=10, doc_chunks=0)
