"""The embedding backends side by side on one machine, in one command.

1. texts/s on the same chunk texts and keyword sentences of the corpus, in this process, median of
   repeats: torch in input order (the path before batching by length), then torch, onnx and onnx-int8
   batched by length; and how far the onnx vectors agree with torch (cosine).
2. The full build of the corpus with `lexgraph bench` once per backend of --backends (torch and the
   adopted default, onnx), each in a fresh process and home, then the dev questions: build seconds,
   the torch/other ratio and recall@5.

    .venv/bin/python -m benchmarks.bench_embedder --corpus ../shared/datasets/lihua-world/LiHuaWorld.zip \\
        --questions ../shared/datasets/lihua-world/questions.dev.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import median, prepare_corpus
from lexgraph.extract.chunking import chunk_text
from lexgraph.extract.embedder import DEFAULT_BACKEND, EMBED_BACKENDS, ONNX, ONNX_INT8, TORCH, Embedder
from lexgraph.extract.keywords import extract_keywords
from lexgraph.inbox import iter_corpus_files

RECALL_METHODS = ("dense", "keyword", "hybrid")


def sample_texts(corpus: Path, embedder: Embedder, files: int, chunk_tokens: int = 200) -> tuple[list[str], list[str]]:
    """Chunk texts of the first `files` documents, chunked as the index does, and their keyword sentences."""
    chunks: list[str] = []
    for path in iter_corpus_files(corpus)[:files]:
        text = path.read_text(errors="replace")
        chunks += [c.text for c in chunk_text(text, embedder, chunk_tokens, markdown=path.suffix == ".md")]
    sentences = extract_keywords([(str(i), text) for i, text in enumerate(chunks)]).sentences
    return chunks, sentences


def texts_per_second(encode, texts: list[str], repeats: int) -> tuple[float, np.ndarray]:
    seconds, vectors = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        vectors = encode(texts)
        seconds.append(time.perf_counter() - start)
    return len(texts) / median(seconds), vectors


def measure_throughput(corpus: Path, files: int, repeats: int) -> list[dict]:
    models = {backend: Embedder(backend=backend) for backend in (TORCH, ONNX, ONNX_INT8)}
    chunks, sentences = sample_texts(corpus, models[TORCH], files)
    # equal lengths keep the input order: batches as they were before sorting by length
    variants = {"torch, input order": lambda texts: models[TORCH]._encode_by_length(texts, [0] * len(texts), None)}
    for backend, model in models.items():
        variants[f"{backend}, by length"] = lambda texts, m=model: m._encode_by_length(texts, m.count_tokens(texts), None)
    rows = []
    for kind, texts in (("chunks", chunks), ("sentences", sentences)):
        results = {name: texts_per_second(encode, texts, repeats) for name, encode in variants.items()}
        base = results["torch, input order"][0]
        for name, (rate, _) in results.items():
            rows.append({"texts": kind, "n": len(texts), "variant": name, "texts_per_s": rate, "speedup": rate / base})
        for backend in (ONNX, ONNX_INT8):
            cosine = (results["torch, by length"][1] * results[f"{backend}, by length"][1]).sum(axis=1)
            rows.append({"texts": kind, "n": len(texts), "variant": f"cosine {backend} vs torch",
                         "min": float(cosine.min()), "p5": float(np.percentile(cosine, 5)),
                         "median": float(np.median(cosine))})
    return rows


def build_and_evaluate(corpus: str, questions: str, backend: str, home: Path) -> dict:
    """`lexgraph bench` in a fresh process and home: the build's seconds and the dev recall@5."""
    env = dict(os.environ, LEXGRAPH_EMBED_BACKEND=backend)
    command = [sys.executable, "-c", "import sys; from orchestration.cli import main; sys.exit(main())",
               "--home", str(home), "bench", "--corpus", corpus, "--questions", questions, "--quiet",
               "--methods", ",".join(RECALL_METHODS)]
    # CPU seconds of the child (build and recall evaluation): unlike wall time, barely moved by other load
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (cache,) = (home / "bench").iterdir()
    build = json.loads((cache / "index_build.json").read_text())[-1]
    summary = json.loads((cache / "report" / "report.json").read_text())["summary"]
    recall = {f"{m} {t}": summary[m][t]["recall"]["5"] for m in RECALL_METHODS for t in ("Single", "Multi")
              if t in summary.get(m, {})}
    return {"backend": backend, "seconds": build["seconds"], "cpu_seconds": cpu,
            "embedding_tokens": build["embedding_tokens"], "recall@5": recall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="folder of documents or a .zip of them")
    parser.add_argument("--questions", required=True, help="the dev questions for recall")
    parser.add_argument("--files", type=int, default=40, help="documents whose texts the throughput part embeds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default=f"{TORCH},{DEFAULT_BACKEND}",
                        help="comma-separated backends to build with, the first the baseline")
    parser.add_argument("--no-build", action="store_true", help="only the throughput and agreement part")
    parser.add_argument("--no-throughput", action="store_true", help="only the build part")
    args = parser.parse_args()

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in EMBED_BACKENDS]
    if unknown or not backends:
        parser.error(f"--backends takes some of {', '.join(EMBED_BACKENDS)}, got {args.backends!r}")
    if not args.no_throughput:
        print_throughput(measure_throughput(prepare_corpus(args.corpus), args.files, args.repeats), args.repeats)
    if not args.no_build:
        print_builds([build_and_evaluate_in(args, backend) for backend in backends])


def build_and_evaluate_in(args, backend: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-embedder-") as tmp:
        return build_and_evaluate(args.corpus, args.questions, backend, Path(tmp))


def print_throughput(rows: list[dict], repeats: int) -> None:
    print("## throughput on the same texts, this process (median of", repeats, "repeats)")
    for row in rows:
        if "texts_per_s" in row:
            print(f"{row['texts']:>9} n={row['n']:<5} {row['variant']:<22} {row['texts_per_s']:8.1f} texts/s "
                  f"x{row['speedup']:.2f}")
        else:
            print(f"{row['texts']:>9} n={row['n']:<5} {row['variant']}: min {row['min']:.4f} "
                  f"p5 {row['p5']:.4f} median {row['median']:.4f}")


def print_builds(results: list[dict]) -> None:
    print("\n## full build and dev recall, one fresh process and home per backend")
    for r in results:
        recall = "  ".join(f"{k} {v:.3f}" for k, v in r["recall@5"].items())
        print(f"{r['backend']:<10} build {r['seconds']:7.1f} s  process CPU {r['cpu_seconds']:7.1f} s  "
              f"{r['embedding_tokens']:,} tokens  R@5: {recall}")
    base = results[0]
    for other in results[1:]:
        worst = min(other["recall@5"][k] - base["recall@5"][k] for k in base["recall@5"])
        print(f"build speed-up {other['backend']} over {base['backend']}: x{base['seconds'] / other['seconds']:.2f} "
              f"wall, x{base['cpu_seconds'] / other['cpu_seconds']:.2f} process CPU; "
              f"largest recall@5 drop: {max(-worst, 0.0) + 0.0:.3f}")


if __name__ == "__main__":
    main()
