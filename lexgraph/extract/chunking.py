"""Structure-aware chunking sized for the embedder, with character offsets for citations.

Markdown headings become each chunk's heading path; tables and fenced code blocks stay whole
when they fit in one chunk; anything over the token budget is cut at lines (a line that fits stays whole:
a chat message, or a paragraph of a file with one per line), then sentences, then word pieces, so the
embedder never truncates.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

from markdown_it import MarkdownIt

_LINE = re.compile(r"[^\n]*\n?")
# The gap after a sentence end (and any closing quote or bracket, which stays with its sentence).
_SENTENCE_END = re.compile(r"[.!?;][\"')\]]*(?P<gap>\s+)|\n+")
# Blocks are token-counted in groups so a 50 MB file never tokenises in one call.
_COUNT_BATCH = 512
# Cut windows a little under the budget: word pieces re-tokenised after a cut may grow slightly.
_WINDOW_SLACK = 8


class TokenCounter(Protocol):
    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def token_spans(self, text: str) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class Block:
    start: int
    end: int
    kind: str  # heading | paragraph | table | code
    heading_path: tuple[str, ...]


@dataclass(frozen=True)
class Chunk:
    order: int
    text: str
    char_start: int
    char_end: int
    heading_path: tuple[str, ...]
    token_count: int


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end-without-newline, line) for every line, lazily."""
    for match in _LINE.finditer(text):
        if match.start() == match.end():
            break
        line = match.group().rstrip("\n")
        yield match.start(), match.start() + len(line), line


def _paragraph_blocks(text: str) -> Iterator[Block]:
    """Plain text: runs of non-blank lines are paragraphs; nothing is read as Markdown."""
    open_start = open_end = -1
    for start, end, line in _lines(text):
        if not line.strip():
            if open_start >= 0:
                yield Block(open_start, open_end, "paragraph", ())
            open_start = -1
            continue
        if open_start < 0:
            open_start = start
        open_end = end
    if open_start >= 0:
        yield Block(open_start, open_end, "paragraph", ())


# Top-level markdown-it tokens and the block kind each one is.
_KINDS = {
    "heading_open": "heading", "paragraph_open": "paragraph", "fence": "code", "code_block": "code",
    "table_open": "table", "bullet_list_open": "paragraph", "ordered_list_open": "paragraph",
    "blockquote_open": "paragraph", "html_block": "paragraph",
}
# Lines parsed at a time by the CommonMark parser.
_WINDOW_LINES = 4096
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _commonmark() -> MarkdownIt:
    """CommonMark block rules plus GFM tables; inline parsing is skipped (only block spans are needed)."""
    parser = MarkdownIt("commonmark").enable("table")
    parser.disable(["inline", "text_join"], ignoreInvalid=True)
    return parser


_PARSER = _commonmark()


def _top_level_blocks(text: str, line_starts: list[int]) -> Iterator[tuple[int, int, str, str, int]]:
    """(first line, end line, kind, heading text, heading level) of each top-level CommonMark block.

    The text is parsed in windows of lines so a huge file never becomes one token list. Only the
    last block of a window can still grow (a paragraph continued, a fence not yet closed, a
    setext underline below it), so it is parsed again at the head of the next window.
    """
    total = len(line_starts) - 1
    first, window = 0, _WINDOW_LINES
    while first < total:
        last = min(total, first + window)
        tokens = _PARSER.parse(text[line_starts[first] : line_starts[last]])
        blocks = []
        for index, token in enumerate(tokens):
            if token.level != 0 or token.nesting < 0 or token.map is None:
                continue
            kind = _KINDS.get(token.type)
            if kind is None:
                continue  # thematic breaks carry no text
            title, level = "", 0
            if kind == "heading":
                title, level = " ".join(tokens[index + 1].content.split()), int(token.tag[1])
            blocks.append((first + token.map[0], first + token.map[1], kind, title, level))
        if last < total and blocks and blocks[-1][0] > first:
            yield from blocks[:-1]
            first, window = blocks[-1][0], _WINDOW_LINES
        elif last < total and not blocks:
            first = last  # only blank lines, rules or link definitions: nothing can continue
        elif last < total:
            window *= 2  # one block fills the window: widen it
        else:
            yield from blocks
            return


def markdown_blocks(text: str, markdown: bool = True) -> Iterator[Block]:
    """Headings (ATX and setext), paragraphs, lists, tables and fenced or indented code blocks, as
    CommonMark reads them, with their character spans and heading path. markdown=False: paragraphs."""
    if not markdown:
        yield from _paragraph_blocks(text)
        return
    # Line i spans [line_starts[i], line_starts[i + 1]); markdown-it counts \r\n, \r and \n as one break each.
    line_starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]
    if line_starts[-1] != len(text):
        line_starts.append(len(text))
    path: tuple[str, ...] = ()
    levels: tuple[int, ...] = ()
    for first, end_line, kind, title, level in _top_level_blocks(text, line_starts):
        start, end = line_starts[first], line_starts[end_line]
        while end > start and text[end - 1].isspace():
            end -= 1
        if end <= start:
            continue
        if kind == "heading" and title:
            keep = sum(1 for lv in levels if lv < level)
            levels = levels[:keep] + (level,)
            path = path[:keep] + (title,)
        yield Block(start, end, kind, path)


def _sentence_spans(text: str, start: int, end: int, by_line: bool) -> list[tuple[int, int]]:
    """Sub-spans of [start, end): lines for tables and code, sentences for prose."""
    segment = text[start:end]
    splitter = re.compile(r"\n") if by_line else _SENTENCE_END
    spans, cursor = [], 0
    for match in splitter.finditer(segment):
        cut = match.start("gap") if splitter.groupindex and match.group("gap") else match.start()
        if cut > cursor:
            spans.append((start + cursor, start + cut))
        cursor = match.end()
    if cursor < len(segment):
        spans.append((start + cursor, end))
    return [(s, e) for s, e in spans if text[s:e].strip()]


def _token_windows(text: str, start: int, end: int, counter: TokenCounter, budget: int) -> list[tuple[int, int]]:
    """Cut [start, end) into pieces of at most budget word pieces, preferring word boundaries."""
    spans = counter.token_spans(text[start:end])
    windows, first = [], 0
    size = max(1, budget - _WINDOW_SLACK)
    while first < len(spans):
        last = min(first + size, len(spans)) - 1
        if last + 1 < len(spans):
            # step back to a token that ends a word, so no word is split across chunks
            for candidate in range(last, first, -1):
                if spans[candidate + 1][0] > spans[candidate][1]:
                    last = candidate
                    break
        windows.append((start + spans[first][0], start + spans[last][1]))
        first = last + 1
    return windows


def _split(text: str, block: Block, counter: TokenCounter, budget: int) -> Iterator[tuple[Block, int]]:
    """An over-budget block cut at lines first (a chat message, a plain-text paragraph stays whole when it
    fits), then a line still over budget at sentences, then at word pieces."""
    def piece(start: int, end: int) -> Block:
        return Block(start, end, block.kind, block.heading_path)

    for (s, e), n in _counted(text, _sentence_spans(text, block.start, block.end, by_line=True), counter):
        if n <= budget:
            yield piece(s, e), n
            continue
        sentences = [(s, e)] if block.kind in ("table", "code") else _sentence_spans(text, s, e, by_line=False)
        for (ss, se), sn in _counted(text, sentences, counter):
            if sn <= budget:
                yield piece(ss, se), sn
                continue
            for (ws, we), wn in _counted(text, _token_windows(text, ss, se, counter, budget), counter):
                yield piece(ws, we), wn


def _counted(text: str, spans: list[tuple[int, int]], counter: TokenCounter) -> Iterator:
    """Each span with its word-piece count, counted in one call."""
    return zip(spans, counter.count_tokens([text[a:b] for a, b in spans]))


def _units(text: str, blocks: Iterable[Block], counter: TokenCounter, budget: int) -> Iterator[tuple[Block, int]]:
    """Blocks no larger than the budget, each with its token count."""
    pending: list[Block] = []

    def flush() -> Iterator[tuple[Block, int]]:
        counts = counter.count_tokens([text[b.start : b.end] for b in pending])
        for block, count in zip(pending, counts):
            if count <= budget:
                yield block, count
                continue
            yield from _split(text, block, counter, budget)
        pending.clear()

    for block in blocks:
        pending.append(block)
        if len(pending) >= _COUNT_BATCH:
            yield from flush()
    yield from flush()


def chunk_text(text: str, counter: TokenCounter, max_tokens: int, markdown: bool = True) -> Iterator[Chunk]:
    """Pack structural units into chunks of at most max_tokens word pieces, lazily."""
    if max_tokens < 16:
        raise ValueError(f"max_tokens must be at least 16, got {max_tokens}")
    order = 0
    current: list[tuple[Block, int]] = []

    def emit() -> Iterator[Chunk]:
        nonlocal order
        if not current:
            return
        start, end = current[0][0].start, current[-1][0].end
        content = [b for b, _ in current if b.kind != "heading"] or [current[-1][0]]
        yield Chunk(order, text[start:end], start, end, content[0].heading_path, sum(n for _, n in current))
        order += 1
        current.clear()

    for unit, count in _units(text, markdown_blocks(text, markdown), counter, max_tokens):
        used = sum(n for _, n in current)
        has_content = any(b.kind != "heading" for b, _ in current)
        new_section = unit.kind == "heading" and has_content
        # Pieces of one cut word re-tokenise to more word pieces when joined: never repack them.
        abuts = bool(current) and unit.start == current[-1][0].end
        if current and (new_section or abuts or used + count > max_tokens):
            yield from emit()
        current.append((unit, count))
    yield from emit()
