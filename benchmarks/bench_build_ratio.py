"""A full `lexgraph ingest` of a corpus with this checkout's code against an older commit's, in one command.

For a change that costs build time (issue 40's spaCy extractor: at most 1.25× the build it replaced), an
absolute time says little on a shared machine; a ratio against the old code, measured in the same command,
does. The old code runs from a `git worktree` of --ref with the same virtualenv; each build gets a fresh index
home and the README's own command (`lexgraph ingest PATH --quiet`), timed from the outside, with no
DAGSTER_HOME (the ephemeral instance). Builds alternate (ref, head, head, ref, ...) so that drift on the host
falls on both sides. The per-stage times come from each build's progress output.

    python -m benchmarks.bench_build_ratio --ref 36df744 --corpus ../shared/datasets/lihua-world/LiHuaWorld.zip

--variant NAME=VALUE compares this checkout against itself with one variable set instead (no worktree), e.g.
LEXGRAPH_GRAPH_BACKEND=ladybug: the graph store against Kùzu, the rest of the build the same.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lexgraph.evaluation.corpus import prepare_corpus

ROOT = Path(__file__).resolve().parent.parent


def _worktree(ref: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where


def _build(code: Path, corpus: Path, home: Path, extra: dict[str, str] | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1", "LEXGRAPH_HOME": str(home), **(extra or {})}
    env.pop("DAGSTER_HOME", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "orchestration.cli", "ingest", str(corpus), "--quiet"], cwd=code,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"build with {code} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds


OPEN = ("import statistics, sys, time\nfrom lexgraph.settings import Settings\n"
        "from lexgraph.storage.graph_store import GraphStore\npath = Settings.from_env().graph_path\ntimes = []\n"
        "for _ in range(5):\n    t = time.perf_counter()\n    with GraphStore.writer(path) as g:\n        g.count('Chunk')\n"
        "    times.append(time.perf_counter() - t)\nprint(statistics.median(times))")


def _open_seconds(code: Path, home: Path, extra: dict[str, str]) -> float:
    """Median of 5: opening the built graph for writing (taking its lock), one count, closing it."""
    env = {**os.environ, "PYTHONPATH": str(code), "LEXGRAPH_HOME": str(home), **extra}
    done = subprocess.run([sys.executable, "-c", OPEN], cwd=code, env=env, capture_output=True, text=True)
    return float(done.stdout.strip()) if done.returncode == 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--ref", help="the older commit to compare against")
    which.add_argument("--variant", help="NAME=VALUE: this checkout against itself with the variable set")
    parser.add_argument("--corpus", required=True, help="a folder, .zip or text file (as `lexgraph bench` takes)")
    parser.add_argument("--repeats", type=int, default=1, help="builds per side")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="lexgraph-build-ratio-"))
    try:
        corpus = prepare_corpus(args.corpus, scratch / "prepared").folder
        if args.variant:
            name, _, value = args.variant.partition("=")
            sides = {"ref": (ROOT, {}), "head": (ROOT, {name: value})}
        else:
            sides = {"ref": (_worktree(args.ref, scratch / "ref"), {}), "head": (ROOT, {})}
        order = [side for i in range(args.repeats) for side in (("ref", "head") if i % 2 == 0 else ("head", "ref"))]
        times: dict[str, list[float]] = {"ref": [], "head": []}
        opens: dict[str, list[float]] = {"ref": [], "head": []}
        for n, side in enumerate(order):
            home = scratch / f"home-{n}"
            code, extra = sides[side]
            seconds = _build(code, corpus, home, extra)
            times[side].append(seconds)
            opens[side].append(_open_seconds(code, home, extra))
            shutil.rmtree(home, ignore_errors=True)
            print(f"build {n + 1}/{len(order)}: {side} {seconds:.1f} s", flush=True)
        ref, head = statistics.median(times["ref"]), statistics.median(times["head"])
        label = args.ref or f"this checkout, then with {args.variant}"
        figures = {"ref": label, "corpus": str(args.corpus), "ref_s": times["ref"], "head_s": times["head"],
                   "ratio": round(head / ref, 3), "cpus": os.cpu_count(), "open_s": opens}
        print(f"build-ratio corpus={Path(args.corpus).name} ref={label!r} ref_s={ref:.1f} head_s={head:.1f} "
              f"ratio={head / ref:.3f} graph_open_s={statistics.median(opens['ref']):.3f}/"
              f"{statistics.median(opens['head']):.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "ref")],
                       capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
