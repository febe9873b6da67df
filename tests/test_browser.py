"""What an auditor sees, in a real browser: Debian's headless Chromium driven by Playwright for Python
(`executable_path`, never a downloaded browser).

- the provenance page of an answer (`lexgraph serve`'s FastAPI app under uvicorn, over the session's sample
  index): the answer, the cited span highlighted (<mark>), the model and prompt version of the cited statement;
- the audit bundle (`lexgraph audit QUERY_ID --out FILE.html`) opened from disk with the network cut off;
- the Dagster webserver over an instance that has ingested a tiny corpus: the global asset lineage shows the
  lineage assets, and a partition's page shows that document's own metadata (its sha256).

With LEXGRAPH_SCREENSHOTS=docs/screenshots (a folder; relative to the checkout) each test saves its page there
(provenance.png, audit_bundle.png, asset_graph.png, partition.png); without it nothing is written. Without
Chromium the tests skip, except under CI (CI=true), where they fail.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.subprocess  # Chromium, and the Dagster UI in a process of its own

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}
QUESTION = "Who is the CEO of the engine supplier Kestrel?"
# The lineage an auditor follows: Source → Chunk → Statement → Topic / Fact / Entity, and KNN → PageRank → skeleton.
LINEAGE_ASSETS = ["inbox", "source_document", "document_chunks", "chunk_vectors", "document_graph",
                  "document_keywords", "chunk_extractions", "document_statements", "document_topics",
                  "document_facts", "document_entities", "lexical_graph", "chunk_knn_graph", "chunk_pagerank",
                  "skeleton_selection", "keyword_index"]
# The tiny corpus of tests/conftest.py, for the module's one Dagster instance.
TINY_CORPUS = {
    "alpha.md": "# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n## Terms\n\nDelivery is due in "
                "May 2024 at Bergen.\n",
    "beta.txt": "Bolt Engines is run by Dana Frost.\n\nIts plant is in Kiel.\n",
    "gamma.md": "# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n",
    "Søren notes: 2024.md": "# Notes\n\nSøren Åberg chairs the board of Alpha Shipping.\n",
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _screenshot_dir() -> Path | None:
    folder = os.environ.get("LEXGRAPH_SCREENSHOTS", "").strip()
    if not folder:
        return None
    path = Path(folder) if Path(folder).is_absolute() else ROOT / folder
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page, name: str, **options) -> None:
    folder = _screenshot_dir()
    if folder is not None:
        page.screenshot(path=str(folder / name), **options)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module."""
    problem = None
    if not Path(CHROMIUM).exists():
        problem = f"{CHROMIUM} not found (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = problem or "playwright is not installed"
    if problem:
        if _in_ci():
            pytest.fail(f"the browser tests need Chromium and Playwright in CI: {problem}")
        pytest.skip(problem)
    from playwright.sync_api import expect

    expect.set_options(timeout=30_000)  # a loaded CI machine: pages may take more than the default 5 s
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    try:
        yield context.new_page()
    finally:
        context.close()


# ------------------------------------------------------------------------------------- provenance and audit


@pytest.fixture(scope="module")
def query_server(sample_home):
    """The HTTP API (lexgraph.query.http_api) over the sample index, under uvicorn on 127.0.0.1 in a thread."""
    import uvicorn

    from lexgraph.query.http_api import create_app
    from lexgraph.query.service import QueryService
    from lexgraph.settings import Settings

    service = QueryService(Settings.from_env(home=sample_home))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=300)
    try:
        yield base, client
    finally:
        client.close()
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def answered(query_server) -> dict:
    """One answer with citations, and its provenance record (the JSON of GET /provenance/{id})."""
    _, query_server = query_server
    answer = query_server.post("/ask", json={"question": QUESTION})
    assert answer.status_code == 200, answer.text
    query_id = answer.json()["query_id"]
    record = query_server.get(f"/provenance/{query_id}", headers={"Accept": "application/json"}).json()
    assert record["answer"] and not record["abstained"], record
    cited = [c for c in record["citations"] if c.get("model") and c.get("prompt_version")]
    assert cited, f"no citation names the model and prompt version of its statement: {record['citations']}"
    return record


def _check_provenance_page(page, record: dict) -> None:
    """The answer, every cited span in <mark>, and the model and prompt version of each cited statement."""
    from playwright.sync_api import expect

    expect(page.locator(".question")).to_have_text(record["question"])
    expect(page.locator(".answer")).to_have_text(record["answer"])
    marks = page.locator("mark")
    expect(marks).to_have_count(len(record["citations"]))
    assert [m.strip() for m in marks.all_inner_texts()] == [c["text"].strip() for c in record["citations"]]
    assert marks.first.is_visible()
    background = marks.first.evaluate("m => getComputedStyle(m).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background  # highlighted, not just tagged
    for number, citation in enumerate(record["citations"], 1):
        section = page.locator(f"#citation-{number}")
        for label, key in (("model", "model"), ("prompt version", "prompt_version"), ("source sha256", "source_sha256")):
            row = section.locator("tr").filter(has=page.locator("th", has_text=label)).first
            expect(row.locator("td")).to_have_text(str(citation[key] or "—"))


def test_provenance_page_shows_answer_highlighted_span_model_and_prompt_version(page, query_server, answered):
    url = f"{query_server[0]}/provenance/{answered['query_id']}"
    response = page.goto(url)  # Chromium's own Accept header asks for HTML
    assert response.status == 200 and response.headers["content-type"].startswith("text/html")
    _check_provenance_page(page, answered)
    # the page from the question down to the first citation's model and prompt version
    box = page.locator("#citation-1").bounding_box()
    screenshot(page, "provenance.png", full_page=True,
               clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": box["y"] + box["height"] + 24})


@pytest.fixture(scope="module")
def audit_bundle(answered, sample_home, tmp_path_factory) -> Path:
    """`lexgraph audit QUERY_ID --out FILE.html`, as an auditor runs it."""
    from orchestration.cli import main as lexgraph

    out = tmp_path_factory.mktemp("audit") / "bundle.html"
    assert lexgraph(["--home", str(sample_home), "audit", answered["query_id"], "--out", str(out)]) == 0
    assert out.is_file()
    return out


def test_audit_bundle_opens_offline(browser, audit_bundle, answered):
    context = browser.new_context(viewport=VIEWPORT, offline=True)
    requested: list[str] = []
    context.on("request", lambda request: requested.append(request.url))
    # nothing but the file itself may load; were anything else asked for, it would fail here
    context.route(lambda url: not url.startswith("file:"), lambda route: route.abort())
    try:
        page = context.new_page()
        page.goto(audit_bundle.as_uri())
        _check_provenance_page(page, answered)
        assert requested == [audit_bundle.as_uri()], requested
        screenshot(page, "audit_bundle.png")
    finally:
        context.close()


# ------------------------------------------------------------------------------------------- the Dagster UI


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory, embedder):
    """dagster-webserver on 127.0.0.1 over a DAGSTER_HOME with the dev instance config (orchestration/dagster.yaml),
    whose instance has ingested the tiny corpus through the asset graph. Yields (base URL, index home, inbox)."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from orchestration.runner import ingest_folder

    root = tmp_path_factory.mktemp("dagster_ui")
    dagster_home, home, inbox = root / "dagster_home", root / "index", root / "inbox"
    dagster_home.mkdir()
    shutil.copy(ROOT / "orchestration" / "dagster.yaml", dagster_home / "dagster.yaml")
    # as if an operator had dismissed Dagster's newsletter prompt once: it would cover the page
    (dagster_home / ".nux").mkdir()
    (dagster_home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    for name, text in TINY_CORPUS.items():
        (inbox / name).parent.mkdir(parents=True, exist_ok=True)
        (inbox / name).write_text(text, encoding="utf-8")
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))  # creates the storage
    port, log = _free_port(), root / "webserver.log"
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "LEXGRAPH_HOME": str(home),
           "LEXGRAPH_INBOX": str(inbox), "HF_HUB_OFFLINE": "1"}
    with log.open("w") as out:  # started first: it loads the code location while the corpus is ingested
        server = subprocess.Popen([str(Path(sys.executable).parent / "dagster-webserver"), "-h", "127.0.0.1",
                                   "-p", str(port), "-w", str(ROOT / "workspace.yaml")], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with instance:
            report = ingest_folder(inbox, instance, home=str(home), progress=False)
        assert report.corpus_index_ok and not report.failed, report.failed
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"dagster-webserver exited:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{base}/server_info", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"dagster-webserver did not come up:\n{log.read_text()[-3000:]}"
            time.sleep(0.25)
        yield base, home, inbox
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the webserver and its code server
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _shown_as(name: str, label: str) -> bool:
    """The graph shortens a long name in the middle ("docume…_statements")."""
    if "…" not in label:
        return label == name
    head, tail = label.split("…", 1)
    return name.startswith(head) and name.endswith(tail) and len(label) < len(name)


def test_global_asset_graph_shows_the_lineage_assets(browser, dagster_ui):
    from playwright.sync_api import expect

    base, _, _ = dagster_ui
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        page.goto(f"{base}/asset-groups")
        expect(page.get_by_text("Global asset lineage")).to_be_visible()
        for group in ("per_document", "extraction", "corpus", "quality"):
            expect(page.get_by_text(group, exact=True).first).to_be_visible()
        page.get_by_role("button", name="Hide navigation").click()  # more room for the graph
        page.keyboard.press("Alt+e")  # the graph's own shortcut: expand all groups
        expect(page.get_by_text("source_document", exact=True).first).to_be_visible()
        page.reload()  # laid out again, the expanded graph fits the page
        # every lineage asset is a node, green once the UI has read its materializations (the inbox is an
        # observable source: drawn, never materialized)
        try:
            page.wait_for_function(NODES_SHOWN, arg=[a for a in LINEAGE_ASSETS if a != "inbox"], polling=250)
        except Exception:  # say which ones are not there
            nodes = page.evaluate(NODE_STYLES)
            missing = [a for a in LINEAGE_ASSETS if not any(_shown_as(a, label) for label in nodes)]
            pytest.fail(f"lineage assets not shown (or not materialized) in the global asset graph: {missing}; "
                        f"nodes: {nodes}")
        labels = list(page.evaluate(NODE_STYLES))
        assert all(any(_shown_as(a, label) for label in labels) for a in LINEAGE_ASSETS), labels
        page.wait_for_timeout(500)  # the edges are drawn after the nodes
        screenshot(page, "asset_graph.png")
    finally:
        context.close()


# The graph's nodes when zoomed out to fit: {label: the node box's style}; a materialized asset's box is green.
NODE_STYLES = """() => Object.fromEntries(Array.from(document.querySelectorAll("[class*='minimalAssetNodeBox']"))
    .map(box => [(box.querySelector("[class*='assetName']") || box).textContent.trim(), box.getAttribute('style') || '']))"""
NODES_SHOWN = """(names) => {
    const nodes = (%s)();
    const shownAs = (name, label) => {
        if (!label.includes('…')) return label === name;
        const [head, tail] = label.split('…');
        return name.startsWith(head) && name.endsWith(tail) && label.length < name.length;
    };
    return names.every(name => Object.entries(nodes).some(
        ([label, style]) => shownAs(name, label) && style.includes('accent-green')));
}""" % NODE_STYLES


def test_partition_page_shows_its_own_document(page, dagster_ui):
    from playwright.sync_api import expect

    from lexgraph.ids import document_id

    base, _, inbox = dagster_ui
    key = document_id("alpha.md")
    own = hashlib.sha256((inbox / "alpha.md").read_bytes()).hexdigest()
    others = [hashlib.sha256((inbox / n).read_bytes()).hexdigest() for n in TINY_CORPUS if n != "alpha.md"]
    page.goto(f"{base}/assets/source_document?view=partitions&partition={quote(key)}")
    expect(page.get_by_text(key, exact=True).filter(visible=True).first).to_be_visible()
    metadata = page.locator("table").filter(has=page.get_by_text("sha256", exact=True)).first
    row = lambda label: metadata.locator("tr").filter(has=page.get_by_text(label, exact=True)).first  # noqa: E731
    expect(row("sha256")).to_contain_text(own)
    expect(row("source_path")).to_contain_text("alpha.md")
    expect(row("doc_id")).to_contain_text(key)
    body = page.locator("body").inner_text()
    assert not any(sha in body for sha in others), "another document's sha256 on this partition's page"
    screenshot(page, "partition.png")

