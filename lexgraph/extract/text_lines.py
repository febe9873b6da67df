"""A chunk's text as lines an extractor can read: the format, not the language.

Markdown and chat logs carry meaning in their layout, which a sentence parser does not see:

- headings set the topic of what follows and are no statements;
- list markers, quote markers, emphasis, links and inline tags are dropped; code blocks are skipped;
- a table row becomes "Header: cell; Header: cell", with each cell's span kept (the row's facts);
- a chat line ("WolfgangSchulz: ...") keeps its speaker, written as words ("Wolfgang Schulz"), so that
  each of its sentences can be read alone. A prefix is a speaker when it is one CamelCase word, or when
  the chunk reads like a conversation (the prefix speaks twice, or two others speak); e-mail header
  keys ("From:", "Subject:") never are.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

HEADING_SEPARATOR = " > "
MAX_STATEMENT_CHARS = 600

_CAMEL = re.compile(r"^[A-Z][a-z]+(?:[A-Z][a-z]+)+$")
_CAMEL_SPLIT = re.compile(r"(?<=[a-z])(?=[A-Z])")
_SPEAKER = re.compile(r"^(?P<speaker>[A-Z][A-Za-z]*(?:[ .'-][A-Z][A-Za-z]*){0,2}):[ \t]+(?P<message>\S.*)$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$")
_LIST_MARKER = re.compile(r"^\s*(?:>\s*)*(?:[-*+•]|\d{1,3}[.)])\s+")
_QUOTE_MARKER = re.compile(r"^\s*(?:>\s*)+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_TAG = re.compile(r"<[^<>\n]{1,200}>")
_EMPHASIS = re.compile(r"\*{1,3}|(?<![\w])_{1,3}|_{1,3}(?![\w])|`+")

# "Key: value" prefixes of e-mails, memos and forms: never a chat speaker.
HEADER_KEYS = frozenset(
    """from to cc bcc date time subject sent re fw fwd note notes attachment attachments status summary decision
    action actions question answer q a example warning important result results conclusion background purpose
    scope update reference ref tel phone email e-mail fax address location agenda minutes present apologies
    chair total source sources author title version step tip objective outcome owner deadline comment comments
    response recommendation risk issue resolution motion vote item price cost amount payment delivery warranty
    timing funding customers customer supplier term terms definition definitions remarks remark""".split()
)


@dataclass
class Line:
    kind: str  # "text", "chat", "table"
    text: str
    topic: str
    speaker: str = ""
    cells: list[tuple[str, str]] = field(default_factory=list)  # (header, cell) for table rows
    spans: list[tuple[int, int]] = field(default_factory=list)  # each cell's span in ``text``


def clean_inline(text: str) -> str:
    if "](" in text:
        text = _LINK.sub(r"\1", _IMAGE.sub(r"\1", text))
    if "<" in text:
        text = _TAG.sub(" ", text)
    if "*" in text or "_" in text or "`" in text:
        text = _EMPHASIS.sub("", text)
    return " ".join(text.split())


def trim(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters (with "…")."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def pieces(sentence: str, limit: int = MAX_STATEMENT_CHARS) -> Iterable[str]:
    """The sentence, cut at word boundaries when it is longer than a statement should be."""
    while len(sentence) > limit:
        cut = sentence.rfind(" ", limit // 2, limit)
        cut = cut if cut > 0 else limit
        yield sentence[:cut].strip()
        sentence = sentence[cut:].strip()
    if sentence:
        yield sentence


def speaker_name(raw: str) -> str:
    return " ".join(_CAMEL_SPLIT.sub(" ", raw).split()) if _CAMEL.match(raw) else raw


def _table_cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [clean_inline(cell) for cell in re.split(r"(?<!\\)\|", body)]


def _is_speaker(raw: str, prefixes: Counter) -> bool:
    if raw.casefold() in HEADER_KEYS or " " in raw:
        return False
    if _CAMEL.match(raw):
        return True
    others = sum(count for name, count in prefixes.items() if name.casefold() not in HEADER_KEYS)
    return prefixes[raw] >= 2 or others >= 2


def _table_line(cells: list[str], header: list[str], topic: str) -> Line | None:
    named = [(header[i] if i < len(header) else "", cell) for i, cell in enumerate(cells)]
    named = [(head, cell) for head, cell in named if cell]
    if not named:
        return None
    if sum(len(head) + len(cell) for head, cell in named) > 4 * MAX_STATEMENT_CHARS:
        return Line("text", " ".join(cell for _, cell in named), topic)  # read like prose
    parts, spans, length = [], [], 0
    for head, cell in named:
        label = f"{head}: " if head else ""
        start = length + (2 if parts else 0) + len(label)
        parts.append(label + cell)
        spans.append((start, start + len(cell)))
        length = start + len(cell)
    return Line("table", "; ".join(parts), topic, cells=named, spans=spans)


def read_lines(text: str, heading_path: str = "") -> list[Line]:
    """The chunk's lines with their kind and topic; ``heading_path`` is its headings joined by " > "."""
    headings = [part for part in heading_path.split(HEADING_SEPARATOR) if part.strip()] if heading_path else []
    topic = clean_inline(headings[-1].lstrip("#")) if headings else ""
    raw = text.splitlines()
    prefixes = Counter(match.group("speaker") for line in raw if (match := _SPEAKER.match(line)))
    lines: list[Line] = []
    in_code = False
    header: list[str] = []
    for index, line in enumerate(raw):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code or not line.strip():
            if not line.strip():
                header = []
            continue
        heading = _HEADING.match(line)
        if heading:
            topic = clean_inline(heading.group(2)) or topic
            header = []
            continue
        if line.lstrip().startswith("|") or (header and "|" in line):
            if _TABLE_SEPARATOR.match(line):
                continue
            cells = _table_cells(line)
            following = raw[index + 1] if index + 1 < len(raw) else ""
            if _TABLE_SEPARATOR.match(following):
                header = cells
                continue
            row = _table_line(cells, header, topic)
            if row is not None:
                lines.append(row)
            continue
        header = []
        speaker = _SPEAKER.match(line)
        if speaker and _is_speaker(speaker.group("speaker"), prefixes):
            lines.append(Line("chat", clean_inline(speaker.group("message")), topic,
                              speaker=speaker_name(speaker.group("speaker"))))
            continue
        body = _LIST_MARKER.sub("", line, count=1)
        body = _QUOTE_MARKER.sub("", body, count=1)
        lines.append(Line("text", clean_inline(body), topic))
    return [line for line in lines if line.text and any(c.isalnum() for c in line.text)]
