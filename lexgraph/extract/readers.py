"""Reading source files into normalised text, with a clear error for anything unreadable."""
from __future__ import annotations

import html.parser
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lexgraph.extract.chunking import HEADING
from lexgraph.errors import FileProblem
from lexgraph.ids import content_hash, document_id

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".text", ".html", ".htm")
# Bytes sniffed for binary content; NUL bytes never occur in real text files.
_SNIFF_BYTES = 8192


class DocumentError(FileProblem):
    """A document that cannot be indexed; the message names the file and the problem."""


@dataclass(frozen=True)
class SourceDocument:
    doc_id: str
    uri: str
    relative_path: str
    title: str
    format: str  # "markdown" | "text" | "html"
    text: str
    content_hash: str  # of the raw bytes, so the sensor can compare without parsing
    size_bytes: int
    modified_at: datetime


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".md", ".markdown"):
        return "markdown"
    if suffix in (".html", ".htm"):
        return "html"
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


def normalise_text(text: str) -> str:
    """Unix newlines and NFC, so offsets and hashes do not depend on the editor that wrote the file."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


class _HtmlToMarkdown(html.parser.HTMLParser):
    """Visible text of an HTML page, headings kept as Markdown headings so chunking sees them."""

    _BLOCKS = {"p", "div", "li", "tr", "br", "section", "article", "table", "ul", "ol", "pre", "blockquote"}
    # Not "head": HTML5 may omit </head>, which would then swallow the whole body.
    _SKIP = {"script", "style", "title", "noscript", "template"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self._SKIP:
            self._skip_depth += 1
        elif self._skip_depth:
            return
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in self._BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif self._skip_depth:
            return
        elif re.fullmatch(r"h[1-6]", tag) or tag in self._BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self._skip_depth:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_text(markup: str) -> str:
    parser = _HtmlToMarkdown()
    parser.feed(markup)
    parser.close()
    text = "".join(parser.parts)
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _title(text: str, path: Path) -> str:
    for line in text.splitlines()[:20]:
        match = HEADING.match(line.strip())
        if match and match.group(2):
            return match.group(2).strip()
    return path.stem


def read_document(path: str | Path, root: str | Path | None = None) -> SourceDocument:
    """Read, validate and normalise one file. Raises DocumentError naming the file on bad input."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    try:
        relative = path.resolve().relative_to(Path(root).resolve()).as_posix()
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
    text = normalise_text(decode_text(raw, path))
    fmt = file_format(path)
    if fmt == "html":
        text = html_to_text(text)
        if not text.strip():
            raise DocumentError(path, "HTML page has no visible text")
    return SourceDocument(
        doc_id=document_id(relative),
        uri=path.resolve().as_uri(),
        relative_path=relative,
        title=_title(text, path),
        format=fmt,
        text=text,
        content_hash=content_hash(raw),
        size_bytes=stat.st_size,
        modified_at=datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc),
    )
