"""Compare the files in a folder with what is indexed: which documents are new, changed or gone.

One odd entry never stops the rest: symbolic-link loops, dangling links, FIFOs, devices, sockets,
unreadable and vanishing files each become one problem naming the path (a FIFO is never opened),
and files that failed at read time are remembered per index (problems.json) so that, while they
stay unchanged, they are reported without being re-run on every ingest or sensor tick."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
import errno
import fcntl
import json
import os
import stat as st
from pathlib import Path
from typing import Iterable, Mapping

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
    # "file" when the bytes could be read; otherwise what the entry is (ENTRY_KINDS), and content_hash
    # is then a signature of its metadata, so a fixed entry shows as changed
    kind: str = "file"


@dataclass
class ReconcilePlan:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # doc_id -> "path: problem": new or changed files with a problem (each gets a run of its own that
    # fails visibly), entries that are not readable files, and the known_bad ones
    invalid: dict[str, str] = field(default_factory=dict)
    # unchanged files whose problem is already recorded in problems.json: reported, not re-run
    known_bad: list[str] = field(default_factory=list)

    @property
    def to_index(self) -> list[str]:
        return self.new + self.changed


def _inspect(path: Path, relative: str) -> FileState:
    stat = path.stat()
    raw = path.read_bytes()
    problem = probe_problem(path, raw)  # cheap and format-aware; full parsing happens at ingestion
    return FileState(document_id(relative), relative, stat.st_size, stat.st_mtime_ns, content_hash(raw), problem)


def scan_folder(root: str | Path, previous: dict[str, FileState] | None = None) -> dict[str, FileState]:
    """Hash every file, re-reading only those whose size or mtime changed since the previous scan.
    Entries that are not readable files get a FileState whose problem says what they are."""
    root = Path(root)
    previous = previous or {}
    walk = walk_corpus(root)
    states: dict[str, FileState] = {}
    for path, problem in walk.problems.items():
        state = _problem_state(root, path, problem)
        states[state.doc_id] = state
    for path in walk.files:
        relative = _relative(root, path)
        doc_id = document_id(relative)
        try:
            info = path.stat()
            old = previous.get(doc_id)
            if old and old.kind == "file" and old.size == info.st_size and old.mtime_ns == info.st_mtime_ns:
                states[doc_id] = old
            elif not st.S_ISREG(info.st_mode):  # replaced by something else since the walk
                states[doc_id] = _problem_state(root, path, _kind_problem(info.st_mode))
            else:
                states[doc_id] = _inspect(path, relative)
        except OSError as error:
            states[doc_id] = _problem_state(root, path, _os_problem(error))
    return states


def plan_reconcile(files: dict[str, FileState], indexed: dict[str, str], known: set[str] = frozenset(),
                   known_bad: Mapping[str, "KnownProblem"] | None = None) -> ReconcilePlan:
    """files: the folder now; indexed: doc_id -> content hash in the catalog; known: partition keys;
    known_bad: problems recorded earlier (KnownProblems.load()); a file still at the content it
    failed with is put in known_bad instead of being re-run, a changed one is retried."""
    plan = ReconcilePlan()
    known_bad = known_bad or {}
    for doc_id, state in files.items():
        if doc_id in indexed and indexed[doc_id] == state.content_hash:
            plan.unchanged.append(doc_id)
            continue
        record = known_bad.get(doc_id)
        if record is not None and record.content_hash == state.content_hash:
            plan.known_bad.append(doc_id)
            plan.invalid[doc_id] = (f"{record.problem} (known since {record.first_seen[:10]}; "
                                    "not retried until the file changes)")
            continue
        if state.kind != "file":  # nothing a run could read: reported only
            plan.invalid[doc_id] = state.problem or f"{state.relative_path}: not a readable file"
            continue
        (plan.changed if doc_id in indexed else plan.new).append(doc_id)
        if state.problem:
            plan.invalid[doc_id] = state.problem
    if any(state.kind == "unreadable-folder" for state in files.values()):
        return plan  # its documents are not seen, which is not the same as removed: purge nothing yet
    plan.removed = sorted((set(indexed) | set(known)) - set(files))
    return plan


def states_to_json(states: dict[str, FileState]) -> dict:
    return {doc_id: asdict(state) for doc_id, state in states.items()}


def states_from_json(data: dict) -> dict[str, FileState]:
    return {doc_id: FileState(**state) for doc_id, state in data.items()}


# What a directory entry that is not a readable file is; FileState.kind of its state.
ENTRY_KINDS = {
    "fifo": "is a FIFO (named pipe), not a regular file",
    "char-device": "is a character device, not a regular file",
    "block-device": "is a block device, not a regular file",
    "socket": "is a socket, not a regular file",
    "other": "is not a regular file",
    "symlink-loop": "is a symbolic link loop (ELOOP)",
    "folder-loop": "is a symbolic link loop: it points back to {detail}, a folder it is in; not followed",
    "folder-repeat": "links to {detail}, a folder scanned under its own path; not followed twice",
    "dangling-link": "is a dangling symbolic link (its target {detail} does not exist)",
    "unreadable": "cannot be read",
    "unreadable-folder": "is a folder that cannot be read ({detail}); nothing in it is indexed, and no "
                         "indexed document is removed until it can be read",
    "vanished": "vanished while the folder was being scanned",
}


@dataclass(frozen=True)
class EntryProblem:
    kind: str  # a key of ENTRY_KINDS
    detail: str = ""

    def __str__(self) -> str:
        text = ENTRY_KINDS[self.kind]
        if "{detail}" in text:
            return text.format(detail=self.detail)
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class CorpusWalk:
    files: list[Path] = field(default_factory=list)  # regular files (or links to them), in stable order
    problems: dict[Path, EntryProblem] = field(default_factory=dict)  # every other visible entry


def _kind_problem(mode: int) -> EntryProblem:
    for test, kind in ((st.S_ISFIFO, "fifo"), (st.S_ISCHR, "char-device"), (st.S_ISBLK, "block-device"),
                       (st.S_ISSOCK, "socket")):
        if test(mode):
            return EntryProblem(kind)
    return EntryProblem("other")


def _os_problem(error: OSError, link: Path | None = None) -> EntryProblem:
    if error.errno == errno.ELOOP:
        return EntryProblem("symlink-loop")
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        try:
            if link is not None and link.is_symlink():
                return EntryProblem("dangling-link", os.readlink(link))
        except OSError:
            pass
        return EntryProblem("vanished")
    return EntryProblem("unreadable", error.strerror or type(error).__name__)


def walk_corpus(root: str | Path) -> CorpusWalk:
    """Every visible entry under root (or root itself), files sorted so ingestion order is stable:
    a folder's files in name order, then its sub-folders in name order. Hidden names are skipped.

    Nothing is opened: each entry is classified from its metadata, so a FIFO cannot block the walk.
    Linked folders are followed once; a link back into a folder on the way down, or to a folder
    already scanned, is a problem rather than a loop."""
    root = Path(root)
    try:
        info = root.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{root}: no such file or folder") from None
    except OSError as error:
        raise FileNotFoundError(f"{root}: {_os_problem(error, root)}") from None
    walk = CorpusWalk()
    if st.S_ISREG(info.st_mode):
        walk.files.append(root)
        return walk
    if not st.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{root}: {_kind_problem(info.st_mode)}, not a folder of documents")
    seen = {(info.st_dev, info.st_ino): root}
    real_root = os.path.realpath(root)
    stack: list[tuple[Path, frozenset]] = [(root, frozenset(seen))]
    while stack:
        folder, ancestors = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted((e for e in listing if not e.name.startswith(".")), key=lambda e: e.name)
        except FileNotFoundError:
            if folder != root:
                walk.problems[folder] = EntryProblem("vanished")
            continue
        except OSError as error:
            if folder == root:
                raise PermissionError(f"{root}: the folder cannot be read ({error.strerror})") from None
            walk.problems[folder] = EntryProblem("unreadable-folder", error.strerror or type(error).__name__)
            continue
        subfolders: list[tuple[Path, frozenset]] = []
        for entry in entries:
            path = Path(entry.path)
            try:
                info = os.stat(entry.path) if entry.is_symlink() else entry.stat(follow_symlinks=False)
            except OSError as error:
                walk.problems[path] = _os_problem(error, path)
                continue
            if st.S_ISREG(info.st_mode):
                walk.files.append(path)
            elif st.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                target = os.path.realpath(path) if entry.is_symlink() else ""
                if key in ancestors:
                    walk.problems[path] = EntryProblem("folder-loop", str(seen[key]))
                elif key in seen or (target and os.path.commonpath([target, real_root]) == real_root):
                    # a linked folder inside root is scanned under its own path: never twice
                    walk.problems[path] = EntryProblem("folder-repeat", str(seen.get(key, target)))
                else:
                    seen[key] = path
                    subfolders.append((path, ancestors | {key}))
            else:
                walk.problems[path] = _kind_problem(info.st_mode)
        stack.extend(reversed(subfolders))
    return walk


def iter_corpus_files(root: str | Path) -> list[Path]:
    """Every visible regular file under root (or root itself), sorted so ingestion order is stable.

    Unsupported types are returned too: read_document rejects them with a message rather
    than the scan dropping them silently. Entries that are not files (FIFOs, devices, sockets,
    link loops, dangling links) are left out; walk_corpus() names them with their problem.
    """
    return walk_corpus(root).files


def _relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _problem_state(root: Path, path: Path, problem: EntryProblem) -> FileState:
    """The state of an entry that is not a readable file: a signature of its metadata stands in for
    the content hash, so fixing it (replacing, chmod, re-linking) shows as a change."""
    relative = _relative(root, path) if path != root else path.name
    try:
        info = path.lstat()
        facts = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        size, mtime = info.st_size, info.st_mtime_ns
    except OSError:
        facts, size, mtime = (), 0, 0
    target = os.readlink(path) if path.is_symlink() else ""
    signature = "entry-" + content_hash(f"{problem.kind}|{facts}|{target}".encode())[:32]
    return FileState(document_id(relative), relative, size, mtime, signature, f"{path}: {problem}", problem.kind)


# --- files that failed at read time, remembered per index ---

PROBLEMS_FILE = "problems.json"


@dataclass(frozen=True)
class KnownProblem:
    content_hash: str  # the content (or entry signature) the file failed with
    relative_path: str
    problem: str  # "path: problem"
    first_seen: str  # ISO time


class KnownProblems:
    """<index_dir>/problems.json: doc_id -> KnownProblem. Written when a document fails at read time
    (the scan's problems, load_sources' failures), cleared when it is indexed or its file is removed.
    Writers take a file lock; the file is replaced atomically, so readers never see a torn one."""

    def __init__(self, index_dir: str | Path):
        self.path = Path(index_dir) / PROBLEMS_FILE

    def load(self) -> dict[str, KnownProblem]:
        try:
            data = json.loads(self.path.read_text())
            return {doc_id: KnownProblem(**entry) for doc_id, entry in data.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError):  # unreadable record: start over (files are merely retried)
            return {}

    def update(self, record: Mapping[str, tuple[str, str, str]] | None = None,
               clear: Iterable[str] = ()) -> None:
        """record: doc_id -> (content_hash, relative_path, problem); clear: doc_ids now fine or gone."""
        record, clear = dict(record or {}), set(clear) - set(record or {})
        if not record and not clear & set(self.load()):
            return  # nothing to write (the common case: no problems at all)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(PROBLEMS_FILE + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self.load()
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            for doc_id, (digest, relative, problem) in record.items():
                old = entries.get(doc_id)
                first_seen = old.first_seen if old and old.content_hash == digest else now
                entries[doc_id] = KnownProblem(digest, relative, problem, first_seen)
            for doc_id in clear:
                entries.pop(doc_id, None)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({k: asdict(v) for k, v in sorted(entries.items())}, indent=1))
            os.replace(partial, self.path)


def entry_signature(path: Path) -> str:
    """What scan_folder would record as the content hash of path, without ever opening a non-file."""
    try:
        info = path.stat()
        if st.S_ISREG(info.st_mode):
            return content_hash(path.read_bytes())
    except OSError:
        pass
    root = path.parent
    try:
        problem = _kind_problem(path.stat().st_mode)
    except OSError as error:
        problem = _os_problem(error, path)
    return _problem_state(root, path, problem).content_hash


def record_read_results(index_dir: str | Path, root: Path, paths: Mapping[str, Path | None],
                        done: Iterable[str], failed: Mapping[str, str]) -> None:
    """After documents were read (load_sources): remember the failures with the content they failed
    with, and forget earlier problems of documents that now read fine."""
    record = {}
    for doc_id, problem in failed.items():
        path = paths.get(doc_id)
        if path is None:
            continue  # gone: nothing to remember
        try:
            relative = _relative(Path(root), Path(path))
        except ValueError:
            relative = Path(path).name
        record[doc_id] = (entry_signature(Path(path)), relative, problem)
    KnownProblems(index_dir).update(record=record, clear=done)
