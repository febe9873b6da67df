"""Per-document Extract output as Parquet: the stores are rebuilt from these files, never from LLM calls."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import polars as pl
import pyarrow.parquet as pq

from lexgraph.errors import FileProblem

PARQUET_MAGIC = b"PAR1"


class CorruptExtractError(FileProblem):
    """An extract file that is not readable Parquet (truncated, damaged): the message names the file."""

    def __init__(self, path: str | Path, problem: str, stage: str = "", doc_id: str = ""):
        self.stage, self.doc_id = stage, doc_id
        super().__init__(path, problem)


def parquet_problem(path: str | Path, footer: bool = True) -> str | None:
    """Why a file is not a complete Parquet file, checked cheaply (magic bytes, and with footer the
    footer's metadata; never the data pages); None when it looks whole. A missing file is a problem too."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size < 12:
            return f"{size} bytes, too short to be Parquet (truncated)"
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(-8, os.SEEK_END)
            tail = handle.read(8)
        if head != PARQUET_MAGIC:
            return "not a Parquet file (no PAR1 header)"
        if tail[4:] != PARQUET_MAGIC:
            return f"truncated Parquet file ({size} bytes, no PAR1 footer)"
        length = int.from_bytes(tail[:4], "little")
        if length + 12 > size:
            return f"damaged Parquet footer (claims {length} bytes in a {size}-byte file)"
        if footer:
            pq.read_metadata(path)
    except FileNotFoundError:
        return "file is missing"
    except Exception as error:  # pyarrow reports a bad footer in several exception types
        return f"damaged Parquet footer ({error})"
    return None


class ExtractStore:
    """One Parquet file per (stage, document) under an index version's folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, stage: str, doc_id: str) -> Path:
        return self.root / stage / f"{doc_id}.parquet"

    def write(self, stage: str, doc_id: str, frame: pl.DataFrame) -> Path:
        """Atomic replace: a run killed mid-write leaves the previous file, never a torn one."""
        target = self.path(stage, doc_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        frame.write_parquet(partial)
        os.replace(partial, target)
        return target

    def read(self, stage: str, doc_id: str) -> pl.DataFrame:
        """The stage's output for one document; a truncated or damaged file raises CorruptExtractError."""
        path = self.path(stage, doc_id)
        if not path.exists():
            raise FileNotFoundError(f"no {stage} output for document {doc_id} at {path}; materialize {stage} first")
        problem = parquet_problem(path)
        if problem is None:
            try:
                return pl.read_parquet(path)
            except (Exception, pl.exceptions.PanicException) as error:  # a damaged page, past the footer
                problem = f"unreadable Parquet ({type(error).__name__}: {error})"
        raise self._corrupt(path, stage, doc_id, problem)

    def rows(self, stage: str, doc_id: str) -> int:
        """Row count from the file's footer, without reading its data."""
        path = self.path(stage, doc_id)
        try:
            return pq.read_metadata(path).num_rows
        except FileNotFoundError:
            raise
        except Exception as error:
            raise self._corrupt(path, stage, doc_id, f"damaged Parquet footer ({error})") from None

    def exists(self, stage: str, doc_id: str) -> bool:
        return self.path(stage, doc_id).exists()

    def doc_ids(self, stage: str) -> list[str]:
        folder = self.root / stage
        return sorted(p.stem for p in folder.glob("*.parquet")) if folder.exists() else []

    def scan(self, stage: str) -> pl.LazyFrame | None:
        """All documents' output of one stage as one lazy frame (None when there is none); every file's
        footer is checked first, so a truncated one is named instead of failing the scan anonymously."""
        files = sorted((self.root / stage).glob("*.parquet")) if (self.root / stage).exists() else []
        for path in files:
            problem = parquet_problem(path, footer=False)
            if problem is not None:
                raise self._corrupt(path, stage, path.stem, problem)
        return pl.scan_parquet(files) if files else None

    def problems(self, doc_id: str, stages: Iterable[str] = ()) -> dict[Path, str]:
        """Corrupt files of one document (every stage folder), and missing ones among `stages`."""
        found: dict[Path, str] = {}
        if self.root.exists():
            for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
                path = folder / f"{doc_id}.parquet"
                if path.exists():
                    problem = parquet_problem(path)
                    if problem is not None:
                        found[path] = problem
        for stage in stages:
            path = self.path(stage, doc_id)
            if not path.exists():
                found[path] = f"file is missing (no {stage} output for an indexed document)"
        return found

    def remove_corrupt(self, doc_id: str) -> list[Path]:
        """Delete a document's truncated or damaged files (its re-ingestion writes them again)."""
        removed = []
        for path, problem in self.problems(doc_id).items():
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def delete_document(self, doc_id: str) -> int:
        removed = 0
        if self.root.exists():
            for stage_dir in self.root.iterdir():
                path = stage_dir / f"{doc_id}.parquet"
                if path.exists():
                    path.unlink()
                    removed += 1
        return removed

    def _corrupt(self, path: Path, stage: str, doc_id: str, problem: str) -> CorruptExtractError:
        return CorruptExtractError(path, f"corrupt {stage} output of document {doc_id}: {problem}; "
                                         "re-ingest the document (`lexgraph ingest` does so when its file "
                                         "is still in the inbox)", stage=stage, doc_id=doc_id)


def verify_extracts(store: ExtractStore, doc_ids: Iterable[str], stages: Iterable[str] = ()) -> dict[str, str]:
    """doc_id -> problem for each document with a truncated or damaged extract file (or a missing one of
    `stages`). Reads only file ends and footers, so it is cheap enough for every ingest and sensor tick."""
    stages = tuple(stages)
    found: dict[str, str] = {}
    for doc_id in doc_ids:
        problems = store.problems(doc_id, stages)
        if problems:
            found[doc_id] = "; ".join(f"{path}: {problem}" for path, problem in problems.items())
    return found
