"""Benchmark corpora: a folder of .txt/.md files (indexed in place), a .zip of them (extracted once
into the cache), or one large text file, split into parts as :func:`split_text_file` says. Each
prepared corpus has its own cache home keyed by its content hash."""
from __future__ import annotations

import hashlib
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lexgraph.extract.readers import TEXT_SUFFIXES
from lexgraph.inbox import iter_corpus_files
from lexgraph.ids import content_hash, file_hash

# A single large file is cut into parts of at most this many characters (~1,000 word pieces).
SPLIT_CHARS = 4000
SPLITTER_VERSION = "1"
_HEADING = re.compile(r"^#{1,2}\s")


class BenchError(Exception):
    """A benchmark input that cannot be used (missing corpus, bad questions): CLI exit code 2."""


@dataclass(frozen=True)
class PreparedCorpus:
    source: Path  # what the user named
    folder: Path  # the folder that is indexed
    kind: str  # folder | zip | file
    corpus_hash: str
    home: Path  # the cache folder of this corpus: index/ and, for zip and file, corpus/

    @property
    def index_home(self) -> Path:
        return self.home / "index"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "corpus"


def _hash_folder(folder: Path) -> str:
    """Paths and contents of every file, so a renamed or edited file gives another index."""
    digest = hashlib.sha256()
    for path in iter_corpus_files(folder):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + file_hash(path).encode() + b"\n")
    return digest.hexdigest()


def prepare_corpus(path: str | Path, cache_root: str | Path) -> PreparedCorpus:
    """Locate (or make) the folder to index and its cache home ``<cache_root>/bench/<name>-<hash>``."""
    source = Path(path)
    if not source.exists():
        raise BenchError(f"{source}: corpus not found (expected a folder of .txt/.md files, a .zip of them, "
                         "or one text file)")
    if source.is_dir():
        kind, corpus_hash = "folder", _hash_folder(source)
        if not iter_corpus_files(source):
            raise BenchError(f"{source}: the corpus folder holds no files")
    elif source.suffix.lower() == ".zip":
        kind, corpus_hash = "zip", file_hash(source)
    elif source.suffix.lower() in TEXT_SUFFIXES:
        kind, corpus_hash = "file", content_hash(f"{file_hash(source)}|split{SPLITTER_VERSION}|{SPLIT_CHARS}")
    else:
        raise BenchError(f"{source}: unsupported corpus file type {source.suffix or '(none)'}; "
                         f"expected a folder, a .zip or one of {', '.join(TEXT_SUFFIXES)}")
    home = Path(cache_root) / "bench" / f"{_slug(source.stem)}-{corpus_hash[:12]}"
    folder = source if kind == "folder" else home / "corpus"
    if kind != "folder":
        _materialise(source, kind, folder, corpus_hash)
    return PreparedCorpus(source, folder, kind, corpus_hash, home)


def _materialise(source: Path, kind: str, folder: Path, corpus_hash: str) -> None:
    """Extract or split once; a marker holding the hash says the folder is complete."""
    marker = folder / ".complete"
    if marker.exists() and marker.read_text().strip() == corpus_hash:
        return
    if folder.exists():
        shutil.rmtree(folder)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if kind == "zip":
        _extract_zip(source, partial)
    else:
        for name, text in split_text_file(source):
            (partial / name).write_text(text, encoding="utf-8")
    (partial / ".complete").write_text(corpus_hash)
    partial.rename(folder)


def _extract_zip(source: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(source) as archive:
            root = target.resolve()
            for member in archive.infolist():
                destination = (target / member.filename).resolve()
                if root != destination and root not in destination.parents:
                    raise BenchError(f"{source}: archive member {member.filename!r} points outside the archive")
                name = Path(member.filename).name
                if member.is_dir() or name.startswith(".") or "__MACOSX" in member.filename:
                    continue
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(archive.read(member))
    except zipfile.BadZipFile as error:
        raise BenchError(f"{source}: not a readable zip archive ({error})") from None


def split_text_file(path: Path, limit: int = SPLIT_CHARS) -> list[tuple[str, str]]:
    """One large file as documents: blank-line-separated paragraphs packed in order into parts of
    at most `limit` characters (a longer paragraph is a part of its own, the chunker cuts it
    further), and a Markdown heading of level 1 or 2 always opens a new part. Parts are named
    ``<stem>-part-0001<suffix>``, so evidence ids name parts."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not paragraphs:
        raise BenchError(f"{path}: the corpus file holds no text")
    parts: list[list[str]] = [[]]
    size = 0
    for paragraph in paragraphs:
        if parts[-1] and (size + len(paragraph) > limit or _HEADING.match(paragraph)):
            parts.append([])
            size = 0
        parts[-1].append(paragraph)
        size += len(paragraph) + 2
    suffix = path.suffix.lower() if path.suffix.lower() in (".md", ".markdown") else ".txt"
    return [(f"{path.stem}-part-{i:04d}{suffix}", "\n\n".join(part) + "\n") for i, part in enumerate(parts, 1)]

