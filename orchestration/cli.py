"""The `lexgraph` console script: the engine's CLI with Dagster-driven ingestion handed in.

Dagster (and orchestration.definitions, which builds its Definitions from the environment when
imported) is imported only when a command needs it, after the settings were validated: a bad
LEXGRAPH_* value then ends in the CLI's one-line error, never in an import-time traceback, and
`status` and `search` start without loading Dagster at all."""
from __future__ import annotations

import contextlib
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING


@contextlib.contextmanager
def _collector_paused():
    """Imports (the engine's here, Dagster's in the commands that drive it) create some 300,000 objects that
    live as long as the process: collecting while they piled up took about 0.5 s of every command."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


with _collector_paused():
    from lexgraph import cli
    from lexgraph.settings import Settings

if TYPE_CHECKING:
    from orchestration.runner import IngestReport


def ingest(path: Path, settings: Settings, prune: bool = False, progress: bool = True) -> "IngestReport":
    with _collector_paused():
        from orchestration.runner import ingest_with_default_instance

    return ingest_with_default_instance(path, settings=settings, prune=prune, progress=progress)


def index_bench_corpus(folder: Path, home: Path, progress: bool) -> "IngestReport":
    """The bench's cached index, built in an instance of its own (see private_dagster_instance)."""
    settings = Settings.from_env(home=home)
    with _collector_paused():
        from orchestration.runner import ingest_with_default_instance, private_dagster_instance

    with private_dagster_instance():
        return ingest_with_default_instance(folder, settings=settings, prune=True, progress=progress)


def reextract(settings: Settings, progress: bool = True):
    """`lexgraph reextract`: the deliberate backfill after a prompt or model change, through Dagster."""
    with _collector_paused():
        from orchestration.runner import reextract_with_default_instance

    return reextract_with_default_instance(settings=settings, progress=progress)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, ingest=ingest, indexer=index_bench_corpus, reextract=reextract)


def run() -> int:
    """The console script: one command, then the process ends. Interpreter teardown would run full
    collections over every object the command left (about 0.9 s after an add at 100k chunks); frozen ones
    are skipped, and the process's memory goes back to the system whole."""
    try:
        return main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    sys.exit(run())
