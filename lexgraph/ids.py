"""Deterministic, filesystem-safe ids: re-running anything is idempotent."""
from __future__ import annotations

import hashlib
import re
import unicodedata

_UNSAFE = re.compile(r"[^a-z0-9._-]+")


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
