"""A process killed (SIGKILL) at any named point of an ingestion leaves stores that the same command,
run again, brings to exactly what a clean build of the same folder gives; no run stays STARTED.

The crashed command runs as a subprocess (the real `lexgraph ingest` entry point, with a DAGSTER_HOME
holding the project's dagster.yaml, pools included); the rerun goes through the same entry point in
this process, which already has the embedding model loaded.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pytest

from lexgraph import faults
from lexgraph.indexing.corpus_keywords import update_keyword_index
from lexgraph.indexing.corpus_state import CorpusFiles
from lexgraph.indexing.knn_update import update_knn
from lexgraph.extract.keywords import keyword_stats
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore
from lexgraph.storage.graph_store import GraphStore
from lexgraph.storage.vector_store import VectorStore
from tests.helpers import crash_keyword_update
from tests.conftest import cleared_variables

FIXTURE_MARKS = {"baseline": ("ingest",), "clean_build": ("ingest",)}  # marks by fixture (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
GRAPH_TABLES = ("Source", "Chunk", "PART_OF", "NEXT", "SIMILAR", "Keyword", "KEYWORD_IN")

DOCS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n"
                "## Terms\n\nDelivery is due in May 2024 at Bergen.\n",
    "beta.txt": "Bolt Engines is run by Dana Frost.\n\nIts plant is in Kiel.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n",
}
# The change each scenario makes: gamma (the last key) changes and a document arrives, so one run
# ingests both, and the crashed command reaches every point with work still to do after it.
CHANGED_GAMMA = "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 3 million to Bolt Engines in Bergen.\n"
NEW_DOC = ("Søren notes: 2024.md", "# Notes\n\nSøren Åberg chairs the board of Alpha Shipping.\n\n"
                                   "Alpha Shipping and Bolt Engines settled contract C-1 in Bergen.\n")
FINAL = {**DOCS, "gamma.md": CHANGED_GAMMA, NEW_DOC[0]: NEW_DOC[1]}


# --- reading the stores ------------------------------------------------------------------------------


def store_snapshot(home: Path) -> dict:
    """Everything a clean build determines, in comparable form, plus duplicate checks. Values computed
    from embeddings (weights, PageRank, keyword vector sums) are kept apart as floats: a model batch of
    other texts pads differently and moves them in the seventh digit, so they compare with a tolerance."""
    settings = Settings.from_env(home=home)
    vectors = VectorStore(settings.lance_uri)
    sources = vectors.sources()
    chunks = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().select(["chunk_id", "doc_id", "content_hash"]))
    chunks = chunks.join(pl.from_arrow(vectors.db.open_table("chunk_scores").to_arrow()), on="chunk_id", how="left")
    lance_keywords = pl.from_arrow(vectors.db.open_table("keywords").to_arrow().select(["keyword", "sentence_count"]))
    graph = GraphStore(settings.graph_path)
    try:
        counts = {t: graph.count(t) for t in GRAPH_TABLES}
        part_of = graph.query("MATCH (c:Chunk) OPTIONAL MATCH (c)-[r:PART_OF]->(:Source) "
                              "WITH c, count(r) AS n RETURN min(n) AS least, max(n) AS most")
        next_out = graph.query("MATCH (c:Chunk)-[r:NEXT]->(:Chunk) WITH c, count(r) AS n RETURN max(n) AS most")
        similar = graph.similarity_edges()
        keyword_in = graph.query("MATCH (k:Keyword)-[r:KEYWORD_IN]->(c:Chunk) RETURN k.id AS keyword, "
                                 "c.id AS chunk_id, r.occurrences AS n")
        scores = graph.query("MATCH (c:Chunk) RETURN c.id AS chunk_id, c.pagerank AS pagerank, "
                             "c.in_skeleton AS selected")
    finally:
        graph.close()
    files = CorpusFiles(settings.index_dir)
    pagerank = pl.read_parquet(files.pagerank)
    skeleton = pl.read_parquet(files.skeleton)
    keyword_index = pl.read_ipc(files.keyword_index)
    catalog = vectors.indexed_hashes()
    exact = {
        "sources": sorted(zip(sources["doc_id"], sources["content_hash"], sources["chunk_count"])),
        "lance_chunks": sorted(zip(chunks["chunk_id"], chunks["doc_id"], chunks["content_hash"], chunks["in_skeleton"])),
        "lance_keywords": sorted(lance_keywords.iter_rows()),
        "graph_counts": counts,
        "similar": sorted(zip(similar["src"], similar["dst"], similar["kind"])),
        "keyword_in": sorted(keyword_in.iter_rows()),
        "graph_skeleton": sorted(zip(scores["chunk_id"], scores["selected"])),
        "pagerank_file": sorted(zip(pagerank["chunk_id"], pagerank["doc_id"])),
        "skeleton_file": sorted(zip(skeleton["chunk_id"], skeleton["selected"])),
        "keyword_index_file": sorted(zip(keyword_index["keyword"], keyword_index["sentence_count"])),
    }
    approx = {
        "lance_pagerank": dict(zip(chunks["chunk_id"], chunks["pagerank"])),
        "similar_weight": {(a, b, k): w for a, b, k, w in zip(similar["src"], similar["dst"], similar["kind"],
                                                              similar["weight"])},
        "graph_pagerank": dict(zip(scores["chunk_id"], scores["pagerank"])),
        "pagerank_file": dict(zip(pagerank["chunk_id"], pagerank["pagerank"])),
        "keyword_vector_sums": dict(zip(keyword_index["keyword"], keyword_index["vector_sum"].to_list())),
    }
    checks = {
        "lance_chunk_ids_unique": bool(chunks["chunk_id"].is_unique().all()),
        "part_of_per_chunk": (int(part_of["least"][0]), int(part_of["most"][0])),
        "next_out_at_most_one": int(next_out["most"][0] or 0) <= 1,
        "stale_steps": files.stale_steps(catalog, settings),
    }
    return {"exact": exact, "approx": approx, "checks": checks}


def assert_same_stores(actual: dict, clean: dict) -> None:
    assert actual["checks"]["stale_steps"] == [], "the corpus index was not brought up to the catalog"
    assert actual["checks"] == clean["checks"] == {"lance_chunk_ids_unique": True, "part_of_per_chunk": (1, 1),
                                                   "next_out_at_most_one": True, "stale_steps": []}
    for key, value in clean["exact"].items():
        assert actual["exact"][key] == value, f"{key} differs from a clean build"
    for key, value in clean["approx"].items():
        assert actual["approx"][key].keys() == value.keys(), f"{key} differs from a clean build"
        for item, number in value.items():
            assert np.allclose(actual["approx"][key][item], number, rtol=1e-4, atol=1e-5), (key, item)


# --- running `lexgraph ingest` ------------------------------------------------------------------------


def _environment(home: Path, dagster_home: Path, crash_at: str | None = None) -> dict[str, str]:
    cleared = set(cleared_variables())
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    env.update(LEXGRAPH_HOME=str(home), DAGSTER_HOME=str(dagster_home), HF_HUB_OFFLINE="1")
    if crash_at:
        env[faults.CRASH_ENV] = crash_at
    return env


def ingest_subprocess(inbox: Path, home: Path, dagster_home: Path, crash_at: str | None = None):
    script = "import sys; from orchestration.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, "ingest", "--quiet", str(inbox)], cwd=ROOT,
                          env=_environment(home, dagster_home, crash_at), capture_output=True, text=True,
                          timeout=600)


def ingest_here(inbox: Path, home: Path, dagster_home: Path, monkeypatch, capsys) -> tuple[int, str]:
    """`lexgraph ingest` in this process (the model is loaded already); exit code and stdout."""
    from orchestration.cli import main

    with monkeypatch.context() as patch:
        for key in cleared_variables():
            patch.delenv(key)
        patch.setenv("LEXGRAPH_HOME", str(home))
        patch.setenv("DAGSTER_HOME", str(dagster_home))
        capsys.readouterr()
        code = main(["ingest", "--quiet", str(inbox)])
        out = capsys.readouterr()
    return code, out.out + out.err


def write_folder(folder: Path, docs: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / name).write_text(text)
    return folder


def dagster_home(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "orchestration" / "dagster.yaml", path / "dagster.yaml")
    return path


def _ingest_in_process(inbox: Path, home: Path, dh: Path) -> None:
    from orchestration.runner import ingest_with_default_instance

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAGSTER_HOME", str(dh))
        report = ingest_with_default_instance(inbox, settings=Settings.from_env(home=home), progress=False)
    assert report.failed == {} and report.corpus_index_ok, report


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, embedder) -> Path:
    """Three documents indexed, corpus index built: the state each crash scenario starts from."""
    root = tmp_path_factory.mktemp("baseline")
    _ingest_in_process(write_folder(root / "inbox", DOCS), root / "home", dagster_home(root / "dagster"))
    return root


@pytest.fixture(scope="module")
def clean_build(tmp_path_factory, embedder) -> dict:
    """A snapshot of a clean build of the folder every scenario ends with."""
    root = tmp_path_factory.mktemp("clean")
    _ingest_in_process(write_folder(root / "inbox", FINAL), root / "home", dagster_home(root / "dagster"))
    return store_snapshot(root / "home")


# embedding: gamma's new vectors replaced its old ones while its catalog row is still the old one;
# catalog: the whole change is in the catalog, the corpus index has not seen it (issue 7's "23 unchanged");
# keyword_index: in the corpus job, contributions written, the keyword index not yet.
@pytest.mark.subprocess
@pytest.mark.parametrize("point", faults.POINTS)
def test_kill_at_any_point_then_rerun_equals_a_clean_build(point, baseline, clean_build, tmp_path, monkeypatch,
                                                           capsys):
    shutil.copytree(baseline, tmp_path, dirs_exist_ok=True)
    inbox, home, dh = tmp_path / "inbox", tmp_path / "home", tmp_path / "dagster"
    write_folder(inbox, FINAL)

    crashed = ingest_subprocess(inbox, home, dh, crash_at=point)
    assert crashed.returncode == -9, f"expected death by SIGKILL at {point}: {crashed.stderr[-3000:]}"

    code, output = ingest_here(inbox, home, dh, monkeypatch, capsys)
    assert code == 0, output
    if point != faults.EMBEDDING:
        assert "0 new, 0 changed, 4 unchanged" in output  # nothing left to ingest, only the corpus index
    assert "corpus index update" in output
    assert_same_stores(store_snapshot(home), clean_build)

    with _instance(dh) as instance:
        unfinished = instance.get_runs(filters=dg.RunsFilter(statuses=[
            dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]))
        assert unfinished == [], "a killed run was left as if still going"
        failed = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        assert len(failed) == 1 and "killed or crashed" in _failure_message(instance, failed[0].run_id)
        assert not instance.event_log_storage.get_concurrency_run_ids()  # no pool slot held by the dead run

    # And the next ingest has nothing left to do.
    code, output = ingest_here(inbox, home, dh, monkeypatch, capsys)
    assert code == 0 and "0 new, 0 changed, 4 unchanged" in output and "corpus index update" not in output, output


def _instance(dh: Path) -> dg.DagsterInstance:
    from dagster._core.instance.ref import InstanceRef

    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dh)))


def _failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    events = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return " ".join(e.message or "" for e in events)


# --- the corpus state on its own, without Dagster --------------------------------------------------------


def _keyword_store(root: Path, docs: int, seed: int = 0) -> ExtractStore:
    """Keyword stats of `docs` synthetic documents with overlapping keywords."""
    rng = np.random.default_rng(seed)
    store = ExtractStore(root / "extract")
    words = [f"word{i}" for i in range(12)]
    for d in range(docs):
        rows = [{"keyword": words[(d * 3 + j) % len(words)], "sentence_id": j % 4, "chunk_id": f"doc{d}-c{j % 2}"}
                for j in range(7)]
        store.write("keyword_stats", f"doc{d}", keyword_stats(pl.DataFrame(rows), rng.normal(size=(4, 8))))
    return store


@pytest.mark.subprocess
def test_keyword_index_update_killed_midway_is_redone_exactly_once(tmp_path):
    store = _keyword_store(tmp_path, 5)
    files = CorpusFiles(tmp_path / "index")
    update_keyword_index(files, store, ["doc0", "doc1", "doc2"], 8)
    # doc1 changes, doc2 goes, doc3 and doc4 arrive; the update is killed after writing contributions.
    changed = _keyword_store(tmp_path / "other", 2, seed=7)
    store.write("keyword_stats", "doc1", changed.read("keyword_stats", "doc1"))
    final = ["doc0", "doc1", "doc3", "doc4"]
    crashed = crash_keyword_update(tmp_path, final)
    assert crashed.returncode == -9, crashed.stderr[-2000:]

    result = update_keyword_index(files, store, final, 8)
    assert (sorted(result.added), result.updated, result.removed) == (["doc3", "doc4"], ["doc1"], ["doc2"])
    clean = update_keyword_index(CorpusFiles(tmp_path / "clean"), store, final, 8)
    assert result.index.equals(clean.index)
    again = update_keyword_index(files, store, final, 8)  # nothing left to do, nothing applied twice
    assert (again.added, again.updated, again.removed) == ([], [], []) and again.index.equals(clean.index)
    assert sorted(p.name.split(".")[0] for p in files.keyword_contrib.iterdir()) == final


def test_keyword_index_without_its_contribution_list_is_rebuilt(tmp_path):
    """An index whose list of contributions is lost (or an older layout) is rebuilt, never trusted."""
    store = _keyword_store(tmp_path, 3)
    files = CorpusFiles(tmp_path / "index")
    built = update_keyword_index(files, store, ["doc0", "doc1", "doc2"], 8)
    built.index.write_ipc(files.keyword_index)  # same rows, no list
    result = update_keyword_index(files, store, ["doc0", "doc1", "doc2"], 8)
    assert sorted(result.added) == ["doc0", "doc1", "doc2"] and result.index.equals(built.index)


def test_keyword_index_saved_as_parquet_before_is_read_once_then_replaced(tmp_path):
    """An index saved by the Parquet layout (before the Arrow file) is trusted with its list and rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = _keyword_store(tmp_path, 3)
    files = CorpusFiles(tmp_path / "index")
    built = update_keyword_index(files, store, ["doc0", "doc1"], 8)
    with pa.memory_map(str(files.keyword_index)) as source:
        pq.write_table(pa.ipc.open_file(source).read_all(), files.keyword_index_parquet)  # list kept
    files.keyword_index.unlink()
    result = update_keyword_index(files, store, ["doc0", "doc1", "doc2"], 8)
    assert result.added == ["doc2"] and not files.keyword_index_parquet.exists()
    assert result.index.equals(update_keyword_index(CorpusFiles(tmp_path / "fresh"), store,
                                                    ["doc0", "doc1", "doc2"], 8).index)
    assert built.index.height > 0


def test_knn_state_torn_between_its_two_files_is_rebuilt(tmp_path):
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(12, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = pl.DataFrame({"chunk_id": [f"c{i:02d}" for i in range(12)], "doc_id": [f"d{i // 3}" for i in range(12)]})
    words = chunks.select("chunk_id").with_columns(pl.lit(["shared"]).alias("words"))
    files = CorpusFiles(tmp_path / "index")
    update_knn(files, chunks.head(9), vectors[:9], words, k=3)
    old_corpus = files.knn_corpus.read_bytes()
    update_knn(files, chunks, vectors, words, k=3)
    files.knn_corpus.write_bytes(old_corpus)  # killed after the new lists, before the new corpus was written
    result = update_knn(files, chunks, vectors, words, k=3)
    clean = update_knn(CorpusFiles(tmp_path / "clean"), chunks, vectors, words, k=3)
    assert result.rebuilt
    assert result.edges.sort("src", "dst", "kind").equals(clean.edges.sort("src", "dst", "kind"))
