"""The corpus update after removing and re-adding one document of an indexed corpus (LiHua-World by
default), for two checkouts of the code in one command: each runs in its own process on a copy of the
same cached index, through `ingest_folder` and the corpus job; the corpus job's step times and what
chunk_knn_graph and keyword_index say they read and wrote are printed, with the ratio of the two.

    .venv/bin/python benchmarks/bench_corpus_update.py --baseline /tmp/base-a --current /tmp/after-a \\
        --index .lexgraph/bench/lihuaworld-aac215cda60d/index \\
        --corpus .lexgraph/bench/lihuaworld-aac215cda60d/corpus --repeats 3
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
from types import SimpleNamespace

STEPS = ("chunk_knn_graph", "keyword_index", "chunk_pagerank", "skeleton_selection", "lexical_graph")
# Metadata worth printing, when the code under test has it.
FIGURES = ("mode", "ann_index", "rebuilt", "similar_edges_mismatch", "keyword_docs_restored", "words_read_chunks", "similar_edges_added", "similar_edges_removed",
           "similar_edges_updated", "similar_edges_restored", "similar_edges_rewritten", "edges", "keywords",
           "keywords_added", "keywords_removed", "keyword_links_written", "keyword_links_deleted",
           "keyword_vectors_written", "keyword_docs_read", "keywords_rewritten", "keyword_chunk_links")


def worker(args: argparse.Namespace) -> None:
    """In the checkout under test (cwd and PYTHONPATH): copy the cached index, then remove and re-add documents."""
    import dagster as dg

    import lexgraph
    from lexgraph.settings import Settings
    from orchestration.definitions import build_definitions
    from orchestration.runner import ingest_folder

    home = Path(tempfile.mkdtemp(prefix="lexgraph-bench-cu-"))
    inbox = Path(tempfile.mkdtemp(prefix="lexgraph-bench-cu-inbox-"))
    try:
        # the cached index under the version name this checkout computes (the extract and stores are the same)
        version_dir = Path(Settings.from_env(home=home).index_dir)
        [cached] = [p for p in (Path(args.index) / "default").iterdir() if p.is_dir()]
        shutil.copytree(cached, version_dir)
        shutil.copytree(args.corpus, inbox, dirs_exist_ok=True)
        files = sorted(p for p in inbox.rglob("*") if p.is_file())
        held = [files[(i + 1) * len(files) // (args.repeats + 1)] for i in range(args.repeats)]
        with dg.instance_for_test() as instance:
            ingest_folder(inbox, instance, home=str(home), progress=False, corpus=False)
            # one corpus run, untimed, brings the copied corpus state to this code (e.g. a new KNN state format)
            warm = build_definitions(Settings.from_env(home=home, inbox=inbox)).resolve_job_def(
                "build_corpus_index").execute_in_process(instance=instance)
            rows = {"code": str(Path(lexgraph.__file__).parent.parent), "remove": [], "add": [],
                    "warm_up": _corpus_run(instance, SimpleNamespace(corpus_run=warm.run_id,
                                                                      corpus_index_ok=warm.success))}
            for path in held:
                text = path.read_bytes()
                path.unlink()
                rows["remove"].append(_corpus_run(instance, ingest_folder(inbox, instance, home=str(home), prune=True,
                                                                          progress=False)) | {"doc": path.name})
                path.write_bytes(text)
                rows["add"].append(_corpus_run(instance, ingest_folder(inbox, instance, home=str(home),
                                                                       progress=False)) | {"doc": path.name})
        print("RESULT " + json.dumps(rows))
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(inbox, ignore_errors=True)


def _corpus_run(instance, report) -> dict:
    """Step durations of the report's corpus run and the two assets' metadata."""
    if report.corpus_run is None:
        return {"seconds": 0.0, "steps": {}, "figures": {}}
    if not report.corpus_index_ok:
        raise SystemExit(f"corpus update failed: {report.corpus_error}")
    stats = {s.step_key: s.end_time - s.start_time for s in instance.get_run_step_stats(report.corpus_run)
             if s.end_time and s.start_time}
    run = instance.get_run_stats(report.corpus_run)
    figures = {}
    for record in instance.get_records_for_run(report.corpus_run).records:
        event = record.event_log_entry.dagster_event
        if event is not None and event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key.path[-1] in ("chunk_knn_graph", "keyword_index"):
                figures.update({k: v.value for k, v in materialization.metadata.items() if k in FIGURES})
    return {"seconds": run.end_time - run.start_time, "steps": {k: stats.get(k, 0.0) for k in STEPS},
            "figures": figures}


def run_checkout(root: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("LEXGRAPH_") and k != "DAGSTER_HOME"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--index", str(Path(args.index).resolve()),
               "--corpus", str(Path(args.corpus).resolve()), "--repeats", str(args.repeats)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{root}: worker failed\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"{root}: ran in {time.perf_counter() - started:.0f} s (code from {result['code']})", flush=True)
    return result


def median_of(rows: list[dict], key) -> float:
    return statistics.median(key(r) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="a cached index home (its default/<version> is copied)")
    parser.add_argument("--corpus", required=True, help="the folder of documents that index was built from")
    parser.add_argument("--baseline", help="checkout of the code to compare against")
    parser.add_argument("--current", default=str(Path(__file__).resolve().parent.parent), help="checkout under test")
    parser.add_argument("--repeats", type=int, default=3, help="documents removed and added back, one at a time")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = {name: run_checkout(root, args) for name, root in (("baseline", args.baseline), ("current", args.current))
               if root}
    for op in ("add", "remove"):
        print(f"\n### {op} one document (median of {args.repeats}; seconds of the corpus job's steps)\n")
        names = list(results)
        print("| step | " + " | ".join(names) + (" | current / baseline |" if len(names) == 2 else " |"))
        print("|---|" + "---|" * (len(names) + (len(names) == 2)))
        keys = [("whole corpus run", lambda r: r["seconds"])] + [(s, lambda r, s=s: r["steps"][s]) for s in STEPS]
        for label, key in keys:
            values = [median_of(results[n][op], key) for n in names]
            ratio = f" {values[1] / values[0]:.2f} |" if len(values) == 2 and values[0] else ""
            print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + " |" + ratio)
        for name in names:
            print(f"\n{name}, what the two assets said for each {op}:")
            for row in results[name][op]:
                print(f"  {row['doc']}: {json.dumps(row['figures'], sort_keys=True)}")
    for name in results:
        print(f"\n{name} warm-up (first corpus run on the copied index): {results[name]['warm_up']['seconds']:.1f} s, "
              f"{json.dumps(results[name]['warm_up']['figures'], sort_keys=True)}")


if __name__ == "__main__":
    main()
