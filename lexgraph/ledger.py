"""The one cost ledger: a row for every model call, LLM or embedding, cache hits included.

Stored as a folder of Parquet part files written with polars, one per ``record()`` batch:
``<folder>/part-<UTC time>-<pid>-<random>.parquet``. A part is written to a hidden temporary
name and renamed into place, so a reader sees whole parts or none, concurrent writers (threads or
processes) never touch the same file, and a writer killed mid-batch leaves at most a hidden
temporary file that readers ignore. A part damaged some other way (a truncated copy, a full disk)
is skipped by ``read()`` with a warning that names it; every other part still counts.

Every row has a ``row_id`` (random unless given) and ``read()`` keeps one row per id, so parts can be
merged without a window in which a crash double-counts: ``merge(parts)`` writes one part holding
the rows of several, then deletes them; killed in between, both copies exist and count once. The
extraction stage uses it to make every paid LLM call durable at once (one part per call, written
right after the call, before its answer is cached) and still leave one part per document.

Every cost figure (asset metadata, ``lexgraph cost``, the bench) is read from here, never recounted.
"""
from __future__ import annotations

import datetime as dt
import os
import uuid
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import polars as pl
import pyarrow.parquet as pq

from lexgraph.storage.extract_store import parquet_problem

SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String(),
    "stage": pl.String(),
    "doc_id": pl.String(),
    "chunk_id": pl.String(),
    "model": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "seconds": pl.Float64(),
    "cache_hit": pl.Boolean(),
    "outcome": pl.String(),
    "attempts": pl.Int64(),  # HTTP requests behind this row (retries included); 0 for a cache hit
    "at": pl.Datetime("us", "UTC"),
    "row_id": pl.String(),  # unique per row; a row read twice (a merge killed midway) counts once
}
REQUIRED = ("run_id", "stage", "model")
DEFAULTS = {"doc_id": None, "chunk_id": None, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0,
            "cache_hit": False, "outcome": "ok"}
PART_GLOB = "part-*.parquet"


class LedgerWarning(UserWarning):
    """A ledger part that cannot be read; it is skipped and named."""


class LedgerError(ValueError):
    """A row that cannot be recorded (a required column missing, an unknown column, a bad value)."""


def _row(raw: Mapping, now: dt.datetime) -> dict:
    unknown = set(raw) - set(SCHEMA)
    if unknown:
        raise LedgerError(f"unknown ledger column(s) {sorted(unknown)}; columns are {list(SCHEMA)}")
    missing = [name for name in REQUIRED if not raw.get(name)]
    if missing:
        raise LedgerError(f"ledger row lacks {missing}: {dict(raw)!r}")
    row = {**DEFAULTS, **raw}
    row.setdefault("attempts", 0 if row["cache_hit"] else 1)
    at = row.get("at") or now
    if at.tzinfo is None:
        raise LedgerError(f"ledger 'at' must be timezone-aware (UTC), got {at!r}")
    row["at"] = at.astimezone(dt.timezone.utc)
    for name in ("prompt_tokens", "completion_tokens", "attempts"):
        row[name] = int(row[name] or 0)
        if row[name] < 0:
            raise LedgerError(f"ledger {name} must not be negative, got {row[name]}")
    row["seconds"] = float(row["seconds"] or 0.0)
    row["cache_hit"] = bool(row["cache_hit"])
    row["row_id"] = str(row.get("row_id") or uuid.uuid4().hex)
    return {name: row.get(name) for name in SCHEMA}


def _conformed(frame: pl.DataFrame) -> pl.DataFrame:
    """A part's rows in the current schema (columns added since it was written are null)."""
    return frame.select([pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype).alias(name)
                         for name, dtype in SCHEMA.items()])


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def _may_hold(part: Path, run_id: str) -> bool:
    """False only when the part's footer statistics (min and max run_id of each row group) rule this run out:
    a part is one batch of one run, so a run's totals read its own few parts, not the whole ledger."""
    try:
        meta = pq.read_metadata(part)
        column = meta.schema.names.index("run_id")
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(column).statistics
            if stats is None or not stats.has_min_max or stats.min <= run_id <= stats.max:
                return True
        return False
    except Exception:  # noqa: BLE001 - no usable footer: read() reads the part and names its damage
        return True


class CostLedger:
    """Append-only cost ledger in ``folder`` (created on first write)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def record(self, rows: Iterable[Mapping]) -> Path | None:
        """Append a batch of rows as one new part file; returns its path (None for an empty batch).

        Each row needs run_id, stage and model; doc_id, chunk_id, tokens, seconds, cache_hit, outcome,
        attempts and at (UTC, default now) are optional.
        """
        now = dt.datetime.now(dt.timezone.utc)
        checked = [_row(raw, now) for raw in rows]
        if not checked:
            return None
        return self._write(pl.DataFrame(checked, schema=SCHEMA, orient="row"), now)

    def merge(self, parts: Sequence[Path]) -> Path | None:
        """Replace these parts (of this ledger) by one holding all their rows; returns it (None for no parts).
        Written before the old parts are deleted: a merge killed midway leaves rows twice, with the same
        row_id, and read() counts them once."""
        parts = [Path(part) for part in parts]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        try:
            frame = pl.concat([_conformed(pl.read_parquet(part)) for part in parts], how="vertical")
        except (Exception, pl.exceptions.PanicException) as error:  # merging only saves files: keep them as they are
            warnings.warn(f"cost ledger: parts not merged ({type(error).__name__}: {error})", LedgerWarning,
                          stacklevel=2)
            return None
        merged = self._write(frame, dt.datetime.now(dt.timezone.utc))
        for part in parts:
            part.unlink(missing_ok=True)
        return merged

    def _write(self, frame: pl.DataFrame, now: dt.datetime) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = now.strftime("%Y%m%dT%H%M%S%fZ")
        name = f"part-{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        target = self.folder / name
        partial = self.folder / f".{name}.tmp"
        try:
            frame.write_parquet(partial)
            with open(partial, "rb") as handle:  # the rename must not overtake the data on a crash
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return target

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob(PART_GLOB)) if self.folder.is_dir() else []

    def read(self, run_id: str | None = None) -> pl.DataFrame:
        """Every row of every readable part; a damaged part is skipped with a LedgerWarning naming it. With
        ``run_id``, that run's rows only, reading only the parts whose footer does not rule the run out (a part
        damaged past its footer is then named only when it may hold the run's rows)."""
        frames = []
        for part in self.parts():
            if run_id is not None and not _may_hold(part, run_id):
                continue
            problem = parquet_problem(part, footer=False)  # cheap: magic bytes and footer length
            if problem is None:
                try:
                    frames.append(_conformed(pl.read_parquet(part)))
                    continue
                except (Exception, pl.exceptions.PanicException) as error:
                    problem = f"unreadable Parquet ({type(error).__name__}: {error})"
            warnings.warn(f"cost ledger: skipping damaged part {part}: {problem}", LedgerWarning, stacklevel=2)
        if not frames:
            return empty_frame()
        data = pl.concat(frames, how="vertical")
        if run_id is not None:
            data = data.filter(pl.col("run_id") == run_id)
        # one row per row_id (parts written before row ids existed have none: each of their rows counts)
        data = data.filter(pl.col("row_id").is_null() | pl.col("row_id").is_first_distinct())
        return data.sort("at", maintain_order=True)

    def totals(self, by: Sequence[str] = ("stage", "model"), *, run_id: str | None = None,
               frame: pl.DataFrame | None = None) -> pl.DataFrame:
        """Per group: calls (rows, cache hits included, refused ones not), cache_hits, refused (rows of calls an
        open circuit breaker did not send: no request, no cost), requests (HTTP attempts), prompt/completion
        tokens, seconds.

        ``run_id`` restricts to one run; ``frame`` totals an already-read ledger instead of reading again.
        """
        by = [by] if isinstance(by, str) else list(by)
        unknown = [name for name in by if name not in SCHEMA]
        if unknown:
            raise LedgerError(f"cannot total by {unknown}; columns are {list(SCHEMA)}")
        if frame is None:
            data = self.read(run_id)
        else:  # a frame given may hold every run
            data = frame if run_id is None else frame.filter(pl.col("run_id") == run_id)
        refused = ~pl.col("cache_hit") & (pl.col("attempts") == 0)  # nothing sent (an open circuit breaker)
        aggregates = [
            (pl.len() - refused.sum()).cast(pl.Int64).alias("calls"),
            refused.sum().cast(pl.Int64).alias("refused"),
            pl.col("cache_hit").sum().cast(pl.Int64).alias("cache_hits"),
            pl.col("attempts").sum().cast(pl.Int64).alias("requests"),
            pl.col("prompt_tokens").sum().cast(pl.Int64).alias("prompt_tokens"),
            pl.col("completion_tokens").sum().cast(pl.Int64).alias("completion_tokens"),
            pl.col("seconds").sum().cast(pl.Float64).alias("seconds"),
        ]
        if not by:
            return data.select(aggregates)
        return data.group_by(by).agg(aggregates).sort(by)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lexgraph.ledger [FOLDER] [--run RUN_ID]`: rows by stage and outcome (failed calls by reason,
    cache hits, calls the circuit breaker refused), of the ledger of $LEXGRAPH_HOME's index by default."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lexgraph.ledger", description=main.__doc__.split(":", 1)[1])
    parser.add_argument("folder", nargs="?", help="a ledger folder (default: the current settings' index)")
    parser.add_argument("--run", help="only this run's rows")
    args = parser.parse_args(argv)
    if args.folder:
        folder = Path(args.folder)
    else:
        from lexgraph.settings import Settings

        folder = Settings.from_env().ledger_dir
    ledger = CostLedger(folder)
    frame = ledger.read().with_columns(
        pl.when(pl.col("cache_hit")).then(pl.lit("cache hit")).otherwise(pl.col("outcome")).alias("outcome"))
    totals = ledger.totals(by=["stage", "outcome"], run_id=args.run, frame=frame)
    print(f"cost ledger {folder}" + (f", run {args.run}" if args.run else ""))
    if not totals.height:
        print("  no rows")
        return 0
    width = max(28, *(len(o) for o in totals["outcome"].to_list()))
    print(f"  {'stage':<20} {'outcome':<{width}} {'rows':>6} {'requests':>8}")
    for row in totals.iter_rows(named=True):
        print(f"  {row['stage']:<20} {row['outcome']:<{width}} {row['calls'] + row['refused']:>6} {row['requests']:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
