"""PDF (text layer), DOCX and PPTX to normalised Markdown with page boundaries.

Each format is read by its own library (pypdf, python-docx, python-pptx); this module only walks
their document models in reading order and writes what it finds with the helpers in ``markup``.
Converters take the file's bytes and raise ConversionError with the problem; the reader adds the
file name.
"""
from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from lexgraph.extract.markup import heading, join_blocks, markdown_table, normalise_text, plain_lines

# First bytes of the containers the office formats come in.
PDF_MAGIC = b"%PDF-"
ZIP_MAGIC = b"PK\x03\x04"
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# PDF readers accept a header anywhere in the first kilobyte (some writers prepend junk).
PDF_HEADER_WINDOW = 1024
_HEADING_STYLE = re.compile(r"heading\s*([1-9])$", re.IGNORECASE)
_SEPARATOR = "\n\n"


class ConversionError(Exception):
    """The file's content cannot be converted; the message says why (without the file name)."""


@dataclass(frozen=True)
class Converted:
    text: str  # normalised Markdown, ending in one newline
    page_starts: tuple[int, ...] = ()  # character offset where each page (or slide) begins
    title: str | None = None  # from the file's own metadata, when it has one


def _paged(pages: list[str], title: str | None = None) -> Converted:
    """Join page texts with a blank line, remembering where each page starts."""
    starts, parts, offset = [], [], 0
    for page in pages:
        if parts and page:
            offset += len(_SEPARATOR)
        starts.append(offset)
        if page:
            parts.append(page)
            offset += len(page)
    text = _SEPARATOR.join(parts)
    return Converted(text + "\n" if text else "", tuple(starts), title)


def _guard(kind: str, read: Callable[[], Converted]) -> Converted:
    """Any failure inside a format library on a malformed file becomes one readable message."""
    try:
        return read()
    except ConversionError:
        raise
    except Exception as exc:  # noqa: BLE001 - third-party parsers raise anything on corrupt input
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConversionError(f"corrupt or unreadable {kind} file ({detail})") from None


def container_problem(suffix: str, head: bytes) -> str | None:
    """Cheap check of the first bytes: is this plausibly the container the suffix promises?"""
    if suffix == ".pdf":
        return None if PDF_MAGIC in head[:PDF_HEADER_WINDOW] else "not a PDF file (no %PDF- header)"
    program = {".docx": "Word", ".pptx": "PowerPoint"}[suffix]
    if head.startswith(OLE_MAGIC):
        return (f"password-protected or legacy {program} file (an OLE container, not a {suffix} zip archive); "
                f"remove the password or save it as {suffix}")
    if not head.startswith(ZIP_MAGIC):
        return f"not a {suffix} file (not a zip archive)"
    return None


# --- PDF ---


def pdf_to_text(raw: bytes) -> Converted:
    """The text layer of every page; page i (1-based) starts at page_starts[i - 1]."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError

    def read() -> Converted:
        logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-but-readable files warn per object
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # an owner password alone still lets anyone read the text
            except (DependencyError, NotImplementedError) as exc:
                raise ConversionError(f"encrypted; cannot decrypt ({exc})") from None
            if not opened:
                raise ConversionError("encrypted; a password is needed to open it "
                                      "(save an unprotected copy to index it)")
        try:
            pages = [_page_text(page.extract_text()) for page in reader.pages]
        except FileNotDecryptedError:
            raise ConversionError("encrypted; a password is needed to open it") from None
        if not any(pages):
            raise ConversionError("no text layer; OCR is not configured (the pages are images or blank)")
        # No title from the metadata: writers fill it with names like "Microsoft Word - draft3.docx".
        return _paged(pages)

    return _guard("PDF", read)


def _page_text(text: str | None) -> str:
    lines = [line.rstrip() for line in normalise_text(text or "").split("\n")]
    return "\n".join(lines).strip("\n")


# --- DOCX ---


def _docx_heading_level(paragraph) -> int | None:
    """Heading 1..9 or Title, also through a custom style based on one; else the outline level."""
    style, depth = paragraph.style, 0
    while style is not None and depth < 8:
        name = (style.name or "").strip()
        if name.lower() == "title":
            return 1
        match = _HEADING_STYLE.match(name)
        if match:
            return min(6, int(match.group(1)))
        style, depth = style.base_style, depth + 1
    outline = paragraph._p.xpath("./w:pPr/w:outlineLvl/@w:val")
    if outline and outline[0].isdigit() and int(outline[0]) < 9:
        return min(6, int(outline[0]) + 1)
    return None


def _docx_is_list_item(paragraph) -> bool:
    if paragraph._p.xpath("./w:pPr/w:numPr"):
        return True
    name = (paragraph.style.name or "") if paragraph.style is not None else ""
    return name.lower().startswith("list")


def _docx_table(table) -> str:
    rows = []
    for row in table.rows:
        cells, previous = [], None
        for cell in row.cells:  # a cell spanning columns repeats: keep its text once
            cells.append("" if previous is not None and cell._tc is previous else cell.text)
            previous = cell._tc
        rows.append(cells)
    return markdown_table(rows)


def _docx_blocks(document) -> Iterator[str]:
    items: list[str] = []
    for part in document.iter_inner_content():  # body paragraphs and tables in document order
        if hasattr(part, "rows"):
            if items:
                yield "\n".join(items)
                items = []
            yield _docx_table(part)
            continue
        level = _docx_heading_level(part)
        text = part.text
        if level is not None and text.strip():
            if items:
                yield "\n".join(items)
                items = []
            yield heading(text, level)
        elif _docx_is_list_item(part) and text.strip():
            items.append("- " + plain_lines(text).replace("\n", " "))
        else:
            if items:
                yield "\n".join(items)
                items = []
            yield plain_lines(text)
    if items:
        yield "\n".join(items)


def docx_to_markdown(raw: bytes) -> Converted:
    """Body paragraphs and tables in order; heading styles become Markdown headings. Headers,
    footers, comments and footnotes are not body text and are left out."""
    import docx

    def read() -> Converted:
        document = docx.Document(io.BytesIO(raw))
        text = join_blocks(_docx_blocks(document))
        if not text.strip():
            raise ConversionError("document has no text")
        title = (document.core_properties.title or "").strip() or None
        return Converted(text + "\n", (), title)

    return _guard("DOCX", read)


# --- PPTX ---


def _pptx_shapes(shapes) -> Iterator:
    """Shapes in reading order (top to bottom, then left to right), groups opened."""
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    def position(shape):
        return (shape.top or 0, shape.left or 0)

    for shape in sorted(shapes, key=position):
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            yield from _pptx_shapes(shape.shapes)
        else:
            yield shape


def _pptx_slide(slide, number: int) -> str:
    title_shape = slide.shapes.title
    title = title_shape.text_frame.text if title_shape is not None and title_shape.has_text_frame else ""
    blocks = [heading(title, 1) or heading(f"Slide {number}", 1)]
    for shape in _pptx_shapes(slide.shapes):
        if title_shape is not None and shape.shape_id == title_shape.shape_id:
            continue
        if getattr(shape, "has_table", False) and shape.has_table:
            blocks.append(markdown_table([[cell.text for cell in row.cells] for row in shape.table.rows]))
        elif shape.has_text_frame:
            blocks.append(plain_lines("\n".join(p.text for p in shape.text_frame.paragraphs)))
    return join_blocks(blocks)


def pptx_to_markdown(raw: bytes) -> Converted:
    """One page per slide: the slide title as a heading, then its text frames and tables."""
    from pptx import Presentation

    def read() -> Converted:
        presentation = Presentation(io.BytesIO(raw))
        slides = [_pptx_slide(slide, n) for n, slide in enumerate(presentation.slides, start=1)]
        if not slides:
            raise ConversionError("presentation has no slides")
        title = (presentation.core_properties.title or "").strip() or None
        return _paged(slides, title)

    return _guard("PPTX", read)
