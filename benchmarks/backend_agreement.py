"""Does another embedding backend retrieve what the torch index retrieves? Against an index built with
torch (read only): re-embeds a sample of its chunk texts with the backend and compares them with the
stored torch vectors, and embeds the dev questions with both backends and compares each question's
dense top-k over the stored chunk vectors.

    .venv/bin/python -m benchmarks.backend_agreement --index .lexgraph/bench/document-aab79a31e89e/index \\
        --questions ../shared/datasets/musique/questions.dev.json --backend onnx
"""
from __future__ import annotations

import argparse

import numpy as np

from lexgraph.evaluation import metrics as ev
from lexgraph.extract.embedder import EMBED_BACKENDS, TORCH, Embedder
from lexgraph.settings import Settings
from lexgraph.storage.vector_store import VectorStore


def top_k(chunk_vectors: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    scores = queries @ chunk_vectors.T
    return [set(np.argpartition(-row, k)[:k].tolist()) for row in scores]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="an index home built with LEXGRAPH_EMBED_BACKEND=torch")
    parser.add_argument("--questions", required=True)
    parser.add_argument("--backend", default="onnx", choices=[b for b in EMBED_BACKENDS if b != TORCH])
    parser.add_argument("--chunks", type=int, default=300, help="chunk texts re-embedded")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    settings = Settings.from_env(home=args.index, embed_backend=TORCH)
    chunks, stored = VectorStore(settings.lance_uri).chunk_vectors(["chunk_id", "text"])
    if not len(stored):
        raise SystemExit(f"{settings.index_dir}: no torch-built chunks there")
    other = Embedder.shared(settings.embed_model, backend=args.backend)
    sample = np.random.default_rng(0).choice(len(stored), size=min(args.chunks, len(stored)), replace=False)
    cosine = (other.embed([chunks["text"][int(i)] for i in sample]) * stored[sample]).sum(axis=1)
    print(f"{len(sample)} chunk texts, {args.backend} vs stored torch vectors: cosine min {cosine.min():.5f}, "
          f"median {np.median(cosine):.5f}")
    questions = [q.question for q in ev.load_questions(args.questions)]
    torch_queries = Embedder.shared(settings.embed_model, backend=TORCH).embed_queries(questions)
    other_queries = other.embed_queries(questions)
    same = [a == b for a, b in zip(top_k(stored, torch_queries, args.k), top_k(stored, other_queries, args.k))]
    print(f"{len(questions)} questions: dense top-{args.k} over the torch chunk vectors identical for "
          f"{sum(same)} ({sum(same) / len(same):.3f}); query cosine min "
          f"{(torch_queries * other_queries).sum(axis=1).min():.5f}")


if __name__ == "__main__":
    main()
