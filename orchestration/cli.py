"""The `lexgraph` console script: the engine's CLI with Dagster-driven ingestion handed in."""
from __future__ import annotations

import sys
from pathlib import Path

from lexgraph import cli
from lexgraph.settings import Settings
from orchestration.runner import IngestReport, ingest_with_default_instance, private_dagster_instance


def ingest(path: Path, settings: Settings, prune: bool = False, progress: bool = True) -> IngestReport:
    return ingest_with_default_instance(path, settings=settings, prune=prune, progress=progress)


def index_bench_corpus(folder: Path, home: Path, progress: bool) -> IngestReport:
    """The bench's cached index, built in an instance of its own (see private_dagster_instance)."""
    with private_dagster_instance():
        return ingest_with_default_instance(folder, settings=Settings.from_env(home=home), prune=True,
                                            progress=progress)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, ingest=ingest, indexer=index_bench_corpus)


if __name__ == "__main__":
    sys.exit(main())
