"""The `lexgraph` CLI end to end on the bundled sample corpus."""
import pytest

from orchestration.cli import main
from tests.conftest import copy_corpus


@pytest.fixture(scope="module")
def indexed_sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    corpus = copy_corpus(root / "corpus")
    home = root / "index"
    assert main(["--home", str(home), "ingest", str(corpus), "--quiet", "--strict"]) == 0
    return corpus, home


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


def test_search_names_file_and_span(indexed_sample, capsys):
    corpus, home = indexed_sample
    assert main(["--home", str(home), "search", "Who is the chief executive of Kestrel Propulsion?", "-k", "3"]) == 0
    out = capsys.readouterr().out
    hits = [line for line in out.splitlines() if line[:1].isdigit()]
    assert len(hits) == 3
    profile = [h for h in hits if " kestrel-propulsion-profile.md [chars " in h]
    assert profile, out
    spans = [tuple(map(int, h.split("[chars ")[1].split("]")[0].split("-"))) for h in profile]
    text = (corpus / "kestrel-propulsion-profile.md").read_text()
    assert any("Annika Vogt" in text[start:end] for start, end in spans)


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["--home", str(tmp_path / "i"), "ingest", str(tmp_path / "missing")]) == 2
    assert "missing: not a folder" in capsys.readouterr().err
    assert main(["--home", str(tmp_path / "i"), "search", "anything"]) == 2
    assert "index is empty" in capsys.readouterr().err


def test_strict_ingest_fails_on_bad_file(tmp_path, capsys):
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "ok.md").write_text("# Ok\n\nFine.\n")
    (folder / "broken.txt").write_bytes(b"\xc3\x28 invalid")
    assert main(["--home", str(tmp_path / "i"), "ingest", str(folder), "--quiet", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "broken.txt: file is not valid UTF-8" in out
