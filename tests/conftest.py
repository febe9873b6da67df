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
