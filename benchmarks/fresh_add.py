"""Adding one document to a large index in a fresh `lexgraph ingest` process, end to end through Dagster.

Why: a long-lived process keeps the KNN graph (and its HNSW index) in memory, so bench_scale's
in-memory add hides what a new process pays to load the index. Here each repeat copies the
pristine synthetic index (benchmarks.synthetic_index) to a work folder, puts one new document in
a copy of its inbox and times `python -m orchestration.cli --home HOME ingest INBOX --quiet` (the
`lexgraph` console script's entry) from process start to exit. Peak RSS is the child's
ru_maxrss from wait4 (the kernel's high-water mark, what /proc/<pid>/status calls VmHWM).

Before timing, the copy is checked to be accepted as current by the real ingest: `lexgraph
status` counts the chunks, and an ingest with no new file must start no run and no corpus update
(else the figure would time a rebuild). A last, untimed repeat runs on a SQLite Dagster instance
(DAGSTER_HOME) and reads its runs' step timings for the breakdown.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.synthetic_index import CorpusSpec, SyntheticIndex, bench_env, document_name, document_text

_CLI = ["-m", "orchestration.cli"]
_INGESTED = re.compile(r"^ingested .*$", re.MULTILINE)


@dataclass
class Timed:
    seconds: float
    peak_mib: float
    output: str


@dataclass
class FreshAddResult:
    spec: CorpusSpec
    new_chunks: int
    build: str  # "cached, settled in N s" or "built in N s ..."
    no_change_seconds: float
    repeats: list[Timed] = field(default_factory=list)
    breakdown: list[str] = field(default_factory=list)
    stored: tuple[int, int] = (0, 0)  # the added document's LanceDB chunk rows and Kùzu Chunk nodes
    work: Path | None = None  # the last repeat's index home and inbox, left for inspection

    @property
    def median_seconds(self) -> float:
        return statistics.median(r.seconds for r in self.repeats)

    @property
    def peak_mib(self) -> float:
        return max(r.peak_mib for r in self.repeats)


def run_timed(args: list[str], env: dict[str, str]) -> Timed:
    """A child python process, timed from its start to its exit, with its peak RSS."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        output = child.stdout.read() if child.stdout else ""
        _, status, usage = os.wait4(child.pid, 0)
    except BaseException:  # interrupted: never leave a child writing into the work copy
        child.kill()
        raise
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` exited with {child.returncode}:\n{output}")
    return Timed(seconds, usage.ru_maxrss / 1024, output)


def lexgraph(home: Path, *command: str, env: dict[str, str] | None = None) -> Timed:
    return run_timed([*_CLI, "--home", str(home), *command], env or bench_env())


def ensure_built(index: SyntheticIndex, cache: Path | None) -> str:
    """Build the index unless a finished build for this spec is cached (in a child process: its memory and
    the synthetic embedder stay out of this one), then settle it (benchmarks.settle_index): every timed add
    starts from a copy of it, and a copy of the index as built would pay, in every add, what the first
    ingest after a build does once (extract files verified, young table versions compacted)."""
    if index.is_ready():  # settled again: a cache made by older code is brought to the current bookkeeping once
        settled = run_timed(["-m", "benchmarks.settle_index", str(index.home)], bench_env())
        return f"cached, settled in {settled.seconds:.0f} s"
    args = ["-m", "benchmarks.synthetic_index", "--chunks", str(index.spec.chunks), "--doc-chunks",
            str(index.spec.doc_chunks), "--seed", str(index.spec.seed), "--quiet"]
    built = run_timed(args + (["--cache", str(cache)] if cache else []), bench_env())
    settled = run_timed(["-m", "benchmarks.settle_index", str(index.home)], bench_env())
    return f"built in {built.seconds:.0f} s (peak RSS {built.peak_mib:.0f} MiB), settled in {settled.seconds:.0f} s"


def restore(index: SyntheticIndex, work: Path, new_document: str | None) -> tuple[Path, Path]:
    """A fresh copy of the pristine index home, and an inbox of hard links to its files plus the new one."""
    if work.exists():
        shutil.rmtree(work)
    home, inbox = work / "home", work / "inbox"
    shutil.copytree(index.home, home)
    inbox.mkdir(parents=True)
    for path in index.inbox.iterdir():
        os.link(path, inbox / path.name)
    if new_document is not None:
        (inbox / document_name(index.spec.documents)).write_text(new_document)
    os.sync()  # else the kernel writes the 9 GB copy back to disk during the timed add
    return home, inbox


def stored_chunks(home: Path, doc_id: str) -> tuple[int, int]:
    """The document's chunk rows in LanceDB and Chunk nodes in Kùzu."""
    from lexgraph.settings import Settings
    from lexgraph.storage.graph_store import GraphStore
    from lexgraph.storage.vector_store import VectorStore

    settings = Settings.from_env(home=home)
    quoted = doc_id.replace("'", "''")
    rows = VectorStore(settings.lance_uri).count("chunks", f"doc_id = '{quoted}'")
    graph = GraphStore(settings.graph_path)
    try:
        nodes = int(graph.query("MATCH (c:Chunk) WHERE c.doc_id = $d RETURN count(c) AS n", {"d": doc_id})["n"][0])
    finally:
        graph.close()
    return rows, nodes


def check_accepted(index: SyntheticIndex, work: Path) -> float:
    """The real CLI sees the whole synthetic index, and an ingest with nothing new does nothing. -> its seconds."""
    home, inbox = restore(index, work, None)
    status = lexgraph(home, "status").output
    counts = re.search(r"lancedb sources: (\d+)\s+chunks: (\d+)", status)
    graph = re.search(r"Chunk: (\d+)", status)
    expected = (index.spec.documents, index.spec.chunks)
    if not counts or (int(counts[1]), int(counts[2])) != expected or not graph or int(graph[1]) != expected[1]:
        raise RuntimeError(f"`lexgraph status` does not show {expected[1]} chunks in {expected[0]} documents:\n{status}")
    unchanged = lexgraph(home, "ingest", str(inbox), "--quiet")
    line = _INGESTED.search(unchanged.output)
    nothing = f": 0 new, 0 changed, {index.spec.documents} unchanged, 0 removed, 0 failed, in 0 Dagster run(s)"
    if not line or not line[0].endswith(nothing):
        raise RuntimeError("the real ingest does not accept the synthetic index as current (it would rebuild "
                           f"part of it, and the figure would time that):\n{unchanged.output}")
    return unchanged.seconds


def step_breakdown(dagster_home: Path, wall: float) -> list[str]:
    """Per run (the per-document run, the corpus job) its duration and its steps', from the instance's records."""
    import dagster as dg

    lines = []
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).start_time or 0)
        in_runs = 0.0
        for run in runs:
            record = instance.get_run_record_by_id(run.run_id)
            duration = (record.end_time or 0) - (record.start_time or 0)
            in_runs += duration
            steps = sorted(instance.get_run_step_stats(run.run_id), key=lambda s: s.start_time or 0)
            parts = ", ".join(f"{s.step_key} {(s.end_time or 0) - (s.start_time or 0):.1f}" for s in steps)
            lines.append(f"  {run.job_name} run: {duration:.1f} s ({parts})")
        lines.append(f"  outside Dagster runs: {wall - in_runs:.1f} s (interpreter start, imports, inbox scan, "
                     "extract-file checks, reconcile, catalog and staleness checks)")
    return lines


def measure(spec: CorpusSpec, repeats: int, new_chunks: int = 20, cache: Path | None = None,
            breakdown: bool = True, log=print) -> FreshAddResult:
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if new_chunks < 1:
        raise ValueError(f"the new document needs at least 1 chunk, got {new_chunks}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a terminated bench kills its child too
    index = SyntheticIndex.under(spec, cache)
    result = FreshAddResult(spec, new_chunks, ensure_built(index, cache), 0.0)
    log(f"synthetic index {index.root} ({result.build}): {spec.chunks} chunks in {spec.documents} documents")
    work = index.root.parent / f"{index.root.name}.work"
    result.no_change_seconds = check_accepted(index, work)
    log(f"accepted: a fresh `lexgraph ingest` with no new file started no run and no corpus update "
        f"({result.no_change_seconds:.1f} s)")
    new_document = document_text(spec, spec.documents, new_chunks)
    from lexgraph.ids import document_id

    doc_id = document_id(document_name(spec.documents))
    for repeat in range(repeats + int(breakdown)):
        home, inbox = restore(index, work, new_document)
        timing = repeat == repeats  # the extra repeat: SQLite instance, for the step timings only
        extra = {"DAGSTER_HOME": str(work / "dagster")} if timing else None
        timed = lexgraph(home, "ingest", str(inbox), "--quiet", env=bench_env(extra))
        line = _INGESTED.search(timed.output)
        if not line or ": 1 new," not in line[0] or "corpus index update" not in line[0]:
            raise RuntimeError(f"the add did not ingest one new document and update the corpus:\n{timed.output}")
        if timing:
            result.breakdown = [f"breakdown (one more repeat on a SQLite Dagster instance, {timed.seconds:.1f} s "
                                f"wall, not in the median):", *step_breakdown(work / "dagster", timed.seconds)]
            continue
        result.repeats.append(timed)
        result.stored = stored_chunks(home, doc_id)
        log(f"  repeat {repeat + 1}: {timed.seconds:.1f} s  peak RSS {timed.peak_mib:.0f} MiB  ({line[0]})")
    result.work = work  # restored at the start of the next measurement
    return result


def report(result: FreshAddResult) -> list[str]:
    n = result.spec.chunks
    rows, nodes = result.stored
    return [
        f"fresh-process add at {n} chunks: {result.median_seconds:.1f} s",
        f"fresh-process add at {n} chunks: peak RSS {result.peak_mib:.0f} MiB",
        f"  median of {len(result.repeats)}: " + ", ".join(f"{r.seconds:.1f}" for r in result.repeats)
        + f" s; a new document of {result.new_chunks} chunks (real embedder) added to {n} synthetic chunks; "
        f"stored afterwards: {rows} LanceDB chunk rows, {nodes} Kùzu Chunk nodes",
        *result.breakdown,
        f"  the last repeat's index and inbox are left in {result.work}",
    ]
