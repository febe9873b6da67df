"""Fresh-process cost of loading the embedder: the light path (tokenizers + onnxruntime only, with a valid
cached export) against the embedder as it was at --before (which always loaded the sentence-transformers
model, so torch and transformers), in one command, alternating the two so both see the same machine load.

1. Construction: per fresh process, seconds to import lexgraph.extract.embedder and build
   Embedder(backend=...), the first query's seconds, and the process's RSS after load (VmRSS, VmHWM).
2. With --home and --question: wall seconds of `lexgraph --home H ask QUESTION` in fresh processes,
   the same CLI with either embedder.

    .venv/bin/python -m benchmarks.bench_embedder_load --repeats 5 --home /tmp/h --question "Who is the CEO?"

Medians, and the before/light ratio of the medians. Needs git (the old embedder is read with git show).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import median

ROOT = Path(__file__).resolve().parent.parent
# The last commit whose Embedder always loaded the sentence-transformers model.
BEFORE = "ced5427"
HEAVY = ("torch", "transformers", "sentence_transformers")

# Run in each child: optionally swap in the old embedder module before anything imports the new one.
INSTALL = """
import importlib.util, sys
def install(old):
    if old:
        import lexgraph.extract
        spec = importlib.util.spec_from_file_location("lexgraph.extract.embedder", old)
        module = importlib.util.module_from_spec(spec)
        sys.modules["lexgraph.extract.embedder"] = module
        spec.loader.exec_module(module)
        lexgraph.extract.embedder = module
"""

LOAD = INSTALL + """
import json, time
start = time.perf_counter()
install(sys.argv[1])
from lexgraph.extract.embedder import Embedder
embedder = Embedder(backend=sys.argv[2])
loaded = time.perf_counter()
embedder.embed_query("Who runs Kestrel?")
queried = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"load_s": loaded - start, "first_query_s": queried - loaded,
                  "rss_mb": int(status["VmRSS"].split()[0]) / 1024, "peak_rss_mb": int(status["VmHWM"].split()[0]) / 1024,
                  "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)

ASK = INSTALL + """
install(sys.argv[1])
del sys.argv[1]
from orchestration.cli import main
sys.exit(main())
"""


def old_embedder(rev: str, folder: Path) -> Path:
    source = subprocess.run(["git", "show", f"{rev}:lexgraph/extract/embedder.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = folder / "embedder_before.py"
    path.write_text(source)
    return path


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_load(old: str, backend: str) -> dict:
    done = subprocess.run([sys.executable, "-c", LOAD, old, backend], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        raise SystemExit(f"load child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ask(old: str, home: str, question: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ASK, old, "--home", home, "ask", question], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"ask child failed:\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="onnx", choices=("onnx", "onnx-int8"))
    parser.add_argument("--before", default=BEFORE, help="git revision of the embedder to compare with")
    parser.add_argument("--home", help="an ingested lexgraph home, to time `lexgraph ask` too")
    parser.add_argument("--question", default="Who is the CEO of Halvorsen Maritime Group?")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    with tempfile.TemporaryDirectory(prefix="bench-embedder-load-") as scratch:
        old = str(old_embedder(args.before, Path(scratch)))
        modes = {"light": "", f"before ({args.before})": old}
        run_load("", args.backend)  # a valid cached export, and warm file caches, before timing
        print(f"uptime before: {uptime()}")
        loads: dict[str, list[dict]] = {mode: [] for mode in modes}
        for i in range(args.repeats):
            for mode in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
                loads[mode].append(run_load(modes[mode], args.backend))
        results = {}
        print(f"\nEmbedder(backend={args.backend!r}) in a fresh process, median of {args.repeats}:")
        print(f"{'':22} {'import+load s':>13} {'1st query s':>11} {'RSS MB':>8} {'peak MB':>8}  heavy modules")
        for mode, runs in loads.items():
            row = {key: median([r[key] for r in runs]) for key in ("load_s", "first_query_s", "rss_mb", "peak_rss_mb")}
            row["runs_load_s"] = [round(r["load_s"], 2) for r in runs]
            results[mode] = row
            print(f"{mode:22} {row['load_s']:13.2f} {row['first_query_s']:11.3f} {row['rss_mb']:8.0f} "
                  f"{row['peak_rss_mb']:8.0f}  {','.join(runs[0]['heavy']) or '-'}   runs: {row['runs_load_s']}")
        light, before = results["light"], results[f"before ({args.before})"]
        print(f"before/light: load {before['load_s'] / light['load_s']:.1f}x, RSS {before['rss_mb'] / light['rss_mb']:.1f}x")

        if args.home:
            asks: dict[str, list[float]] = {mode: [] for mode in modes}
            run_ask("", args.home, args.question)  # warm the index's files
            for i in range(args.repeats):
                for mode in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
                    asks[mode].append(run_ask(modes[mode], args.home, args.question))
            print(f"\n`lexgraph --home {args.home} ask {args.question!r}`, wall seconds, median of {args.repeats}:")
            for mode, runs in asks.items():
                print(f"{mode:22} {median(runs):8.2f}   runs: {[round(r, 2) for r in runs]}")
            print(f"before/light: {median(asks[f'before ({args.before})']) / median(asks['light']):.1f}x")
        print(f"\nuptime after: {uptime()}")


if __name__ == "__main__":
    main()
