"""Errors about one input file: the message always names the file and the problem."""
from __future__ import annotations

from pathlib import Path


class FileProblem(Exception):
    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
