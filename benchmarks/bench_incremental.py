"""Time to add one document to an indexed corpus (per-document assets + incremental corpus update)
as a share of the full build, both through the Dagster asset graph in one process."""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg

from benchmarks.common import median, peak_rss_mb, prepare_corpus
from lexgraph.extract.embedder import Embedder
from lexgraph.inbox import iter_corpus_files
from lexgraph.settings import Settings
from orchestration.runner import ingest_folder


def timed_ingest(folder: Path, instance, home: Path, prune: bool = False) -> float:
    start = time.perf_counter()
    report = ingest_folder(folder, instance, home=str(home), prune=prune, progress=False)
    if report.corpus_index_ok is False:
        raise SystemExit("the corpus index update failed; see the Dagster log above")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", required=True, help="folder of documents or a .zip of them")
    parser.add_argument("--repeats", type=int, default=3, help="add/remove cycles of the held-out documents")
    args = parser.parse_args()
    source = prepare_corpus(args.corpus)
    files = iter_corpus_files(source)
    held_out = files[-args.repeats:]  # documents added one at a time after the build
    inbox = Path(tempfile.mkdtemp(prefix="lexgraph-inbox-"))
    home = Path(tempfile.mkdtemp(prefix="lexgraph-incr-"))
    for path in files:
        if path not in held_out:
            target = inbox / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    Embedder.shared(backend=Settings.from_env().embed_backend).embed(["warm up the model before timing"])
    with dg.instance_for_test() as instance:
        full = timed_ingest(inbox, instance, home)
        print(f"full build of {len(files) - len(held_out)} documents: {full:.1f} s", flush=True)
        adds, removes = [], []
        for path in held_out:
            target = inbox / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            adds.append(timed_ingest(inbox, instance, home))
            target.unlink()
            removes.append(timed_ingest(inbox, instance, home, prune=True))
            print(f"  {path.name}: add {adds[-1]:.2f} s, remove {removes[-1]:.2f} s", flush=True)
    print()
    print(f"corpus: {args.corpus}  repeats: {args.repeats}")
    print("| step | median wall s | share of full build |")
    print("|---|---|---|")
    print(f"| full build ({len(files) - len(held_out)} documents) | {full:.1f} | 100% |")
    print(f"| add one document | {median(adds):.2f} | {100 * median(adds) / full:.1f}% |")
    print(f"| remove one document | {median(removes):.2f} | {100 * median(removes) / full:.1f}% |")
    print(f"\ntarget: add one document <= 10% of the full build; peak RSS {peak_rss_mb():.0f} MB")
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(inbox, ignore_errors=True)


if __name__ == "__main__":
    main()
