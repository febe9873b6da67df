"""Deterministic, filesystem-safe ids: re-running anything is idempotent; and the key by which evidence ids
(a benchmark question's, a hit's) name a document."""
from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import PurePosixPath

_UNSAFE = re.compile(r"[^a-z0-9._-]+")
# File endings dropped from evidence ids and file names alike, so "a.md", "A" and "a" agree.
_TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".html", ".htm"}
# Some evidence ids carry their chat header ("Time: 20260930_16:00"): a leading "word: " label goes.
_EVIDENCE_LABEL = re.compile(r"^[A-Za-z]+:\s+(?=\S)")


def content_hash(data: bytes | str) -> str:
    """sha256 hex digest of bytes or UTF-8 text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def file_hash(path) -> str:
    """sha256 hex digest of a file's bytes, read in blocks (equal to content_hash of its bytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def short_hash(text: str, length: int = 10) -> str:
    return content_hash(text)[:length]


def document_id(relative_path: str) -> str:
    """Stable partition key for a file: readable slug of its path plus a hash of the exact path.

    The slug keeps keys legible in the Dagster UI; the hash keeps two paths that slug alike
    (``a b.md`` and ``a_b.md``, or names differing only in non-ASCII letters) apart.
    """
    # NFC: macOS writes decomposed names; the same name must give the same key everywhere.
    posix = unicodedata.normalize("NFC", relative_path.replace("\\", "/").strip("/"))
    folded = unicodedata.normalize("NFKD", posix).encode("ascii", "ignore").decode("ascii").lower()
    slug = _UNSAFE.sub("-", folded.replace("/", "--")).strip("-.")[:80] or "doc"
    return f"{slug}-{short_hash(posix, 8)}"


def chunk_id(doc_id: str, order: int, text: str) -> str:
    """A chunk's id changes when its document, position or text changes."""
    return f"{doc_id}-c{order:05d}-{short_hash(text, 8)}"


def normalise_evidence_id(value: str) -> str:
    """A document key comparable between evidence ids and file paths.

    A leading "label: " dropped ("Time: 20260930_16:00"), then the last path component, a
    text-file extension dropped, ':' dropped (LiHua-World's evidence "20260121_10:00" names the
    file 20260121_1000.txt), case folded, whitespace collapsed.
    """
    name = PurePosixPath(_EVIDENCE_LABEL.sub("", str(value).strip()).replace("\\", "/")).name
    suffix = PurePosixPath(name).suffix
    if suffix.lower() in _TEXT_SUFFIXES:
        name = name[: -len(suffix)]
    name = unicodedata.normalize("NFC", name).replace(":", "").casefold()
    return " ".join(name.split())


def document_key(relative_path: str) -> str:
    """The key of an indexed file, by which evidence ids find it (a Hit's doc_key)."""
    return normalise_evidence_id(relative_path)
