"""Normalised Markdown-ish text: the one shape every reader hands to the chunker.

HTML goes through markdownify (tables stay Markdown tables, ``<pre>`` stays a fenced code block);
the office readers use the helpers here to write headings, tables and plain paragraphs the same way.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Sequence

from markdownify import MarkdownConverter

# A line the CommonMark block parser would read as structure rather than as plain text.
_BLOCK_MARKER = re.compile(r"(#{1,6}(?:[ \t]|$)|`{3,}|~{3,}|>|\||=+[ \t]*$|-+[ \t]*$|[*_][ \t]*[*_][ \t]*[*_])")
_BACKTICK_RUN = re.compile(r"`+")


def normalise_text(text: str) -> str:
    """Unix newlines and NFC, so offsets and hashes do not depend on the editor that wrote the file."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


def plain_lines(text: str) -> str:
    """Text from a document model as Markdown that reads back as the same plain lines: no line is
    taken for a heading, fence, quote, table or rule, and none is indented into a code block."""
    lines = []
    for line in normalise_text(text).replace("\v", "\n").split("\n"):
        line = line.strip()
        if line:
            lines.append("\\" + line if _BLOCK_MARKER.match(line) else line)
    return "\n".join(lines)


def heading(text: str, level: int) -> str:
    title = " ".join(normalise_text(text).split())
    return f"{'#' * max(1, min(6, level))} {title}" if title else ""


def _cell(text: str) -> str:
    return " ".join(normalise_text(text).split()).replace("|", "\\|")


def markdown_table(rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-style pipe table; the first row is the header, short rows are padded."""
    cells = [[_cell(c) for c in row] for row in rows]
    cells = [row for row in cells if any(row)]
    if not cells:
        return ""
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + " --- |" * width]
    lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    return "\n".join(lines)


def join_blocks(blocks: Iterable[str]) -> str:
    return "\n\n".join(b for b in blocks if b.strip())


class _HtmlConverter(MarkdownConverter):
    """markdownify with the few choices an index needs: no page chrome or emphasis marks, cells
    that cannot break the table, and code fences longer than any backtick run inside them."""

    def convert_td(self, el, text, parent_tags):
        return super().convert_td(el, text.replace("|", "\\|"), parent_tags)

    def convert_th(self, el, text, parent_tags):
        return super().convert_th(el, text.replace("|", "\\|"), parent_tags)

    def convert_pre(self, el, text, parent_tags):
        text = text.strip("\n")
        if not text.strip():
            return ""
        fence = "`" * max(3, 1 + max((len(run) for run in _BACKTICK_RUN.findall(text)), default=0))
        return f"\n\n{fence}\n{text}\n{fence}\n\n"

    def _drop(self, el, text, parent_tags):
        return ""

    def _text_only(self, el, text, parent_tags):
        return text

    def convert_img(self, el, text, parent_tags):
        return el.attrs.get("alt", "") or ""

    # Emphasis marks and link targets are noise to the embedder and to BM25; the words stay.
    convert_a = convert_b = convert_strong = convert_em = convert_i = convert_u = _text_only

    # <title> is browser chrome, not body text; noscript and template hold alternates, not content.
    convert_title = convert_noscript = convert_template = convert_script = convert_style = _drop


def html_to_markdown(markup: str) -> str:
    """Visible text of an HTML page as Markdown: ATX headings, pipe tables, fenced ``<pre>``."""
    converter = _HtmlConverter(heading_style="ATX", bullets="-", escape_asterisks=False,
                               escape_underscores=False, table_infer_header=True)
    text = normalise_text(converter.convert(markup)).strip()
    return text + "\n" if text else ""
