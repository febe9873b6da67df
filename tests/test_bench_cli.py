"""`lexgraph bench` end to end on the bundled sample corpus: a real Dagster ingest into LanceDB and
Kùzu, every retrieval method, both question formats, and the cached index reused on a re-run."""
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from lexgraph.evaluation import bench
from lexgraph.evaluation import corpus as corpus_mod
from orchestration.cli import main
from tests.conftest import ROOT, copy_corpus

QUESTIONS = ROOT / "sample" / "questions.json"


EXTRA_DOCUMENT = """# Canteen menu, September 2024

The Bergen office canteen serves fish soup on Mondays and a vegetarian lasagne on Thursdays.
Coffee is free before nine; the salad bar closes at two in the afternoon.
"""


@pytest.fixture(scope="module")
def benched(tmp_path_factory, sample_home):
    """One indexed sample corpus shared by the tests. The bench's index starts as a copy of the session's
    sample index (documents are keyed by their path in the folder, so a copy of the corpus is the same
    corpus) and the corpus gets one unrelated document: the bench still runs a real Dagster ingest, of one
    new document, instead of a second build of the whole sample."""
    root = tmp_path_factory.mktemp("bench")
    corpus = copy_corpus(root / "corpus")
    (corpus / "canteen-menu-2024-09.md").write_text(EXTRA_DOCUMENT)
    home, out = root / "home", root / "out"
    shutil.copytree(sample_home, bench.prepare_corpus(corpus, home).index_home)
    code = main(["--home", str(home), "bench", "--corpus", str(corpus), "--questions", str(QUESTIONS),
                 "--out", str(out), "--quiet"])
    assert code == 0
    return corpus, home, out


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(map(str, args)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_has_every_method_and_type(benched):
    corpus, home, out = benched
    data = json.loads((out / "report.json").read_text())
    assert set(data["summary"]) == set(bench.BENCH_METHODS) >= {"dense", "bm25", "keyword", "hybrid", "statement",
                                                                 "entity", "auto", "answer"}
    answers = data["summary"]["answer"]["overall"]["answers"]  # the extractive answerer's own figures
    assert answers["answerable"] == 19 and answers["null"] == 3 and 0 <= answers["citation_precision"] <= 1
    assert sum(data["summary"]["auto"]["overall"]["routes"].values()) == 22
    for method, groups in data["summary"].items():
        assert set(groups) == {"Single", "Multi", "Null", "overall"}, method
        assert groups["Single"]["questions"] == 12 and groups["Null"]["recall"]["5"] is None
        assert groups["overall"]["latency_ms_p95"] >= groups["overall"]["latency_ms_p50"] > 0
    assert data["questions"]["unmatched_evidence_ids"] == []  # every evidence id names a sample file
    assert data["index"]["size_bytes"]["total"] > 0 and data["index"]["cost"]["llm_calls"] == 0
    built = data["index"]["build_this_run"]
    assert (built["new"], built["changed"], built["unchanged"]) == (1, 0, len(list(corpus.iterdir())) - 1)
    assert built["dagster_runs"] == 2 and built["embedding_tokens"] > 0  # the new document's run, the corpus run
    cost = data["index"]["cost"]  # the ledger holds the copied sample build too; the bench's history only its own
    assert sum(cost["embedding_tokens_by_stage"].values()) > cost["chunk_embedding_tokens"] > 0
    assert cost["embedding_tokens"] == built["embedding_tokens"] and cost["builds"] == 1
    # the sample questions are easy: the best method finds most evidence in the top 5 documents
    assert max(g["Single"]["recall"]["5"] for g in data["summary"].values()) >= 0.9
    markdown = (out / "report.md").read_text()
    assert "| hybrid | Multi | 7 |" in markdown and "Null questions" in markdown
    assert (out / "recall_at_k.svg").read_text().startswith("<svg")
    hit = data["per_question"][0]
    assert hit["documents"] and set(hit["recall"]) == {"1", "3", "5", "10"}


def test_rerun_reuses_the_index_without_embedding(benched, capsys):
    corpus, home, out = benched
    from lexgraph.indexing.corpus_state import CorpusFiles
    from lexgraph.settings import Settings

    files = CorpusFiles(Settings.from_env(home=bench.prepare_corpus(corpus, home).index_home).index_dir)
    shutil.rmtree(files.root)  # as if the first run had stopped before the corpus-wide assets
    code, stdout, stderr = _run(capsys, "--home", home, "bench", "--corpus", corpus, "--questions", QUESTIONS,
                                "--out", out, "--k", "1,5", "--budget", "300", "--methods", "bm25,hybrid",
                                "--param", "decompose=false", "--param", "fusion_weights=dense:0,bm25:1,keyword:0.5", "--quiet")
    assert code == 0, stderr
    assert f"0 new, 0 changed, {len(list(corpus.iterdir()))} unchanged" in stdout
    assert "| method | type | n | R@1 | R@5 | all@5 | cov@300 |" in stdout
    data = json.loads((out / "report.json").read_text())
    assert data["settings"]["retrieval"]["decompose"] is False
    assert data["settings"]["retrieval"]["fusion_weights"] == [["dense", 0.0], ["bm25", 1.0], ["keyword", 0.5]]
    assert data["index"]["build_this_run"]["embedding_tokens"] == 0
    assert data["index"]["build_this_run"]["dagster_runs"] == 1 and files.keyword_index.exists()
    assert data["index"]["cost"]["builds"] == 1  # the first build's cost is still reported


def test_list_format_questions(benched, tmp_path, capsys):
    corpus, home, _ = benched
    records = json.loads(QUESTIONS.read_text())
    listed = [{"id": f"q{i}", "question": r["question"], "answer": r["answer"]} for i, r in records.items()]
    path = tmp_path / "list.json"
    path.write_text(json.dumps(listed))
    code, stdout, _ = _run(capsys, "--home", home, "bench", "--corpus", corpus, "--questions", path,
                           "--out", tmp_path / "out", "--methods", "hybrid", "--quiet")
    assert code == 0
    summary = json.loads((tmp_path / "out" / "report.json").read_text())["summary"]["hybrid"]
    assert summary["Other"]["questions"] == 19 and summary["Null"]["questions"] == 3
    assert summary["Other"]["recall"]["5"] is None  # no evidence given, no recall claimed
    assert summary["Other"]["coverage"] is not None
    assert "| hybrid | Other | 19 |" in stdout


def test_missing_corpus_and_bad_questions_exit_2(benched, tmp_path, capsys):
    corpus, home, _ = benched
    code, _, err = _run(capsys, "--home", tmp_path / "h", "bench", "--corpus", tmp_path / "nope",
                        "--questions", QUESTIONS)
    assert code == 2 and "nope: corpus not found" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": {"question": "q?"}}')
    code, _, err = _run(capsys, "--home", home, "bench", "--corpus", corpus, "--questions", bad)
    assert code == 2 and f"{bad}: question '0' has no 'answer' string" in err
    code, _, err = _run(capsys, "--home", home, "bench", "--corpus", corpus, "--questions", QUESTIONS, "--k", "a")
    assert code == 2 and "--k must be comma-separated integers" in err
    code, _, err = _run(capsys, "--home", home, "bench", "--corpus", corpus, "--questions", QUESTIONS,
                        "--param", "nope=1")
    assert code == 2 and "expected NAME=VALUE" in err


def test_zip_is_extracted_once_and_safely(tmp_path):
    archive = tmp_path / "docs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("World/week1/20260121_1000.txt", "Time: 20260121_10:00\nA: hi\n")
        z.writestr("World/.hidden", "x")
    first = bench.prepare_corpus(archive, tmp_path / "cache")
    assert (first.kind, first.folder.name) == ("zip", "corpus")
    assert (first.folder / "World" / "week1" / "20260121_1000.txt").exists()
    assert not (first.folder / "World" / ".hidden").exists()
    marker = first.folder / ".complete"
    stamp = marker.stat().st_mtime_ns
    again = bench.prepare_corpus(archive, tmp_path / "cache")
    assert again.home == first.home and marker.stat().st_mtime_ns == stamp  # not extracted twice
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../outside.txt", "x")
    with pytest.raises(bench.BenchError, match="points outside the archive"):
        bench.prepare_corpus(evil, tmp_path / "cache")


def test_one_large_file_is_split_into_parts(tmp_path):
    big = tmp_path / "book.md"
    paragraphs = [f"Paragraph {i} " + "word " * 150 for i in range(12)]
    big.write_text("# Part one\n\n" + "\n\n".join(paragraphs[:6]) + "\n\n## Part two\n\n" + "\n\n".join(paragraphs[6:]))
    parts = corpus_mod.split_text_file(big, limit=2000)
    assert all(name.startswith("book-part-") and name.endswith(".md") for name, _ in parts)
    assert all(len(text) <= 2000 + 200 for _, text in parts)
    assert any(text.startswith("## Part two") for _, text in parts)  # a level-2 heading opens a part
    joined = " ".join(text for _, text in parts)
    assert all(f"Paragraph {i} " in joined for i in range(12))
    prepared = bench.prepare_corpus(big, tmp_path / "cache")
    assert prepared.kind == "file" and len(list(prepared.folder.glob("book-part-*.md"))) == len(corpus_mod.split_text_file(big))


def test_benchmark_asset_materializes_on_the_indexed_inbox(benched, tmp_path):
    """The Dagster asset over the same index, with its Markdown table and plot in the metadata."""
    import dagster as dg

    from assets.bench import retrieval_benchmark
    from lexgraph.settings import Settings
    from resources import IndexResource, InboxResource

    corpus, home, _ = benched
    index_home = bench.prepare_corpus(corpus, home).index_home
    result = dg.materialize(
        [retrieval_benchmark],
        resources={"index": IndexResource.from_settings(Settings.from_env(home=index_home)),
                   "inbox": InboxResource(path=str(corpus))},
        run_config={"ops": {"retrieval_benchmark": {"config": {"questions": str(QUESTIONS),
                                                               "out_dir": str(tmp_path / "asset")}}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("retrieval_benchmark")[0].metadata
    assert "| hybrid | Single | 12 |" in metadata["table"].value
    assert "| bm25 | 5 |" in metadata["recall_at_k"].value
    assert Path(metadata["recall_plot"].value).exists() and metadata["questions"].value == 22
