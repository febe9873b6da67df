"""The `lexgraph` CLI end to end on the bundled sample corpus (plus one slide deck, for page citations)."""
import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from orchestration.cli import main
from tests.conftest import copy_corpus

# "1. kestrel-propulsion-profile.md [chars 1163–1517]  score=0.734  Supplier Profile > Management"
HIT = re.compile(r"^(?P<rank>\d+)\. (?P<file>.+?)(?: (?P<pages>pp?\. [\d–]+))? \[chars (?P<start>\d+)[–-](?P<end>\d+)\]"
                 r"  score=(?P<score>-?[\d.]+)(?:  (?P<heading>.*))?$")


def write_deck(path):
    """A two-slide PowerPoint deck whose second slide names the Kestrel service engineer."""
    from pptx import Presentation

    deck = Presentation()
    for title, body in [("Fleet overview", "Nordlys Spirit and Nordkapp Vega sail the Bergen route."),
                        ("Engine service", "Kestrel's service engineer for the fleet is Tomasz Wielgus.")]:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    deck.save(path)


@pytest.fixture(scope="module")
def indexed_sample(tmp_path_factory, sample_home):
    """The session's sample index, copied, with the deck added by `lexgraph ingest` (documents are keyed by
    their path in the folder, so a copy of the corpus is the same corpus): one new document through the CLI,
    not a second build of the whole corpus."""
    root = tmp_path_factory.mktemp("cli")
    corpus = copy_corpus(root / "corpus")
    write_deck(corpus / "service deck.pptx")
    home = root / "index"
    shutil.copytree(sample_home, home)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["--home", str(home), "ingest", str(corpus), "--quiet", "--strict"]) == 0
    assert f"1 new, 0 changed, {len(list(corpus.iterdir())) - 1} unchanged, 0 removed, 0 failed" in out.getvalue()
    return corpus, home


def hits(out: str) -> list[re.Match]:
    lines = [line for line in out.splitlines() if line[:1].isdigit()]
    matches = [HIT.match(line) for line in lines]
    assert all(matches), lines
    return matches


def test_ingest_reports_and_status_counts(indexed_sample, capsys):
    corpus, home = indexed_sample
    n_files = len(list(corpus.iterdir()))
    assert main(["--home", str(home), "ingest", str(corpus), "--quiet"]) == 0
    assert f"0 new, 0 changed, {n_files} unchanged" in capsys.readouterr().out
    assert main(["--home", str(home), "status"]) == 0
    out = capsys.readouterr().out
    assert f"lancedb sources: {n_files}" in out
    assert "board minutes 2024-03.md" in out
    chunks = int(out.split("chunks: ")[1].split()[0])
    assert f"kuzu Source: {n_files}  Chunk: {chunks}" in out
    assert "other index versions" not in out


def test_status_names_an_index_of_another_version_left_beside_this_one(tmp_path, capsys):
    from lexgraph.settings import Settings

    home = tmp_path / "home"
    settings = Settings.from_env(home=home)
    old = Path(settings.index_dir).parent / "v0123abcd"  # an index built before a chunker or model change
    old.mkdir(parents=True)
    (old.parent / "notes").mkdir()  # not an index version
    assert main(["--home", str(home), "status"]) == 0
    out = capsys.readouterr().out
    assert "other index versions in this collection, not read" in out and out.count("v0123abcd") == 1
    assert "notes" not in out and "lancedb sources: 0" in out


def test_offline_lexical_graph_on_the_sample_corpus(indexed_sample, capsys):
    """With no LLM configured, every chunk of the sample corpus is extracted by the offline NLP extractor into the lexical
    graph: statements, topics, facts and entities, with provenance, resolved across documents, and no LLM call."""
    import polars as pl

    from lexgraph.settings import Settings
    from lexgraph.storage.graph_store import GraphStore

    corpus, home = indexed_sample
    assert main(["--home", str(home), "status"]) == 0
    out = capsys.readouterr().out
    counts = {name: int(n) for name, n in re.findall(r"(Statement|Topic|Fact|Entity): (\d+)", out)}
    assert set(counts) == {"Statement", "Topic", "Fact", "Entity"} and min(counts.values()) > 0, out
    assert "extractor: nlp" in out and "LLM calls so far: 0 (0 cache hits" in out
    assert re.search(r"skeleton: \d+ of \d+ chunks selected", out)
    settings = Settings.from_env(home=home)
    graph = GraphStore(settings.graph_path)
    try:
        assert set(graph.query("MATCH (s:Statement) RETURN DISTINCT s.extractor AS e")["e"]) == {"nlp"}
        kestrel = graph.query("MATCH (e:Entity)-[:MENTIONED_IN]->(c:Chunk)-[:PART_OF]->(s:Source) "
                              "WHERE e.name STARTS WITH 'Kestrel Propulsion' "
                              "RETURN e.id AS id, count(DISTINCT s.id) AS sources")
        assert kestrel.height == 1 and kestrel["sources"][0] > 1  # one entity across documents
        # every statement leads back to its chunk and source; every fact to a statement
        assert graph.query("MATCH (s:Statement)-[:EXTRACTED_FROM]->(:Chunk)-[:PART_OF]->(:Source) "
                           "RETURN count(s) AS n")["n"][0] == counts["Statement"]
        assert graph.query("MATCH (f:Fact)-[:SUPPORTS]->(:Statement) RETURN count(DISTINCT f) AS n")["n"][0] == \
            counts["Fact"]
    finally:
        graph.close()
    extractions = pl.read_parquet(settings.extract_dir / "extractions" / "*.parquet")
    assert set(extractions["extractor"]) == {"nlp"} and set(extractions["outcome"]) == {"ok"}
    assert main(["--home", str(home), "cost"]) == 0
    stages = {line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]}
    assert {"embedding", "keywords", "statement_embedding", "entity_embedding"} <= stages
    assert "extraction" not in stages  # no LLM, no extraction calls


def test_search_names_file_and_span(indexed_sample, capsys):
    corpus, home = indexed_sample
    assert main(["--home", str(home), "search", "Who is the chief executive of Kestrel Propulsion?", "-k", "3"]) == 0
    found = hits(capsys.readouterr().out)
    assert len(found) == 3
    profile = [h for h in found if h["file"] == "kestrel-propulsion-profile.md"]
    assert profile
    text = (corpus / "kestrel-propulsion-profile.md").read_text()
    assert any("Annika Vogt" in text[int(h["start"]):int(h["end"])] for h in profile)
    # the heading path is that of the passage: each part is a heading of the file
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    for hit in profile:
        assert hit["heading"] and set(hit["heading"].split(" > ")) <= headings, hit["heading"]


@pytest.mark.parametrize("method", ["dense", "bm25", "keyword", "hybrid"])
def test_every_method_gives_cited_hits(indexed_sample, capsys, method):
    corpus, home = indexed_sample
    assert main(["--home", str(home), "search", "Kestrel service engineer for the fleet", "-k", "4",
                 "--method", method]) == 0
    found = hits(capsys.readouterr().out)
    assert 1 <= len(found) <= 4
    assert [int(h["rank"]) for h in found] == list(range(1, len(found) + 1))
    for hit in found:
        assert (corpus / hit["file"]).exists()
        assert 0 <= int(hit["start"]) < int(hit["end"])


def test_hit_on_a_slide_names_its_page(indexed_sample, capsys):
    corpus, home = indexed_sample
    assert main(["--home", str(home), "search", "Tomasz Wielgus Kestrel service engineer", "-k", "10",
                 "--method", "bm25"]) == 0
    deck = [h for h in hits(capsys.readouterr().out) if h["file"] == "service deck.pptx"]
    assert deck and deck[0]["pages"] == "p. 2", deck


def test_a_long_query_is_searched_not_refused(indexed_sample, embedder, capsys):
    corpus, home = indexed_sample
    query = " ".join((corpus / "group-annual-review-2023.md").read_text().split())
    while embedder.count_tokens([query])[0] < 2000:
        query += " " + query
    assert main(["--home", str(home), "search", query, "-k", "2", "--method", "dense"]) == 0
    assert len(hits(capsys.readouterr().out)) == 2


@pytest.mark.parametrize("k", ["0", "-1", "two"])
def test_k_below_one_is_refused(tmp_path, capsys, k):
    with pytest.raises(SystemExit) as stop:
        main(["--home", str(tmp_path / "i"), "search", "anything", "-k", k])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "-k" in err and ("at least 1" in err or "whole number" in err)


@pytest.mark.parametrize("query", ["", "   \t "])
def test_blank_query_is_refused(tmp_path, capsys, query):
    assert main(["--home", str(tmp_path / "i"), "search", query]) == 2
    assert "the query is empty" in capsys.readouterr().err


def test_unknown_method_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--home", str(tmp_path / "i"), "search", "x", "--method", "fuzzy"])
    assert stop.value.code == 2
    assert "invalid choice: 'fuzzy'" in capsys.readouterr().err


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["--home", str(tmp_path / "i"), "ingest", str(tmp_path / "missing")]) == 2
    assert "missing: not a folder" in capsys.readouterr().err
    assert main(["--home", str(tmp_path / "i"), "search", "anything"]) == 2
    err = capsys.readouterr().err
    assert f"the index {tmp_path / 'i'}" in err and "is empty" in err and "lexgraph ingest" in err


@pytest.mark.parametrize("path", ["", "  "])
def test_empty_ingest_path_is_refused(tmp_path, monkeypatch, capsys, path):
    monkeypatch.chdir(tmp_path)  # were it read as ".", this folder would be indexed
    (tmp_path / "note.md").write_text("# Note\n\nMust not be indexed.\n")
    assert main(["--home", str(tmp_path / "i"), "ingest", path, "--quiet"]) == 2
    assert "PATH is empty" in capsys.readouterr().err
    assert not (tmp_path / "i").exists()


@pytest.mark.parametrize("command", [["status"], ["search", "anything"], ["ingest", "."]])
def test_home_that_is_a_file_is_a_clear_error(tmp_path, monkeypatch, capsys, command):
    home = tmp_path / "index.txt"
    home.write_text("not a folder\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LEXGRAPH_HOME", str(home))
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"LEXGRAPH_HOME={home}" in err and "is a file" in err
    assert home.read_text() == "not a folder\n"


@pytest.mark.ingest
def test_strict_ingest_fails_on_bad_file(tmp_path, capsys):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "ok.md").write_text("# Ok\n\nFine.\n")
    (folder / "broken.txt").write_bytes(b"\xc3\x28 invalid")
    assert main(["--home", str(tmp_path / "i"), "ingest", str(folder), "--quiet", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "broken.txt: file is not valid UTF-8" in out


@pytest.mark.subprocess
def test_the_cli_pauses_the_collector_only_for_its_imports_and_freezes_before_teardown():
    """Importing orchestration.cli leaves the collector as it found it (tests and scripts import it); the
    console script's command runs with it on, and its objects are frozen only once the command is done."""
    import subprocess
    import sys

    script = (
        "import gc, sys\n"
        "gc.disable()\n"
        "import orchestration.cli as c\n"
        "assert not gc.isenabled(), 'import turned the collector on'\n"
        "gc.enable()\n"
        "with c._collector_paused():\n"
        "    assert not gc.isenabled()\n"
        "assert gc.isenabled(), 'not restored'\n"
        "try:\n"
        "    with c._collector_paused():\n"
        "        raise ImportError('x')\n"
        "except ImportError:\n"
        "    pass\n"
        "assert gc.isenabled(), 'not restored after a failed import'\n"
        "seen = {}\n"
        "c.main = lambda argv=None: seen.update(on=gc.isenabled(), frozen=gc.get_freeze_count()) or 3\n"
        "code = c.run()\n"
        "assert seen == {'on': True, 'frozen': 0}, seen\n"
        "assert gc.get_freeze_count() > 0\n"
        "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
