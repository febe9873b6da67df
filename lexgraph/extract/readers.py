"""Reading source files into normalised text, with a clear error for anything unreadable.

Every format becomes normalised Markdown (headings, pipe tables, fenced code) that the chunker
reads, plus where each page starts for formats that have pages (PDF pages, PPTX slides).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lexgraph.errors import FileProblem
from lexgraph.extract import office
from lexgraph.extract.chunking import markdown_blocks
from lexgraph.extract.markup import html_to_markdown, normalise_text
from lexgraph.ids import content_hash, document_id

TEXT_SUFFIXES = (".md", ".markdown", ".txt", ".text", ".html", ".htm")
BINARY_SUFFIXES = (".pdf", ".docx", ".pptx")
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + BINARY_SUFFIXES
# Formats whose text is not Markdown: chunked as plain paragraphs.
PLAIN_TEXT_FORMATS = ("text", "pdf")
# Bytes sniffed for binary content; NUL bytes never occur in real text files.
_SNIFF_BYTES = 8192
_TITLE_LINES = 20


class DocumentError(FileProblem):
    """A document that cannot be indexed; the message names the file and the problem."""


@dataclass(frozen=True)
class SourceDocument:
    doc_id: str
    uri: str
    relative_path: str
    title: str
    format: str  # "markdown" | "text" | "html" | "pdf" | "docx" | "pptx"
    text: str  # normalised Markdown (plain text for "text" and "pdf")
    content_hash: str  # of the raw bytes, so the sensor can compare without parsing
    size_bytes: int
    modified_at: datetime
    page_starts: tuple[int, ...] = ()  # offset in text where each page (slide) begins; empty without pages


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".md", ".markdown"):
        return "markdown"
    if suffix in (".html", ".htm"):
        return "html"
    if suffix in BINARY_SUFFIXES:
        return suffix[1:]
    return "text"


def decode_text(raw: bytes, path: str | Path) -> str:
    """UTF-8 text, or DocumentError saying why the bytes are not a text document."""
    if not raw:
        raise DocumentError(path, "file is empty")
    if b"\x00" in raw[:_SNIFF_BYTES]:
        raise DocumentError(path, "file looks binary (contains NUL bytes); only UTF-8 text is indexed")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        offset = exc.start + len(raw) - len(exc.object)  # utf-8-sig counts after the BOM
        raise DocumentError(path, f"file is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {offset})") from None
    if not text.strip():
        raise DocumentError(path, "file contains only whitespace")
    return text


def _title(text: str, path: Path, fallback: str | None = None) -> str:
    """The first heading in the first lines (ATX or setext), else the file's own title, else its name."""
    end = -1
    for _ in range(_TITLE_LINES):
        end = text.find("\n", end + 1)
        if end < 0:
            end = len(text)
            break
    for block in markdown_blocks(text[:end]):
        if block.kind == "heading" and block.heading_path:
            return block.heading_path[-1]
    return fallback or path.stem


def probe_problem(path: str | Path, raw: bytes) -> str | None:
    """What a cheap look at the bytes says is wrong with the file ("path: problem"), or None.

    Text formats must decode as UTF-8; binary formats only need a plausible container signature
    here (full parsing happens in read_document)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        return str(DocumentError(path, f"unsupported file type {suffix or '(none)'}; "
                                       f"expected one of {', '.join(SUPPORTED_SUFFIXES)}"))
    if suffix in TEXT_SUFFIXES:
        try:
            decode_text(raw, path)
        except DocumentError as error:
            return str(error)
        return None
    if not raw:
        return str(DocumentError(path, "file is empty"))
    problem = office.container_problem(suffix, raw[: office.PDF_HEADER_WINDOW])
    return str(DocumentError(path, problem)) if problem else None


def _convert(path: Path, raw: bytes, fmt: str) -> office.Converted:
    """Normalised Markdown of any supported format; DocumentError naming the file if it has none."""
    if fmt in ("pdf", "docx", "pptx"):
        problem = office.container_problem(path.suffix.lower(), raw[: office.PDF_HEADER_WINDOW]) if raw else "file is empty"
        if problem:
            raise DocumentError(path, problem)
        convert = {"pdf": office.pdf_to_text, "docx": office.docx_to_markdown, "pptx": office.pptx_to_markdown}[fmt]
        try:
            return convert(raw)
        except office.ConversionError as error:
            raise DocumentError(path, str(error)) from None
    text = normalise_text(decode_text(raw, path))
    if fmt == "html":
        text = html_to_markdown(text)
        if not text.strip():
            raise DocumentError(path, "HTML page has no visible text")
    return office.Converted(text)


def read_document(path: str | Path, root: str | Path | None = None) -> SourceDocument:
    """Read, validate and normalise one file. Raises DocumentError naming the file on bad input."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    # the path as found under root, links not resolved: a file reached through a linked folder keeps its
    # place in the inbox (and so its partition key)
    try:
        relative = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        relative = path.name
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DocumentError(path, f"unsupported file type {path.suffix or '(none)'}; expected one of {', '.join(SUPPORTED_SUFFIXES)}")
    try:
        raw = path.read_bytes()
        stat = path.stat()
    except FileNotFoundError:
        raise DocumentError(path, "file no longer exists (removed after it was scheduled)") from None
    except OSError as exc:
        raise DocumentError(path, f"cannot read file: {exc.strerror or exc}") from None
    fmt = file_format(path)
    converted = _convert(path, raw, fmt)
    return SourceDocument(
        doc_id=document_id(relative),
        uri=path.resolve().as_uri(),
        relative_path=relative,
        title=_title(converted.text, path, converted.title),
        format=fmt,
        text=converted.text,
        content_hash=content_hash(raw),
        size_bytes=stat.st_size,
        modified_at=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc),
        page_starts=converted.page_starts,
    )
