"""Per-document Extract output as Parquet: the stores are rebuilt from these files, never from LLM calls."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl


class ExtractStore:
    """One Parquet file per (stage, document) under an index version's folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, stage: str, doc_id: str) -> Path:
        return self.root / stage / f"{doc_id}.parquet"

    def write(self, stage: str, doc_id: str, frame: pl.DataFrame) -> Path:
        """Atomic replace: a run killed mid-write leaves the previous file, never a torn one."""
        target = self.path(stage, doc_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        frame.write_parquet(partial)
        os.replace(partial, target)
        return target

    def read(self, stage: str, doc_id: str) -> pl.DataFrame:
        path = self.path(stage, doc_id)
        if not path.exists():
            raise FileNotFoundError(f"no {stage} output for document {doc_id} at {path}; materialize {stage} first")
        return pl.read_parquet(path)

    def exists(self, stage: str, doc_id: str) -> bool:
        return self.path(stage, doc_id).exists()

    def doc_ids(self, stage: str) -> list[str]:
        folder = self.root / stage
        return sorted(p.stem for p in folder.glob("*.parquet")) if folder.exists() else []

    def scan(self, stage: str) -> pl.LazyFrame | None:
        """All documents' output of one stage as one lazy frame (None when there is none)."""
        files = sorted((self.root / stage).glob("*.parquet")) if (self.root / stage).exists() else []
        return pl.scan_parquet(files) if files else None

    def delete_document(self, doc_id: str) -> int:
        removed = 0
        if self.root.exists():
            for stage_dir in self.root.iterdir():
                path = stage_dir / f"{doc_id}.parquet"
                if path.exists():
                    path.unlink()
                    removed += 1
        return removed
