"""Per-document Extract output as Parquet: the stores are rebuilt from these files, never from LLM calls."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterable

import polars as pl
import pyarrow.parquet as pq

from lexgraph.atomic_json import write_json
from lexgraph.errors import FileProblem

PARQUET_MAGIC = b"PAR1"
# "size:mtime_ns" of the extract files verify_extracts found whole: a file whose stat still matches is not
# parsed again (every write replaces a file or changes its mtime, so a damage changes its stat). Strings, not
# lists: 12,000 small lists in a process holding Dagster's heap set off a full garbage collection (0.3 s).
VERIFIED_FILE = ".verified.json"
# a file modified this recently is not recorded: a second write within the file system's timestamp
# granularity could keep its size and mtime
RECENT_NS = 2_000_000_000


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

    def read(self, stage: str, doc_id: str,
             query: Callable[[pl.LazyFrame], pl.LazyFrame] | None = None) -> pl.DataFrame:
        """The stage's output for one document; a truncated or damaged file raises CorruptExtractError.
        query: applied to a scan of the file, so only the columns and rows it needs are ever in memory (a
        group-by of a 50 MB document's 6M keyword rows: 0.5 GB instead of 1.2 GB read whole)."""
        path = self.path(stage, doc_id)
        if not path.exists():
            raise FileNotFoundError(f"no {stage} output for document {doc_id} at {path}; materialize {stage} first")
        problem = parquet_problem(path)
        if problem is None:
            try:
                return pl.read_parquet(path) if query is None else query(pl.scan_parquet(path)).collect()
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
        return self._problems(doc_id, stages, self._folders(), {}, {}, 0)

    def _folders(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []

    def _problems(self, doc_id: str, stages: Iterable[str], folders: list[Path], verified: dict[str, str],
                  whole: dict[str, str], settled: int) -> dict[Path, str]:
        """problems(), skipping the footer parse of files whose "size:mtime_ns" is as in `verified`; the stat
        of each file found whole and last modified before `settled` (ns) is put in `whole` (taken before the
        check: a write during it changes it). Plain strings, not Paths, for the stats: this runs for every
        file of the index on every ingest."""
        found: dict[Path, str] = {}
        present = set()
        name = f"{doc_id}.parquet"
        for folder in folders:
            try:
                stat = os.stat(f"{folder}/{name}")
            except (FileNotFoundError, NotADirectoryError):
                continue
            present.add(folder.name)
            key, stamp = f"{folder.name}/{name}", f"{stat.st_size}:{stat.st_mtime_ns}"
            if verified.get(key) != stamp:
                problem = parquet_problem(folder / name)
                if problem is not None:
                    found[folder / name] = problem
                    continue
            if stat.st_mtime_ns < settled:
                whole[key] = stamp
        for stage in stages:
            if stage not in present:
                found[self.path(stage, doc_id)] = f"file is missing (no {stage} output for an indexed document)"
        return found

    def read_verified(self) -> dict:
        """The record of files found whole ({} when missing or unreadable: everything is verified)."""
        try:
            record = json.loads((self.root / VERIFIED_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        files = record.get("files") if isinstance(record, dict) else None
        return files if isinstance(files, dict) else {}

    def write_verified(self, files: dict) -> None:
        with contextlib.suppress(OSError):  # only a cache: a read-only index verifies everything each time
            write_json(self.root / VERIFIED_FILE, {"files": files}, separators=(",", ":"))

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
    `stages`). Reads the footers of only the files whose size or mtime changed since they were last found
    whole (recorded in VERIFIED_FILE, of these documents only), so it costs a stat per file on every ingest."""
    stages = tuple(stages)
    folders, verified, whole = store._folders(), store.read_verified(), {}
    settled = time.time_ns() - RECENT_NS
    found: dict[str, str] = {}
    for doc_id in doc_ids:
        problems = store._problems(doc_id, stages, folders, verified, whole, settled)
        if problems:
            found[doc_id] = "; ".join(f"{path}: {problem}" for path, problem in problems.items())
    if whole != verified and store.root.exists():
        store.write_verified(whole)
    return found
