"""Shared benchmark helpers: corpus preparation and memory reading."""
from __future__ import annotations

import resource
import statistics
import tempfile
import zipfile
from pathlib import Path


def prepare_corpus(path: str | Path) -> Path:
    """A folder of documents: the folder itself, or a .zip extracted to a temporary folder."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"corpus not found: {path}")
    if path.suffix.lower() != ".zip":
        return path
    target = Path(tempfile.mkdtemp(prefix="lexgraph-corpus-"))
    with zipfile.ZipFile(path) as archive:
        archive.extractall(target)
    return target


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values: list[float]) -> float:
    return statistics.median(values)
