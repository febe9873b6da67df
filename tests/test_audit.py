"""`lexgraph audit QUERY_ID [--out FILE.html|.json]`: one self-contained file per answer, with the same content
as GET /provenance/{query_id}. A question is asked over the session's sample index, then the bundle is written
by the command (in process) and read back."""
import html
import json
import re

import pytest
from fastapi.testclient import TestClient

from lexgraph.cli import main as lexgraph
from lexgraph.extract.source_texts import source_span
from lexgraph.query.audit import AuditError, write_audit_bundle
from lexgraph.query.http_api import create_app
from lexgraph.query.service import UnknownQueryError
from lexgraph.settings import Settings
from lexgraph.storage.extract_store import ExtractStore

QUESTION = "Since when has Dr. Annika Vogt been CEO of Kestrel?"


@pytest.fixture(scope="module")
def answered(service):
    result = service.ask(QUESTION, "semantic")
    assert result["citations"] and not result["abstained"]
    return result


def audit(sample_home, *args) -> int:
    return lexgraph(["--home", str(sample_home), "audit", *args])


def test_the_html_bundle_marks_each_cited_span_in_its_source_with_its_provenance(sample_home, service, answered,
                                                                                   tmp_path, capsys):
    out = tmp_path / "bundle.html"
    assert audit(sample_home, answered["query_id"], "--out", str(out)) == 0
    assert capsys.readouterr().out.strip() == str(out)
    page = out.read_text(encoding="utf-8")
    record = service.provenance(answered["query_id"])
    store = ExtractStore(service.settings.extract_dir)
    marks = [html.unescape(m) for m in re.findall(r"<mark>(.*?)</mark>", page, re.S)]
    assert len(marks) == len(record["citations"])
    for cited, marked in zip(record["citations"], marks):
        # the marked text is exactly the cited span of the stored source version
        assert marked == cited["text"] == source_span(store, cited["source_sha256"], cited["char_start"],
                                                      cited["char_end"])
        assert html.escape(cited["context_before"][-40:]) in page and cited["source_sha256"] in page
        assert cited["extractor"] == "nlp" and cited["model"] and cited["prompt_version"]
        for value in (cited["extractor"], cited["model"], cited["prompt_version"], cited["statement_id"]):
            assert html.escape(str(value)) in page
    assert html.escape(QUESTION) in page and html.escape(answered["answer"][:60]) in page
    index = record["index"]
    assert index["index_version"] and index["lexgraph_version"]
    assert index["index_version"] in page and html.escape(index["lexgraph_version"]) in page
    assert html.escape(record["log"]["reason"][:60]) in page and "semantic" in page  # the route and its log line


def test_the_html_bundle_loads_nothing_and_runs_nothing(sample_home, answered, tmp_path):
    out = tmp_path / "offline.html"
    assert audit(sample_home, answered["query_id"], "--out", str(out)) == 0
    page = out.read_text(encoding="utf-8").lower()
    assert "<script" not in page and "<iframe" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "url(" not in page and "@import" not in page
    assert "default-src 'none'" in page  # the page's own CSP forbids loading anything


def test_the_json_bundle_is_the_http_provenance_json(sample_home, service, answered, tmp_path, capsys):
    out = tmp_path / "bundle.json"
    assert audit(sample_home, answered["query_id"], "--out", str(out)) == 0
    assert capsys.readouterr().out.strip() == str(out)
    with TestClient(create_app(service)) as client:
        served = client.get(f"/provenance/{answered['query_id']}", headers={"Accept": "application/json"})
        page = client.get(f"/provenance/{answered['query_id']}", headers={"Accept": "text/html"})
    assert served.status_code == 200 and json.loads(out.read_text(encoding="utf-8")) == served.json()
    # and the HTML bundle is the page the endpoint serves to a browser
    html_out = write_audit_bundle(service, answered["query_id"], tmp_path / "same.html")
    assert page.status_code == 200 and html_out.read_text(encoding="utf-8") == page.text


def test_without_out_the_bundle_goes_under_the_index_home(sample_home, answered, capsys):
    assert audit(sample_home, answered["query_id"]) == 0
    written = capsys.readouterr().out.strip()
    assert written == str(sample_home / "queries" / "audit" / f"{answered['query_id']}.html")
    assert "<mark>" in open(written, encoding="utf-8").read()


def test_an_unknown_query_id_fails_clearly_and_writes_nothing(sample_home, tmp_path, capsys):
    for bad in ("q20000101000000-0000000000", "../../etc/passwd", ""):
        out = tmp_path / "never.html"
        assert audit(sample_home, bad, "--out", str(out)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: no question with id") and "lexgraph ask" in err
        assert not out.exists() and not list(tmp_path.iterdir())
    with pytest.raises(UnknownQueryError):
        write_audit_bundle(Settings.from_env(home=sample_home), "q-unknown", tmp_path / "x.json")


def test_a_bad_out_suffix_fails_clearly(sample_home, answered, tmp_path, capsys):
    for name in ("bundle.txt", "bundle", "bundle.html.bak"):
        assert audit(sample_home, answered["query_id"], "--out", str(tmp_path / name)) == 2
        assert "written as .html or .json" in capsys.readouterr().err
    folder = tmp_path / "folder.html"
    folder.mkdir()
    assert audit(sample_home, answered["query_id"], "--out", str(folder)) == 2
    assert "is a folder" in capsys.readouterr().err
    with pytest.raises(AuditError):
        write_audit_bundle(Settings.from_env(home=sample_home), answered["query_id"], tmp_path / "x.pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.html"]
