"""Compare the files in a folder with what is indexed: which documents are new, changed or gone."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
import os
from pathlib import Path

from lexgraph.ids import content_hash, document_id
from lexgraph.extract.readers import probe_problem


@dataclass(frozen=True)
class FileState:
    doc_id: str
    relative_path: str
    size: int
    mtime_ns: int
    content_hash: str
    problem: str | None = None  # why the file cannot be indexed, found while hashing it


@dataclass
class ReconcilePlan:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)  # doc_id -> "path: problem" (new or changed)

    @property
    def to_index(self) -> list[str]:
        return self.new + self.changed


def _inspect(path: Path, relative: str) -> FileState:
    stat = path.stat()
    raw = path.read_bytes()
    problem = probe_problem(path, raw)  # cheap and format-aware; full parsing happens at ingestion
    return FileState(document_id(relative), relative, stat.st_size, stat.st_mtime_ns, content_hash(raw), problem)


def scan_folder(root: str | Path, previous: dict[str, FileState] | None = None) -> dict[str, FileState]:
    """Hash every file, re-reading only those whose size or mtime changed since the previous scan."""
    root = Path(root)
    previous = previous or {}
    states: dict[str, FileState] = {}
    for path in iter_corpus_files(root):
        relative = path.relative_to(root).as_posix()
        doc_id = document_id(relative)
        try:
            stat = path.stat()
            old = previous.get(doc_id)
            if old and old.size == stat.st_size and old.mtime_ns == stat.st_mtime_ns:
                states[doc_id] = old
            else:
                states[doc_id] = _inspect(path, relative)
        except FileNotFoundError:
            continue  # removed while scanning: it is simply not there
    return states


def plan_reconcile(files: dict[str, FileState], indexed: dict[str, str], known: set[str] = frozenset()) -> ReconcilePlan:
    """files: the folder now; indexed: doc_id -> content hash in the catalog; known: partition keys."""
    plan = ReconcilePlan()
    for doc_id, state in files.items():
        if doc_id not in indexed:
            plan.new.append(doc_id)
        elif indexed[doc_id] != state.content_hash:
            plan.changed.append(doc_id)
        else:
            plan.unchanged.append(doc_id)
            continue
        if state.problem:
            plan.invalid[doc_id] = state.problem
    plan.removed = sorted((set(indexed) | set(known)) - set(files))
    return plan


def states_to_json(states: dict[str, FileState]) -> dict:
    return {doc_id: asdict(state) for doc_id, state in states.items()}


def states_from_json(data: dict) -> dict[str, FileState]:
    return {doc_id: FileState(**state) for doc_id, state in data.items()}


def iter_corpus_files(root: str | Path) -> list[Path]:
    """Every visible file under root (or root itself), sorted so ingestion order is stable.

    Unsupported types are returned too: read_document rejects them with a message rather
    than the scan dropping them silently.
    """
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files.extend(Path(dirpath) / name for name in sorted(filenames))
    return [f for f in files if not f.name.startswith(".")]
