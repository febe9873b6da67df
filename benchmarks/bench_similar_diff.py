"""The SIMILAR diff of one added document on Kùzu and on LadybugDB, side by side (issue 42).

What is timed: the graph write of the chunk KNN step when one document is added to a big index, as
`lexgraph.indexing.knn_update._similar_edges_to` does it (the product's own function is called): the chunks
without SIMILAR edges looked up, the removed and reweighted edges deleted, the added and reweighted ones
copied, the whole table counted against the KNN graph's edge count; then the writer closed (its checkpoint,
where an engine may pay for the writes). Before it, in a writer block of its own as the per-document run has,
the new document's Source and Chunk nodes are added (`GraphStore.replace_documents`). Also timed: opening the
graph as the product opens a writer (`GraphStore.writer`: the writer lock, the database, the schema check).

What is synthetic: the chunks and their KNN graphs. `benchmarks.bench_scale.generate` gives clustered 384-d
unit vectors and Zipf word lists for N + a new document's chunks (ids as the product makes them,
`lexgraph.ids`, documents of --doc-chunks chunks); the product's `semantic_knn` / `lexical_knn` (k from
lexgraph.defaults, the mode `knn_mode("auto", N)` picks) build both graphs over the N chunks, their edges are
the SIMILAR edges (src < dst, kinds semantic and lexical), and the new document is added to both graphs
(`KnnGraph.add`); `edge_changes` gives the diff the product would write: removed, added and reweighted edges
(lexical re-weights where a word crosses max_df). So the diff's sizes are those of a real add of a document of
--new-chunks chunks to this corpus, not chosen numbers. This shared input is cached under
.lexgraph/bench/similar-diff-input-<N>/; each backend's graph, built once through GraphStore
(`replace_documents`, `replace_similarity_edges`), under .lexgraph/bench/similar-diff-<backend>-<N>/. Every
repeat copies the cached graph to a work directory first, so each starts from the same state.

One process can load only one of the two engines, so every step runs in a child process with
LEXGRAPH_GRAPH_BACKEND set; the repeats alternate between the backends (kuzu, ladybug, ladybug, kuzu, ...).
Each child checks the SIMILAR count before and after the diff (after = before - deleted + copied, and equal to
the KNN graph's edges) and exits 1 when it is not.

    python -m benchmarks.bench_similar_diff --chunks 100000 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from lexgraph.cli import _positive_int  # the CLI's own check: at least 1, a clear message

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".lexgraph" / "bench"
BACKENDS = ("kuzu", "ladybug")
DOC_CHUNKS = 30
NEW_CHUNKS = 30
SEED = 42
# Part of the cached files' spec: a change of what is generated or how it is stored rebuilds them.
GENERATION = 1
CHILD_PREFIX = "CHILD "
# The default writes the whole KNN diff the product computes for the add (at 100k: 5,883 rows deleted, 6,696
# copied, most of them lexical reweights). --diff-size 350,900 samples it down to the add measured in
# docs/perf/kuzu_writes.md (350 deleted, 900 copied into 2.65M edges).
DIFF_SIZE = None


# -- the shared input: chunks, the KNN graphs' edges before and after the add, the diff ---------------------------


def _input_dir(cache: Path, chunks: int) -> Path:
    return cache / f"similar-diff-input-{chunks}"


def _graph_dir(cache: Path, backend: str, chunks: int) -> Path:
    return cache / f"similar-diff-{backend}-{chunks}"


def _spec(args: argparse.Namespace) -> dict:
    from lexgraph.indexing.knn import DEFAULT_K

    return {"generation": GENERATION, "chunks": args.chunks, "doc_chunks": args.doc_chunks,
            "new_chunks": args.new_chunks, "seed": args.seed, "k": DEFAULT_K}


def _read_spec(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "spec.json").read_text())
    except (OSError, ValueError):
        return None


def _chunk_rows(ids_words: list[tuple[str, str, int, str]]):
    """The product's chunk frame (GraphStore.replace_documents) for (chunk_id, doc_id, order, text) rows."""
    import polars as pl

    chunk_id, doc_id, order, text = (list(column) for column in zip(*ids_words))
    lengths = [len(t) for t in text]
    starts = [0] * len(text)
    for i in range(1, len(text)):
        starts[i] = 0 if doc_id[i] != doc_id[i - 1] else starts[i - 1] + lengths[i - 1] + 2
    return pl.DataFrame({"chunk_id": chunk_id, "doc_id": doc_id, "order": order, "text": text,
                         "char_start": starts, "char_end": [s + n for s, n in zip(starts, lengths)],
                         "heading_path": [""] * len(text), "token_count": [t.count(" ") + 1 for t in text]},
                        schema={"chunk_id": pl.String, "doc_id": pl.String, "order": pl.Int64, "text": pl.String,
                                "char_start": pl.Int64, "char_end": pl.Int64, "heading_path": pl.String,
                                "token_count": pl.Int64})


def _source_rows(chunks):
    """One Source row per document of a chunk frame."""
    import polars as pl

    docs = chunks.group_by("doc_id", maintain_order=True).agg(pl.col("char_end").max().alias("size_bytes"))
    return docs.select(
        pl.col("doc_id").alias("id"), (pl.lit("file:///synthetic/") + pl.col("doc_id") + ".md").alias("uri"),
        (pl.col("doc_id") + ".md").alias("relative_path"), pl.col("doc_id").alias("title"),
        pl.lit("md").alias("format"), pl.col("doc_id").alias("content_hash"), pl.lit("1").alias("version"),
        pl.col("size_bytes").cast(pl.Int64),
        pl.lit(datetime(2026, 12, 7, tzinfo=timezone.utc)).alias("ingested_at"))


def make_input(args: argparse.Namespace) -> dict:
    """Generate the corpus, build both KNN graphs, add the new document, save edges and diff (cached)."""
    import numpy as np
    import polars as pl

    folder = _input_dir(Path(args.cache), args.chunks)
    spec = _spec(args)
    saved = _read_spec(folder)
    if saved is not None and saved.get("spec") == spec:
        return {**saved["figures"], "cached": True}
    if folder.exists():
        shutil.rmtree(folder)
    started = time.perf_counter()
    from benchmarks.bench_scale import generate
    from lexgraph.ids import chunk_id, document_id
    from lexgraph.indexing.knn import DEFAULT_K, edge_changes, lexical_knn, semantic_knn
    from lexgraph.indexing.knn_edges import EdgeRows, SavedLists, position_map
    from lexgraph.indexing.knn_update import knn_mode

    n, new = args.chunks, args.new_chunks
    _, vectors, words = generate(n + new, seed=args.seed)
    rows = []
    documents = -(-n // args.doc_chunks)
    for i in range(n + new):
        doc, order = (i // args.doc_chunks, i % args.doc_chunks) if i < n else (documents, i - n)
        doc_id = document_id(f"synthetic/doc-{doc:06d}.md")
        text = " ".join(words[i])
        rows.append((chunk_id(doc_id, order, text), doc_id, order, text))
    chunks = _chunk_rows(rows)
    ids = chunks["chunk_id"].to_numpy()
    mode = knn_mode("auto", n)
    knn_started = time.perf_counter()
    semantic = semantic_knn(ids[:n], vectors[:n], DEFAULT_K, mode=mode)
    lexical = lexical_knn(ids[:n], words[:n], DEFAULT_K)
    knn_s = time.perf_counter() - knn_started
    before_rows = EdgeRows.concat([semantic.edge_rows(), lexical.edge_rows()])
    before = {g.kind: SavedLists(g.chunk_ids.copy(), g.lists().neighbors.copy(), g.lists().sims.copy())
              for g in (semantic, lexical)}
    add_started = time.perf_counter()
    semantic.add(ids[n:], vectors[n:])
    lexical.add(ids[n:], words[n:])
    to_new = position_map(before[semantic.kind].chunk_ids, semantic.chunk_ids)
    changes = [edge_changes(before[g.kind], g, to_new) for g in (semantic, lexical)]
    removed, added, reweighted = (pl.concat(part) for part in zip(*changes))
    add_s = time.perf_counter() - add_started
    after_rows = EdgeRows.concat([semantic.edge_rows(), lexical.edge_rows()])
    folder.mkdir(parents=True, exist_ok=True)
    chunks.write_parquet(folder / "chunks.parquet")
    for name, edge_rows in (("before", before_rows), ("after", after_rows)):
        np.savez(folder / f"{name}.npz", chunk_ids=edge_rows.chunk_ids, src=edge_rows.src, dst=edge_rows.dst,
                 kind=edge_rows.kind, weight=edge_rows.weight)
    for name, frame in (("removed", removed), ("added", added), ("reweighted", reweighted)):
        frame.write_parquet(folder / f"{name}.parquet")
    touching = after_rows.touching(ids[n:].tolist()).height
    figures = {"chunks": n, "new_chunks": new, "documents": documents, "mode": mode, "k": DEFAULT_K,
               "edges": before_rows.height, "edges_by_kind": before_rows.counts_by_kind(),
               "edges_after": after_rows.height, "removed": removed.height, "added": added.height,
               "reweighted": reweighted.height, "new_chunk_edges": touching, "knn_s": round(knn_s, 2),
               "add_knn_s": round(add_s, 2), "input_s": round(time.perf_counter() - started, 2)}
    (folder / "spec.json").write_text(json.dumps({"spec": spec, "figures": figures}, indent=1))
    return {**figures, "cached": False}


def _edge_rows(folder: Path, name: str):
    import numpy as np

    from lexgraph.indexing.knn_edges import EdgeRows

    with np.load(folder / f"{name}.npz") as data:
        return EdgeRows(data["chunk_ids"], data["src"], data["dst"], data["kind"], data["weight"])


def _diff(folder: Path, size: tuple[int, int] | None, seed: int):
    """(removed, added, reweighted, the edges after them) of the cached KNN diff; with `size` (deleted, copied)
    a sample of it that deletes and copies that many rows, reweights in the diff's own share of the deletes
    (SIMILAR rows deleted = removed + reweighted, copied = added + reweighted, as knn_update writes them)."""
    import numpy as np
    import polars as pl

    from lexgraph.indexing.knn_edges import EDGE_KINDS, EdgeRows

    removed, added, reweighted = (pl.read_parquet(folder / f"{n}.parquet") for n in ("removed", "added", "reweighted"))
    if size is None:
        return removed, added, reweighted, _edge_rows(folder, "after")
    deleted, copied = size
    share = reweighted.height / max(removed.height + reweighted.height, 1)
    n_reweighted = min(reweighted.height, round(deleted * share), copied)
    picks = [(removed, deleted - n_reweighted), (added, copied - n_reweighted), (reweighted, n_reweighted)]
    if any(want > frame.height for frame, want in picks):
        raise SystemExit(f"--diff-size {deleted},{copied} is more than the KNN diff holds (removed "
                         f"{removed.height}, added {added.height}, reweighted {reweighted.height})")
    removed, added, reweighted = (frame.sample(want, seed=seed) for frame, want in picks)
    # the edges after the sampled diff, as positions into the chunk ids after the add
    before, full = _edge_rows(folder, "before"), _edge_rows(folder, "after")
    ids = full.chunk_ids
    width = np.int64(len(ids))
    kinds = {name: code for code, name in enumerate(EDGE_KINDS)}

    def keys(src: np.ndarray, dst: np.ndarray, kind: np.ndarray) -> np.ndarray:
        return (kind.astype(np.int64) * width + src.astype(np.int64)) * width + dst.astype(np.int64)

    def frame_keys(frame: pl.DataFrame) -> np.ndarray:
        src, dst = (np.searchsorted(ids, frame[c].to_numpy().astype(str)) for c in ("src", "dst"))
        return keys(src, dst, frame["kind"].replace_strict(kinds, return_dtype=pl.UInt8).to_numpy())

    to_new = np.searchsorted(ids, before.chunk_ids)  # the ids before are among those after, in the same order
    held = keys(to_new[before.src], to_new[before.dst], before.kind)
    weight = before.weight.copy()
    order = np.argsort(held)
    weight[order[np.searchsorted(held, frame_keys(reweighted), sorter=order)]] = reweighted["weight"].to_numpy()
    kept = ~np.isin(held, frame_keys(removed))
    new_keys = np.concatenate([held[kept], frame_keys(added)])
    new_weight = np.concatenate([weight[kept], added["weight"].to_numpy()])
    kind, rest = np.divmod(new_keys, width * width)
    src, dst = np.divmod(rest, width)
    after = EdgeRows(ids, src.astype(np.int32), dst.astype(np.int32), kind.astype(np.uint8), new_weight)
    return removed, added, reweighted, after


# -- one backend's graph (children with LEXGRAPH_GRAPH_BACKEND set) ----------------------------------------------


def _graph_name() -> str:
    """The graph file the product names for this process's backend (Settings.graph_path's file name)."""
    from lexgraph.settings import Settings

    return Path(Settings.from_env().graph_path).name


def _similar_and_chunks(path) -> tuple[int, int]:
    """SIMILAR edges and Chunk nodes of the graph at `path`, read with a reader that is closed again."""
    from lexgraph.storage.graph_store import GraphStore

    graph = GraphStore(path)
    try:
        return graph.count("SIMILAR"), graph.count("Chunk")
    finally:
        graph.close()


def build_graph(args: argparse.Namespace) -> dict:
    """The backend's graph with the N chunks and the SIMILAR edges before the add, through GraphStore (cached)."""
    import polars as pl

    from lexgraph.storage.graph_store import GraphStore

    source = _input_dir(Path(args.cache), args.chunks)
    folder = _graph_dir(Path(args.cache), args.backend, args.chunks)
    spec = {**_spec(args), "backend": args.backend, "input": (_read_spec(source) or {}).get("figures")}
    saved = _read_spec(folder)
    if saved is not None and saved.get("spec") == spec:
        return {**saved["figures"], "cached": True}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    chunks = pl.read_parquet(source / "chunks.parquet").head(args.chunks)
    edges = _edge_rows(source, "before")
    frame = edges.frame()
    path = folder / _graph_name()
    started = time.perf_counter()
    with GraphStore.writer(path) as graph:
        nodes_started = time.perf_counter()
        graph.replace_documents(_source_rows(chunks), chunks)
        nodes_s = time.perf_counter() - nodes_started
        edges_started = time.perf_counter()
        graph.replace_similarity_edges(frame)
        edges_s = time.perf_counter() - edges_started
        close_started = time.perf_counter()
    close_s = time.perf_counter() - close_started
    build_s = time.perf_counter() - started
    counted, chunk_nodes = _similar_and_chunks(path)
    if counted != edges.height or chunk_nodes != args.chunks:
        raise SystemExit(f"built graph holds {counted} SIMILAR edges and {chunk_nodes} chunks, "
                         f"not {edges.height} and {args.chunks}")
    Path(str(path) + ".writer.lock").unlink(missing_ok=True)
    figures = {"backend": args.backend, "edges": counted, "chunks": chunk_nodes, "build_s": round(build_s, 2),
               "nodes_s": round(nodes_s, 2), "edges_s": round(edges_s, 2), "close_s": round(close_s, 2),
               "size_mib": round(sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20, 1)}
    (folder / "spec.json").write_text(json.dumps({"spec": spec, "figures": figures}, indent=1))
    return {**figures, "cached": False}


class _Timed:
    """The graph store with the seconds of each call the SIMILAR write makes, by method name."""

    def __init__(self, graph) -> None:
        self._graph, self.seconds = graph, {}

    def __getattr__(self, name: str):
        method = getattr(self._graph, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        return timed


def measure(args: argparse.Namespace) -> dict:
    """One repeat on a fresh copy of the cached graph: the new document's nodes, then the SIMILAR diff."""
    import polars as pl

    from lexgraph.indexing.knn_update import KnnResult, _similar_edges_to
    from lexgraph.storage.graph_store import GraphStore, graph_engine

    source = _input_dir(Path(args.cache), args.chunks)
    cached = _graph_dir(Path(args.cache), args.backend, args.chunks)
    name = _graph_name()
    work = cached / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    for file in cached.iterdir():  # the graph file and any companion (a WAL), not the lock or the spec
        if file.is_file() and file.name.startswith(name) and not file.name.endswith(".writer.lock"):
            shutil.copy2(file, work / file.name)
    path = work / name
    chunks = pl.read_parquet(source / "chunks.parquet")
    new = chunks.slice(args.chunks)
    removed, added, reweighted, after = _diff(source, args.diff_size, args.seed)
    result = KnnResult(after, chunks.select("chunk_id", "doc_id"), None, None, rebuilt=False,
                       edge_changes=(removed, added, reweighted), previous_generation="before")
    graph_engine(path)  # the engine's import is not the open's

    # the per-document run: the new document's nodes, in a writer of its own
    started = time.perf_counter()
    with GraphStore.writer(path) as graph:
        open_s = time.perf_counter() - started
        nodes_started = time.perf_counter()
        graph.replace_documents(_source_rows(new), new)
    nodes_s = time.perf_counter() - nodes_started
    edges_before, chunks_before = _similar_and_chunks(path)

    # the corpus run's chunk_knn_graph write: the diff, then the writer closed
    started = time.perf_counter()
    with GraphStore.writer(path) as graph:
        reopen_s = time.perf_counter() - started
        timed = _Timed(graph)
        diff_started = time.perf_counter()
        figures = _similar_edges_to(timed, result, "before")
        diff_s = time.perf_counter() - diff_started
        close_started = time.perf_counter()
    close_s = time.perf_counter() - close_started
    reader = GraphStore(path)
    try:
        edges_after = reader.count("SIMILAR")
    finally:
        reader.close()
    deleted = figures["similar_edges_removed"] + figures["similar_edges_updated"]
    copied = figures["similar_edges_added"] + figures["similar_edges_updated"]
    problems = []
    if figures["similar_edges_rewritten"] or figures.get("similar_edges_mismatch"):
        problems.append(f"the diff did not leave the KNN graph's edges: {figures}")
    if chunks_before != args.chunks + args.new_chunks:
        problems.append(f"{chunks_before} chunks after the new document's nodes, not {args.chunks + args.new_chunks}")
    if edges_after != edges_before - deleted + copied or edges_after != after.height:
        problems.append(f"SIMILAR edges: {edges_before} before, {edges_after} after, deleted {deleted}, "
                        f"copied {copied}, the KNN graph has {after.height}")
    return {"backend": args.backend, "edges_before": edges_before, "edges_after": edges_after,
            "expected_after": after.height, "deleted": deleted, "copied": copied,
            "reweighted": figures["similar_edges_updated"], "restored": figures["similar_edges_restored"],
            "open_s": open_s, "reopen_s": reopen_s, "nodes_s": nodes_s, "diff_s": diff_s, "close_s": close_s,
            "total_s": diff_s + close_s, "calls_s": {k: round(v, 4) for k, v in timed.seconds.items()},
            "problems": problems}


# -- the parent: children per backend, alternating ----------------------------------------------------------------


def _child(args: argparse.Namespace, step: str, backend: str | None = None) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_similar_diff", "--child", step, "--chunks", str(args.chunks),
               "--doc-chunks", str(args.doc_chunks), "--new-chunks", str(args.new_chunks), "--seed", str(args.seed),
               "--cache", str(args.cache),
               "--diff-size", "full" if args.diff_size is None else ",".join(map(str, args.diff_size))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if backend:
        env["LEXGRAPH_GRAPH_BACKEND"] = backend
        command += ["--backend", backend]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line[len(CHILD_PREFIX):] for line in done.stdout.splitlines() if line.startswith(CHILD_PREFIX)]
    figures = json.loads(lines[-1]) if lines else {}
    named = done.returncode == 1 and figures.get("problems")  # a measure that found problems: the parent names them
    if not lines or (done.returncode != 0 and not named):
        raise SystemExit(f"{step} ({backend or 'input'}) failed ({done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    return figures


def _diff_size(text: str) -> tuple[int, int] | None:
    if text == "full":
        return None
    try:
        deleted, copied = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DELETED,COPIED or full, got {text!r}") from None
    if deleted < 0 or copied < 0:
        raise argparse.ArgumentTypeError(f"expected counts of at least 0, got {text!r}")
    return deleted, copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=_positive_int, default=100_000, help="chunks in the graph before the add")
    parser.add_argument("--repeats", type=_positive_int, default=3, help="timed adds per backend (median)")
    parser.add_argument("--doc-chunks", type=_positive_int, default=DOC_CHUNKS, help="chunks per document of the graph")
    parser.add_argument("--new-chunks", type=_positive_int, default=NEW_CHUNKS, help="chunks of the added document")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--diff-size", type=_diff_size, default=DIFF_SIZE,
                        help="SIMILAR rows deleted,copied: a sample of the KNN diff that size (e.g. 350,900), or "
                             "'full' (default) for the whole diff the product computes")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of kuzu, ladybug")
    parser.add_argument("--cache", default=str(CACHE), help="where the input and the graphs are cached")
    parser.add_argument("--child", choices=("input", "build", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        step = {"input": make_input, "build": build_graph, "measure": measure}[args.child]
        figures = step(args)
        print(CHILD_PREFIX + json.dumps(figures), flush=True)
        return 1 if figures.get("problems") else 0

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: each of {', '.join(BACKENDS)}, got {args.backends!r}")
    data = _child(args, "input")
    print(f"similar-diff-input chunks={data['chunks']} new_chunks={data['new_chunks']} k={data['k']} "
          f"mode={data['mode']} edges={data['edges']} edges_after={data['edges_after']} removed={data['removed']} "
          f"added={data['added']} reweighted={data['reweighted']} new_chunk_edges={data['new_chunk_edges']} "
          f"input_s={data['input_s']}{' (cached)' if data['cached'] else ''}", flush=True)
    builds = {}
    for backend in backends:
        built = builds[backend] = _child(args, "build", backend)
        print(f"similar-diff-build chunks={args.chunks} backend={backend} edges={built['edges']} "
              f"build_s={built['build_s']} nodes_s={built['nodes_s']} edges_s={built['edges_s']} "
              f"close_s={built['close_s']} size_mib={built['size_mib']}{' (cached)' if built['cached'] else ''}",
              flush=True)
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    failed = False
    for repeat in range(args.repeats):
        for backend in (backends if repeat % 2 == 0 else backends[::-1]):
            run = _child(args, "measure", backend)
            runs[backend].append(run)
            failed |= bool(run["problems"])
            for problem in run["problems"]:
                print(f"PROBLEM {backend}: {problem}", flush=True)
    medians = {}
    size = "full" if args.diff_size is None else ",".join(map(str, args.diff_size))
    for backend in backends:
        done = runs[backend]
        med = {key: statistics.median(r[key] for r in done)
               for key in ("total_s", "diff_s", "close_s", "open_s", "reopen_s", "nodes_s")}
        calls = {name: statistics.median(r["calls_s"].get(name, 0.0) for r in done) for name in done[0]["calls_s"]}
        medians[backend] = med["total_s"]
        last = done[-1]
        runs_s = "/".join(f"{r['total_s']:.2f}" for r in done)
        print(f"similar-diff chunks={args.chunks} backend={backend} diff={size} edges={last['edges_before']} "
              f"diff_deleted={last['deleted']} diff_added={last['copied']} reweighted={last['reweighted']} "
              f"edges_after={last['edges_after']} median_s={med['total_s']:.3f} "
              f"runs_s={runs_s} diff_s={med['diff_s']:.3f} "
              f"close_s={med['close_s']:.3f} open_s={med['open_s']:.3f} reopen_s={med['reopen_s']:.3f} "
              f"nodes_s={med['nodes_s']:.3f} "
              + " ".join(f"{name}_s={seconds:.3f}" for name, seconds in calls.items()), flush=True)
    if {"kuzu", "ladybug"} <= set(medians):
        print(f"ratio ladybug/kuzu={medians['ladybug'] / medians['kuzu']:.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
