"""Structure-aware chunking sized for the embedder, with character offsets for citations.

Markdown headings become each chunk's heading path; tables and fenced code blocks stay whole
when they fit in one chunk; anything over the token budget is cut at sentence, then line, then
word-piece boundaries, so the embedder never truncates.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

_LINE = re.compile(r"[^\n]*\n?")
HEADING = re.compile(r"(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(r"(```|~~~)")
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


def markdown_blocks(text: str, markdown: bool = True) -> Iterator[Block]:
    """Headings, paragraphs, tables and fenced code blocks with their spans and heading path."""
    path: tuple[str, ...] = ()
    levels: tuple[int, ...] = ()
    open_start = open_end = -1
    open_kind = ""
    fence = ""

    def close() -> Iterator[Block]:
        nonlocal open_start, open_kind
        if open_start >= 0:
            yield Block(open_start, open_end, open_kind, path)
        open_start, open_kind = -1, ""

    for start, end, line in _lines(text):
        stripped = line.strip()
        if markdown and fence:
            open_end = end
            if stripped.startswith(fence):
                fence = ""
                yield from close()
            continue
        if markdown and _FENCE.match(stripped):
            yield from close()
            fence = stripped[:3]
            open_start, open_end, open_kind = start, end, "code"
            continue
        if not stripped:
            yield from close()
            continue
        heading = HEADING.match(stripped) if markdown else None
        if heading:
            yield from close()
            level = len(heading.group(1))
            keep = sum(1 for lv in levels if lv < level)
            levels = levels[:keep] + (level,)
            path = path[:keep] + (heading.group(2).strip(),)
            yield Block(start, end, "heading", path)
            continue
        kind = "table" if markdown and stripped.startswith("|") else "paragraph"
        if open_start >= 0 and open_kind != kind:
            yield from close()
        if open_start < 0:
            open_start, open_kind = start, kind
        open_end = end
    yield from close()


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


def _units(text: str, blocks: Iterable[Block], counter: TokenCounter, budget: int) -> Iterator[tuple[Block, int]]:
    """Blocks no larger than the budget, each with its token count."""
    pending: list[Block] = []

    def flush() -> Iterator[tuple[Block, int]]:
        counts = counter.count_tokens([text[b.start : b.end] for b in pending])
        for block, count in zip(pending, counts):
            if count <= budget:
                yield block, count
                continue
            pieces = _sentence_spans(text, block.start, block.end, by_line=block.kind in ("table", "code"))
            piece_counts = counter.count_tokens([text[s:e] for s, e in pieces])
            for (s, e), n in zip(pieces, piece_counts):
                if n <= budget:
                    yield Block(s, e, block.kind, block.heading_path), n
                    continue
                windows = _token_windows(text, s, e, counter, budget)
                for (ws, we), wn in zip(windows, counter.count_tokens([text[a:b] for a, b in windows])):
                    yield Block(ws, we, block.kind, block.heading_path), wn
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
