"""The chunk_knn_graph step's own work (no Kùzu writes), one add per fresh process, on a copy of a large
index's KNN save: what `docs/perf/knn_restore.md` measures.

    .venv/bin/python -m benchmarks.bench_knn_step HOME WORK [--repeats 3] [--steady]

HOME is an index home (e.g. the synthetic index's `home`; it is only read). Each repeat copies the index's
KNN save to WORK, then a child process reads the catalog's chunk vectors from the index's LanceDB as the
asset does (`_catalog_chunks`), appends 20 chunks (vectors near 20 existing ones, their words) and runs
`update_knn(mode="approx")`. With --steady a second child adds 20 more onto the save the first wrote (the
HNSW journal path). Prints each add's seconds (catalog read + update_knn, wall and CPU) and a digest of the
edges, so two checkouts can be compared on the same work: run it from each.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

NEW_CHUNKS = 20


def add(index: Path, work: Path, seed: int) -> dict:
    """One add of NEW_CHUNKS chunks onto the save in `work`, timed in this process."""
    import numpy as np
    import polars as pl

    from assets.skeleton import _catalog_chunks
    from lexgraph.indexing import corpus_index as ci
    from lexgraph.storage.extract_store import ExtractStore
    from lexgraph.storage.vector_store import VectorStore

    store = VectorStore(index / "lance")
    wall, cpu = time.perf_counter(), time.process_time()
    chunks, vectors = _catalog_chunks(store, store.indexed_hashes())
    read = time.perf_counter() - wall
    rng = np.random.default_rng(seed)
    pick = rng.choice(chunks.height, NEW_CHUNKS, replace=False)
    new_vectors = vectors[pick] + rng.normal(0, 0.02, (NEW_CHUNKS, vectors.shape[1])).astype(np.float32)
    new_vectors /= np.linalg.norm(new_vectors, axis=1, keepdims=True)
    new_ids = [f"zz-new-{seed}-{i:02d}" for i in range(NEW_CHUNKS)]
    words = ci.chunk_words(ExtractStore(index / "extract"), chunks[pick]).with_columns(pl.Series("chunk_id", new_ids))
    chunks = pl.concat([chunks, pl.DataFrame({"chunk_id": new_ids, "doc_id": [f"zz-doc-{seed}"] * NEW_CHUNKS})])
    vectors = np.concatenate([vectors, new_vectors.astype(np.float32)])
    started = time.perf_counter()
    result = ci.update_knn(ci.CorpusFiles(work), chunks, vectors,
                           lambda wanted: wanted.select("chunk_id").join(words, on="chunk_id", how="left").with_columns(
                               pl.col("words").fill_null(pl.lit([], dtype=pl.List(pl.String)))),
                           k=20, mode="approx")
    update = time.perf_counter() - started
    edges = result.edges.sort("src", "dst", "kind")
    return {"seconds": round(read + update, 3), "cpu": round(time.process_time() - cpu, 3),
            "update_knn": round(update, 3), "rebuilt": result.rebuilt, "reason": result.rebuild_reason,
            "ann": result.ann_index, "edges": edges.height,
            "digest": hashlib.sha1(edges.hash_rows().to_numpy().tobytes()).hexdigest()[:12]}


def child(index: Path, work: Path, seed: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_knn_step", "--child", str(index), str(work),
                          str(seed)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the add failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(add(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady", action="store_true", help="a second add onto the save the first wrote")
    args = parser.parse_args()
    from lexgraph.settings import Settings

    index = Settings.from_env(home=args.home).index_dir
    runs: dict[str, list[dict]] = {"first": [], "steady": []}
    for repeat in range(args.repeats):
        if args.work.exists():
            shutil.rmtree(args.work)
        (args.work / "corpus").mkdir(parents=True)
        for path in (index / "corpus").glob("knn_*"):
            shutil.copy2(path, args.work / "corpus" / path.name)
        for adds, label in ((1, "first"), (2, "steady"))[:1 + args.steady]:
            figures = child(index, args.work, seed=adds)
            runs[label].append(figures)
            print(f"repeat {repeat + 1} {label}: {json.dumps(figures)}", flush=True)
    for label, figures in runs.items():
        if figures:
            print(f"{label} add: median {statistics.median(f['seconds'] for f in figures):.2f} s wall, "
                  f"{statistics.median(f['cpu'] for f in figures):.2f} s CPU over {len(figures)}; "
                  f"digests {sorted({f['digest'] for f in figures})}")


if __name__ == "__main__":
    main()
