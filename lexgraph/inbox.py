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
from time import monotonic
from typing import Iterable, Mapping

from lexgraph.atomic_json import write_json
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
    # files seen but not read yet (the scan's time box ran out): left for the next scan
    deferred: list[str] = field(default_factory=list)

    @property
    def to_index(self) -> list[str]:
        return self.new + self.changed


def _read_state(root: Path, path: str, relative: str, doc_id: str) -> FileState:
    """Read and hash one file. Opened non-blocking and checked with fstat, so an entry replaced by a
    FIFO since the walk is named rather than blocking the scan; any error is the file's problem."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        return _problem_state(root, Path(path), _os_problem(error))
    try:
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not st.S_ISREG(info.st_mode):  # replaced by something else since the walk
                return _problem_state(root, Path(path), _kind_problem(info.st_mode))
            raw = handle.read()
    except OSError as error:
        return _problem_state(root, Path(path), _os_problem(error))
    problem = probe_problem(path, raw)  # cheap and format-aware; full parsing happens at ingestion
    return FileState(doc_id, relative, info.st_size, info.st_mtime_ns, content_hash(raw), problem)


@dataclass
class InboxScan:
    """One look at the inbox. states: every entry seen, except the files left for a later scan
    (deferred: relative path -> doc_id) because the time box ran out before they were read."""
    states: dict[str, FileState]
    deferred: dict[str, str] = field(default_factory=dict)
    read: int = 0  # files read and hashed by this scan (the rest were unchanged since `previous`)
    last_read: str | None = None  # relative path of the last file read: where the next scan resumes

    @property
    def complete(self) -> bool:
        return not self.deferred


def scan_inbox(root: str | Path, previous: Mapping[str, FileState] | None = None, *,
               time_box: float | None = None, resume_after: str | None = None) -> InboxScan:
    """Every entry under root: a file whose size and mtime_ns match its previous state keeps that state
    (the stat from the walk is all it costs); the others are read and hashed.

    time_box: seconds after which no further file is read (at least one always is, so a series of
    scans always progresses); the files not reached are deferred, neither new nor removed. A scan
    that was cut short passes its last_read as the next one's resume_after, which starts reading
    after that file and wraps around, so files that keep changing cannot starve the others."""
    root = Path(root)
    previous = previous or {}
    walk = walk_corpus(root)
    states: dict[str, FileState] = {}
    for path, problem in walk.problems.items():
        state = _problem_state(root, path, problem)
        states[state.doc_id] = state
    prefix = os.path.join(str(root), "")
    to_read: list[tuple[int, str, str, str]] = []  # (walk position, path, relative, doc_id)
    resume_at = -1  # walk position of resume_after
    for i, (path, info) in enumerate(walk.entries):
        relative = path[len(prefix):] if path.startswith(prefix) else _relative(root, Path(path))
        if os.sep != "/":
            relative = relative.replace(os.sep, "/")
        if relative == resume_after:
            resume_at = i
        if printable(relative) is not relative:  # undecodable bytes in the name: reported, never read
            state = _problem_state(root, Path(path), EntryProblem("bad-name"))
            states[state.doc_id] = state
            continue
        doc_id = document_id(relative)
        old = previous.get(doc_id)
        if (old is not None and old.kind == "file" and old.size == info.st_size
                and old.mtime_ns == info.st_mtime_ns and old.relative_path == relative):
            states[doc_id] = old
        else:
            to_read.append((i, path, relative, doc_id))
    if resume_at >= 0:
        start = next((n for n, item in enumerate(to_read) if item[0] > resume_at), 0)
        to_read = to_read[start:] + to_read[:start]
    scan = InboxScan(states)
    deadline = None if time_box is None else monotonic() + time_box
    for n, (_, path, relative, doc_id) in enumerate(to_read):
        if deadline is not None and n and monotonic() >= deadline:
            scan.deferred = {rel: key for _, _, rel, key in to_read[n:]}
            break
        states[doc_id] = _read_state(root, path, relative, doc_id)
        scan.read, scan.last_read = n + 1, relative
    return scan


def scan_folder(root: str | Path, previous: Mapping[str, FileState] | None = None) -> dict[str, FileState]:
    """Hash every file, re-reading only those whose size or mtime changed since the previous scan.
    Entries that are not readable files get a FileState whose problem says what they are."""
    return scan_inbox(root, previous).states


def plan_reconcile(files: dict[str, FileState], indexed: dict[str, str], known: set[str] = frozenset(),
                   known_bad: Mapping[str, "KnownProblem"] | None = None,
                   deferred: Iterable[str] = ()) -> ReconcilePlan:
    """files: the folder now; indexed: doc_id -> content hash in the catalog; known: partition keys;
    known_bad: problems recorded earlier (KnownProblems.load()); a file still at the content it
    failed with is put in known_bad instead of being re-run, a changed one is retried. deferred:
    doc_ids of files that are there but were not read yet (a time-boxed scan): never removed."""
    plan = ReconcilePlan(deferred=sorted(deferred))
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
    plan.removed = sorted((set(indexed) | set(known)) - set(files) - set(plan.deferred))
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
    "bad-name": "has a name that is not valid UTF-8; rename the file to have it indexed",
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
    # regular files (or links to them), in stable order, each with its stat from the walk (the path as a
    # string: at 10,000 files, building Path objects costs more than the stat calls)
    entries: list[tuple[str, os.stat_result]] = field(default_factory=list)
    problems: dict[Path, EntryProblem] = field(default_factory=dict)  # every other visible entry

    @property
    def files(self) -> list[Path]:
        return [Path(path) for path, _ in self.entries]


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
        walk.entries.append((str(root), info))
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
            try:
                info = os.stat(entry.path) if entry.is_symlink() else entry.stat(follow_symlinks=False)
            except OSError as error:
                walk.problems[Path(entry.path)] = _os_problem(error, Path(entry.path))
                continue
            if st.S_ISREG(info.st_mode):
                walk.entries.append((entry.path, info))
                continue
            path = Path(entry.path)
            if st.S_ISDIR(info.st_mode):
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
    relative = printable(_relative(root, path) if path != root else path.name)
    try:
        info = path.lstat()
        facts = (info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        size, mtime = info.st_size, info.st_mtime_ns
    except OSError:
        facts, size, mtime = (), 0, 0
    try:
        target = os.readlink(path) if path.is_symlink() else ""
    except OSError:
        target = ""
    signature = "entry-" + content_hash(f"{problem.kind}|{facts}|{target}".encode("utf-8", "surrogateescape"))[:32]
    return FileState(document_id(relative), relative, size, mtime, signature, f"{printable(str(path))}: {problem}",
                     problem.kind)


def printable(text: str) -> str:
    """A path as text that can be logged and stored: bytes of a file name that are not UTF-8 (which
    Python keeps as surrogate escapes) become \\xNN escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


# --- what the last scans found, so that an unchanged file is never read again ---

SCAN_CACHE_FILE = "inbox_scan.json"


class ScanCache:
    """<index_dir>/inbox_scan.json: size, mtime_ns, content hash and problem of every readable file the
    inbox sensor has read, for the inbox folder it was read from. A cache, not a record: losing it costs
    one re-read of the inbox, and a state is only trusted while the file's size and mtime_ns match.
    It lives beside the index rather than in the sensor cursor because Dagster stores the cursor with
    every tick (at 10,000 files it would be megabytes per tick, kept with every tick that launched a run)."""

    VERSION = 1

    def __init__(self, index_dir: str | Path, root: str | Path):
        self.path = Path(index_dir) / SCAN_CACHE_FILE
        self.root = str(Path(root))
        self._loaded: dict[str, tuple] = {}

    def load(self) -> dict[str, FileState]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != self.VERSION or data.get("root") != self.root:
            return {}
        try:
            states = {row[0]: FileState(*row) for row in data["files"]}
        except (KeyError, TypeError):
            return {}
        self._loaded = {doc_id: _cache_row(state) for doc_id, state in states.items()}
        return states

    def save(self, states: Mapping[str, FileState]) -> bool:
        """Write the readable files' states if they differ from what was loaded; True when written."""
        rows = {doc_id: _cache_row(state) for doc_id, state in states.items() if state.kind == "file"}
        if rows == self._loaded:
            return False
        write_json(self.path, {"version": self.VERSION, "root": self.root, "files": list(rows.values())},
                   separators=(",", ":"))
        self._loaded = rows
        return True


def _cache_row(state: FileState) -> tuple:
    return (state.doc_id, state.relative_path, state.size, state.mtime_ns, state.content_hash, state.problem)


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
            write_json(self.path, {k: asdict(v) for k, v in sorted(entries.items())}, indent=1)


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
