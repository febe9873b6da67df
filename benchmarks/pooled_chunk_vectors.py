"""What if chunk vectors were pooled from sentence vectors (each sentence embedded once and shared with
the keyword stage) instead of embedding the chunk text? On the chunks of a corpus sample: how far the
pooled vector is from the chunk's own (cosine), the word pieces each way costs, and the seconds.

    .venv/bin/python -m benchmarks.pooled_chunk_vectors --corpus ../shared/datasets/lihua-world/LiHuaWorld.zip
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.bench_embedder import sample_texts
from benchmarks.common import prepare_corpus
from lexgraph.extract.embedder import Embedder
from lexgraph.extract.keywords import split_sentences


def chunk_sentences(texts: list[str]) -> list[list[str]]:
    return [[text[s:e] for s, e in split_sentences(text)] or [text] for text in texts]


def pooled_vectors(embedder: Embedder, sentences: list[list[str]]) -> np.ndarray:
    """Each chunk's vector as the normalised mean of its sentences' vectors."""
    vectors = embedder.embed([s for group in sentences for s in group])
    owners = np.repeat(np.arange(len(sentences)), [len(group) for group in sentences])
    pooled = np.zeros((len(sentences), vectors.shape[1]), dtype=np.float32)
    np.add.at(pooled, owners, vectors)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="folder of documents or a .zip of them")
    parser.add_argument("--files", type=int, default=40, help="documents whose chunks are compared")
    args = parser.parse_args()
    embedder = Embedder.shared()
    chunks, keyword_sentences = sample_texts(prepare_corpus(args.corpus), embedder, args.files)
    sentences = chunk_sentences(chunks)
    started = time.perf_counter()
    direct = embedder.embed(chunks)
    direct_seconds = time.perf_counter() - started
    started = time.perf_counter()
    pooled = pooled_vectors(embedder, sentences)
    pooled_seconds = time.perf_counter() - started
    cosine = (direct * pooled).sum(axis=1)
    print(f"{len(chunks)} chunks, {sum(map(len, sentences))} sentences ({embedder.backend})")
    print(f"word pieces: chunk texts {sum(embedder.count_tokens(chunks)):,}; keyword sentences (embedded anyway) "
          f"{sum(embedder.count_tokens(keyword_sentences)):,}")
    print(f"seconds: chunk texts {direct_seconds:.1f}; sentences embedded and pooled {pooled_seconds:.1f}")
    print(f"cosine pooled vs chunk vector: median {np.median(cosine):.3f}, p5 {np.percentile(cosine, 5):.3f}, "
          f"min {cosine.min():.3f}")


if __name__ == "__main__":
    main()
