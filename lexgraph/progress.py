"""Process-wide progress: stage functions say what they did, whoever runs them shows it (or not).

The stages run inside Dagster steps, far from the command line, so they cannot be handed a
progress bar; they call `start` and `advance` here instead. By default nothing is shown; the
CLI's runner installs a reporter around its runs with `reporting(...)`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class Reporter(Protocol):
    def start(self, stage: str, total: int, unit: str) -> None:
        """A stage begins work on `total` units (documents, chunks, sentences)."""

    def advance(self, stage: str, n: int) -> None:
        """`n` more units of the stage are done."""


class Silent:
    def start(self, stage: str, total: int, unit: str) -> None:
        pass

    def advance(self, stage: str, n: int) -> None:
        pass


_reporter: Reporter = Silent()
# The stage at hand, [name, total, unit, done], so that a nested step can show itself and hand back.
_current: list = ["", 0, "", 0]


def start(stage: str, total: int, unit: str = "documents") -> None:
    _current[:] = [stage, total, unit, 0]
    _reporter.start(stage, total, unit)


def advance(stage: str, n: int = 1) -> None:
    if n:
        if stage == _current[0]:
            _current[3] += n
        _reporter.advance(stage, n)


@contextmanager
def nested(label: str, total: int, unit: str) -> Iterator["Counter"]:
    """A long step inside the stage at hand (e.g. the statements embedded inside "lexical graph"),
    shown as "<stage>: <label>" per batch; the enclosing stage is shown again, as far as it was, after."""
    outer = list(_current)
    stage = f"{outer[0]}: {label}" if outer[0] else label
    start(stage, total, unit)
    counter = Counter(stage)
    try:
        yield counter
    finally:
        if outer[0]:
            start(*outer[:3])
            advance(outer[0], outer[3])
        else:
            _current[:] = outer


class Counter:
    """A per-batch callback (e.g. for Embedder.embed) that advances a stage and remembers how far."""

    def __init__(self, stage: str):
        self.stage, self.done = stage, 0

    def __call__(self, n: int) -> None:
        self.done += n
        advance(self.stage, n)

    def finish(self, total: int) -> None:
        """Count the rest up to total (an embedder reports distinct texts; repeats cost nothing)."""
        advance(self.stage, max(total - self.done, 0))
        self.done = max(total, self.done)


def counter(stage: str) -> Counter:
    return Counter(stage)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Send the progress of everything run inside the block to `reporter`."""
    global _reporter
    previous, _reporter = _reporter, reporter
    try:
        yield reporter
    finally:
        _reporter = previous
