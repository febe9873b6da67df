"""Ingestion through the real asset graph, a real Dagster instance, LanceDB and Kùzu."""
import random
import re
import resource
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from lexgraph.settings import Settings
from orchestration.runner import ingest_folder
from tests.helpers import graph_counts, materialized_partitions, run_partition_keys, stores


def test_ingest_then_reingest_has_no_duplicates(tiny_corpus, home, instance):
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert (report.new, report.failed, len(report.runs)) == (4, {}, 1)  # one batched run for four files
    vectors, settings = stores(home)
    chunks = vectors.count("chunks")
    assert vectors.count("sources") == 4 and chunks >= 4
    assert graph_counts(home) == {"Source": 4, "Chunk": chunks, "PART_OF": chunks, "NEXT": chunks - 4}

    again = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert (again.new, again.changed, again.unchanged, again.runs) == (0, 0, 4, [])

    # Forcing a re-materialization of every partition replaces rows instead of adding them.
    from orchestration.definitions import build_definitions

    keys = instance.get_dynamic_partitions("documents")
    job = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus)).resolve_job_def("ingest_documents")
    result = job.execute_in_process(instance=instance, tags={
        "dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
    assert result.success
    assert vectors.count("chunks") == chunks
    assert graph_counts(home) == {"Source": 4, "Chunk": chunks, "PART_OF": chunks, "NEXT": chunks - 4}
    ids = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().select(["chunk_id"]))["chunk_id"]
    assert ids.n_unique() == ids.len()


def test_offsets_point_back_into_the_source(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    vectors, _ = stores(home)
    rows = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().drop(["vector"]))
    for row in rows.iter_rows(named=True):
        source = (tiny_corpus / row["source_path"]).read_text()
        assert source[row["char_start"]: row["char_end"]] == row["text"]


def test_changed_file_reruns_only_its_partition(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    before = materialized_partitions(instance, "document_chunks")
    (tiny_corpus / "beta.txt").write_text("Bolt Engines is now run by Lee Park.\n")
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    assert (report.changed, report.new, report.unchanged) == (1, 0, 3)
    after = materialized_partitions(instance, "document_chunks")
    assert len(after) == len(before) + 1 and after[-1].startswith("beta.txt-")
    vectors, _ = stores(home)
    texts = pl.from_arrow(vectors.db.open_table("chunks").to_arrow().select(["doc_id", "text"]))
    beta = texts.filter(pl.col("doc_id") == after[-1])["text"].to_list()
    assert beta == ["Bolt Engines is now run by Lee Park."]


def test_removed_file_is_purged_and_others_stay(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    vectors, settings = stores(home)
    gamma = [d for d in vectors.sources()["doc_id"] if d.startswith("gamma")][0]
    gamma_chunks = vectors.count("chunks", f"doc_id = '{gamma}'")
    total = vectors.count("chunks")
    (tiny_corpus / "gamma.md").unlink()
    report = ingest_folder(tiny_corpus, instance, home=str(home), prune=True, progress=False)
    assert report.removed == 1
    assert vectors.count("chunks", f"doc_id = '{gamma}'") == 0
    assert vectors.count("chunks") == total - gamma_chunks
    assert gamma not in vectors.sources()["doc_id"].to_list()
    assert gamma not in instance.get_dynamic_partitions("documents")
    counts = graph_counts(home)
    assert counts["Source"] == 3 and counts["Chunk"] == total - gamma_chunks
    assert not (settings.extract_dir / "chunks" / f"{gamma}.parquet").exists()


def test_bad_inputs_fail_alone_and_lose_nothing(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    vectors, _ = stores(home)
    alpha_before = vectors.count("chunks", "doc_id LIKE 'alpha.md-%'")
    (tiny_corpus / "empty.txt").write_bytes(b"")
    (tiny_corpus / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (tiny_corpus / "latin1.md").write_bytes("Caf\xe9 cr\xe8me".encode("latin-1"))
    (tiny_corpus / "new good: file ü.md").write_text("# New\n\nA new supplier, Corvid Marine, joined in 2025.\n")
    (tiny_corpus / "alpha.md").write_bytes(b"\x00\x01broken now")  # an indexed file turns binary

    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    problems = sorted(report.failed.values())
    assert len(problems) == 4
    assert any("empty.txt" in p and "empty" in p for p in problems)
    assert any("image.txt" in p and "binary" in p for p in problems)
    assert any("latin1.md" in p and "UTF-8" in p for p in problems)
    assert any("alpha.md" in p and "binary" in p for p in problems)
    paths = vectors.sources()["relative_path"].to_list()
    assert "new good: file ü.md" in paths  # the good file went through
    assert vectors.count("chunks", "doc_id LIKE 'alpha.md-%'") == alpha_before  # old index kept


def test_file_removed_between_request_and_run(tiny_corpus, home, instance):
    from lexgraph.inbox import scan_folder
    from orchestration.definitions import build_definitions
    from orchestration.reconcile import reconcile

    requests = reconcile(scan_folder(tiny_corpus), {}, [])
    instance.add_dynamic_partitions("documents", requests.add_partitions)
    (tiny_corpus / "beta.txt").unlink()
    job = build_definitions(Settings.from_env(home=home, inbox=tiny_corpus)).resolve_job_def("ingest_documents")
    [request] = requests.ingest_runs
    result = job.execute_in_process(instance=instance, tags=request.tags, raise_on_error=False)
    assert result.success  # the batch goes on without the missing file
    logs = [e.message for e in instance.all_logs(result.run_id) if e.level >= 40]
    assert any("beta.txt" in m and "no longer exists" in m for m in logs)
    vectors, _ = stores(home)
    assert vectors.count("sources") == 3


def test_single_bad_document_run_fails_with_its_message(tmp_path, home, instance):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "bad.txt").write_bytes(b"\xff\xfe\x00garbage")
    report = ingest_folder(folder, instance, home=str(home), progress=False)
    [run] = instance.get_runs()
    assert run.is_failure
    assert "bad.txt" in next(iter(report.failed.values()))


def test_batches_cover_only_targeted_partitions(tiny_corpus, home, instance):
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    (tiny_corpus / "delta.md").write_text("# Delta\n\nDelta is new.\n")
    (tiny_corpus / "alpha.md").write_text("# Alpha\n\nAlpha changed its name.\n")
    ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    covered = run_partition_keys(instance)
    assert len(covered[0]) == 4
    later = sorted(k for run in covered[1:] for k in run)
    assert len(later) == 2 and later[0].startswith("alpha.md-") and later[1].startswith("delta.md-")


@pytest.mark.subprocess
@pytest.mark.ingest
def test_fifty_megabyte_file_is_indexed_in_bounded_memory(tmp_path):
    """Runs in a subprocess so its peak RSS is its own."""
    folder = tmp_path / "inbox"
    folder.mkdir()
    paragraph = ("The vessel Nordlys Spirit completed repairs at the Fosna yard under contract HM-2023-07. " * 6)
    with open(folder / "huge.txt", "w") as handle:
        written, i = 0, 0
        while written < 50 * 1024 * 1024:
            line = f"{paragraph} Section {i % 50}.\n\n"
            handle.write(line)
            written += len(line)
            i += 1
    (folder / "small.md").write_text("# Small\n\nA small file next to a huge one.\n")
    script = f"""
import resource, dagster as dg
from lexgraph.extract.embedder import Embedder
Embedder.shared().embed(["warm up"])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from orchestration.runner import ingest_folder
from lexgraph.storage.vector_store import VectorStore
from lexgraph.settings import Settings
with dg.DagsterInstance.ephemeral() as inst:
    report = ingest_folder({str(folder)!r}, inst, home={str(tmp_path / 'index')!r}, progress=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store = VectorStore(Settings.from_env(home={str(tmp_path / 'index')!r}).lance_uri)
print(report.failed, store.count("sources"), store.count("chunks"), (peak - base) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    failed, sources, chunks, growth_mb = out.stdout.strip().splitlines()[-1].rsplit(" ", 3)
    assert failed == "{}" and int(sources) == 2
    assert int(chunks) > 20_000
    # The corpus steps hold every chunk's vector, KNN lists and keyword words at once: this file is ~96k chunks
    # (a 550-byte paragraph each), about the bench's 100k-chunk index (peak 2.1 GB in docs/BENCHMARKS.md). Measured
    # growth 2.1-2.2 GB alone and under load; the 1.5 GB set at 40k chunks no longer fits.
    assert int(growth_mb) < 2600, f"peak memory grew by {growth_mb} MB for a 50 MB file of {chunks} chunks"


def _large_file(path: Path, size: int = 1_000_000, distinct: int = 37) -> Path:
    """About `size` bytes of text: a cycle of `distinct` one-sentence paragraphs. The embedder embeds a
    repeated text once, so the model's work stays small (a few batches of distinct chunks: 201 paragraphs
    cost this test 45 s of its 54 s in the embedder) while chunking, loading and the progress bar see a 1 MB
    document of ~800 chunks."""
    rng = random.Random(1)
    words = ("vessel contract repair yard engine delivery harbour crane arbitration award board minutes "
             "shipping freight charter hull survey inspection invoice payment schedule clause cargo berth").split()
    paragraphs = [" ".join(rng.choice(words) for _ in range(80)).capitalize() + f" under clause {i}.\n\n"
                  for i in range(distinct)]
    parts, written = ["# Large\n\n"], 0
    while written < size:
        parts.append(paragraphs[len(parts) % len(paragraphs)])
        written += len(parts[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts))
    return path


def _bar_states(stderr: str, stage: str, unit: str) -> list[tuple[int, int]]:
    """(done, total) of each state of a stage the progress bar printed."""
    found = re.findall(rf"{stage} ([\d,]+)/([\d,]+) {unit}", stderr)
    return list(dict.fromkeys((int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in found))


@pytest.mark.ingest
def test_a_single_large_file_shows_progress_within_its_run(tmp_path, home, embedder, capsys):
    from orchestration.cli import main

    folder = tmp_path / "inbox"
    _large_file(folder / "large.md")
    capsys.readouterr()
    assert main(["--home", str(home), "ingest", str(folder)]) == 0
    err = capsys.readouterr().err
    assert "chunking 1/1 documents" in err
    embedding = _bar_states(err, "embedding", "chunks")
    keywords = _bar_states(err, "keywords", "sentences")
    total = embedding[0][1]
    assert total > 500 and embedding[0] == (0, total)
    # The bar moves per embedded batch inside the one document's run, not once when the run ends.
    between = [s for s in embedding + keywords if 0 < s[0] < s[1]]
    assert len(between) >= 3 and any(0 < done < total for done, _ in embedding), err[-2000:]
    assert "graph 0/1 documents" in err and "corpus index" in err


def test_the_bar_shows_each_stage_finished_however_fast_it_ran(capsys):
    from orchestration.runner import StageBar

    bar = StageBar(runs=1)
    bar.start("reading", 1, "documents")
    bar.advance("reading", 1)
    bar.start("embedding", 798, "chunks")
    bar.advance("embedding", 202)  # within tqdm's 0.2 s of the stage's first state: not drawn by itself
    bar.advance("embedding", 596)
    bar.start("keywords", 5, "sentences")
    bar.close()
    err = capsys.readouterr().err
    assert "reading 1/1 documents" in err and "embedding 798/798 chunks" in err, err


@pytest.mark.ingest
def test_quiet_ingest_prints_nothing_on_stderr(tiny_corpus, home, embedder, capfd):
    from orchestration.cli import main

    capfd.readouterr()
    assert main(["--home", str(home), "ingest", "--quiet", str(tiny_corpus)]) == 0
    out, err = capfd.readouterr()
    assert "4 new" in out
    assert err == ""


def test_the_corpus_run_opens_the_graph_for_writing_once_for_all_its_graph_steps(tiny_corpus, home, instance,
                                                                                 monkeypatch):
    from lexgraph.storage import graph_store

    opened = []
    real_init = graph_store.GraphStore.__init__

    def counting_init(self, path, writable=False):  # a spy on the real open: Kùzu still runs
        opened.append(writable)
        real_init(self, path, writable)

    monkeypatch.setattr(graph_store.GraphStore, "__init__", counting_init)
    report = ingest_folder(tiny_corpus, instance, home=str(home), progress=False)
    # one writer for the document run's graph step, one shared by the corpus run's four graph-writing steps
    assert report.corpus_index_ok and len(report.runs) == 1 and opened == [True, True]
    monkeypatch.undo()
    chunks = stores(home)[0].count("chunks")
    counts = graph_counts(home, ("Chunk", "SIMILAR"))  # what the shared writer wrote is on disk after the run
    assert counts["Chunk"] == chunks and counts["SIMILAR"] > 0
