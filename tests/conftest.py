import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests make their own instances; never write runs into the developer's DAGSTER_HOME.
os.environ.pop("DAGSTER_HOME", None)
# Tests choose their extractor: an endpoint, key or masking setting from the developer's shell must not
# turn the default (offline NLP) tests into LLM calls.
for _variable in ("LEXGRAPH_LLM_BASE_URL", "LEXGRAPH_LLM_MODEL", "LEXGRAPH_LLM_API_KEY", "OPENAI_BASE_URL",
                  "OPENAI_API_KEY", "LEXGRAPH_PII_MASKING", "LEXGRAPH_ENTITY_TYPES"):
    os.environ.pop(_variable, None)
ROOT = Path(__file__).resolve().parent.parent
SAMPLE_CORPUS = ROOT / "sample" / "corpus"
# A graph file a test opens itself ends as the backend under test wants (LEXGRAPH_GRAPH_BACKEND=ladybug runs the
# suite on LadybugDB): a process loads one graph engine, so one `.kuzu` file would bind a whole worker to Kùzu.
GRAPH_SUFFIX = ".lbug" if os.environ.get("LEXGRAPH_GRAPH_BACKEND", "").strip().lower() == "ladybug" else ".kuzu"
# ... and it survives a test's clean environment, for the same reason.
KEPT_VARIABLES = frozenset({"LEXGRAPH_GRAPH_BACKEND"})


def cleared_variables(environ=None) -> list[str]:
    """The LEXGRAPH_ and DAGSTER_ variables a test clears for a clean environment: all but KEPT_VARIABLES."""
    environ = os.environ if environ is None else environ
    return [k for k in environ if k.startswith(("LEXGRAPH_", "DAGSTER_")) and k not in KEPT_VARIABLES]

# --- markers: the fast subset ---------------------------------------------------------------------------------
# `make test-fast` runs `pytest -m "not slow"`. A test is slow when it builds an index or uses a Dagster instance
# (mark `ingest`), starts another process (`subprocess`) or needs PostgreSQL (`postgres`); `slow` is added to every
# test that carries one of them, and a few long tests carry it alone (pyproject.toml registers all four, and says
# what each covers). A test gets these marks by decorator or module `pytestmark`, or through a fixture it uses,
# directly or through another fixture: FIXTURE_MARKS below for this file's fixtures, and a test module's own
# FIXTURE_MARKS (a dict of the same shape) for the fixtures it defines.
# The marks are given at collection, before `-m` selects: a fixture cannot mark its tests when it runs.
FIXTURE_MARKS = {
    "sample_home": ("ingest",),      # the sample corpus through Dagster, once a session
    "instance": ("ingest",),         # the Dagster instance a test runs jobs, ingests or sensor ticks on
    "sqlite_instance": ("ingest",),
}
SLOW_MARKS = ("ingest", "subprocess", "postgres")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    for item in items:
        by_fixture = {**FIXTURE_MARKS, **getattr(getattr(item, "module", None), "FIXTURE_MARKS", {})}
        for name in item.fixturenames:
            for mark in by_fixture.get(name, ()):
                item.add_marker(mark)
        if any(item.get_closest_marker(mark) for mark in SLOW_MARKS):
            item.add_marker("slow")


@pytest.fixture(scope="session")
def embedder():
    from lexgraph.extract.embedder import Embedder

    return Embedder.shared()


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    """Four small documents, one with a name that has spaces, ':' and non-ASCII letters."""
    folder = tmp_path / "inbox"
    folder.mkdir()
    (folder / "alpha.md").write_text("# Alpha\n\nAlpha Shipping signed contract C-1 with Bolt Engines.\n\n"
                                     "## Terms\n\nDelivery is due in May 2024 at Bergen.\n")
    (folder / "beta.txt").write_text("Bolt Engines is run by Dana Frost.\n\nIts plant is in Kiel.\n")
    (folder / "gamma.md").write_text("# Gamma\n\nThe arbitration over contract C-1 awarded EUR 2 million.\n")
    (folder / "Søren notes: 2024.md").write_text("# Notes\n\nSøren Åberg chairs the board of Alpha Shipping.\n")
    return folder


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "index"


@pytest.fixture
def instance():
    """The instance `lexgraph ingest` runs on without DAGSTER_HOME: Dagster's ephemeral (in-memory) one.
    Runs on a persistent SQLite instance pay about twice the Dagster time per run (a connection and an engine
    per event); the tests of what needs persistence (the sensors, the daemon, the production instance) make
    their own with `sqlite_instance` or a DAGSTER_HOME."""
    import dagster as dg

    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def sqlite_instance():
    """A persistent SQLite instance in a temporary DAGSTER_HOME, as `make dev` and the daemon use."""
    import dagster as dg

    with dg.instance_for_test() as inst:
        yield inst


def copy_corpus(target: Path) -> Path:
    shutil.copytree(SAMPLE_CORPUS, target)
    return target


def _build_sample_index(home: Path) -> None:
    import dagster as dg

    from orchestration.runner import ingest_folder

    with dg.DagsterInstance.ephemeral() as inst:
        report = ingest_folder(SAMPLE_CORPUS, inst, home=str(home), progress=False)
    assert report.corpus_index_ok and not report.failed, report.failed


@pytest.fixture(scope="session")
def sample_home(tmp_path_factory, worker_id) -> Path:
    """The sample corpus ingested once through Dagster, for tests that only read an index (queries).

    Under xdist the workers share one build (about 20 s of a 2-core run) in the run's common temporary
    folder, under a file lock; each worker reads a copy of its own, since tests write query logs and
    audit pages under the home."""
    home = tmp_path_factory.mktemp("sample") / "index"
    if worker_id == "master":
        _build_sample_index(home)
        return home
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "sample-index"
    built = shared.with_suffix(".built")
    with FileLock(str(shared) + ".lock"):
        if not built.exists():
            shutil.rmtree(shared, ignore_errors=True)  # a build cut off by a failure: start again
            _build_sample_index(shared)
            built.touch()
    shutil.copytree(shared, home)
    return home


# --- the local OpenAI-protocol test LLM (tests/llm_server.py) ------------------------------------------------------

@pytest.fixture(scope="module")
def llm_server_options() -> dict:
    """LLMTestServer's keyword arguments for `server` and `module_server`: a test module that needs another model
    name, lifetime or stall, or a recording to replay, overrides this fixture."""
    return {}


@pytest.fixture
def server(llm_server_options):
    """A test LLM server of its own for each test."""
    from tests.llm_server import LLMTestServer

    with LLMTestServer(**llm_server_options) as running:
        yield running


@pytest.fixture(scope="module")
def module_server(llm_server_options):
    """One test LLM server for all the tests of a module (they reset it: `LLMTestServer.reset`)."""
    from tests.llm_server import LLMTestServer

    with LLMTestServer(**llm_server_options) as running:
        yield running


@pytest.fixture
def no_llm_backoff(monkeypatch):
    """No wait between retried LLM calls (LEXGRAPH_LLM_BACKOFF=0)."""
    monkeypatch.setenv("LEXGRAPH_LLM_BACKOFF", "0")


# --- fixtures shared by several test modules ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_text() -> str:
    """Several thousand word pieces of varied prose (the sample corpus's markdown files, in file order)."""
    return "\n\n".join(p.read_text() for p in sorted(SAMPLE_CORPUS.iterdir()) if p.suffix == ".md")


@pytest.fixture(scope="module")
def service(sample_home):
    """The query service over the session's sample index, without an LLM."""
    from lexgraph.query.service import QueryService
    from lexgraph.settings import Settings

    return QueryService(Settings.from_env(home=sample_home), use_llm=False)
