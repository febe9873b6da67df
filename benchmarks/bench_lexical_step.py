"""The lexical_graph step alone, in a fresh process: one new document added to a large index, then
`build_lexical_graph` timed, either as this checkout has it (a diff from the saved state) or as a given
older lexical.py has it (e.g. `git show fbe8931^:lexgraph/indexing/lexical.py > /tmp/old_lexical.py`).

    .venv/bin/python -m benchmarks.bench_lexical_step HOME WORK [--old /tmp/old_lexical.py]

HOME is an index home (e.g. a synthetic index's `home`); only what the step reads or writes is copied to
WORK (the graph, the LanceDB sources, statements and entities tables, the lexical Parquet tables, the corpus
folder). The new document (20 chunks of the synthetic corpus's text) goes through the real per-document
stages first (untimed); the step is then timed with the real embedder loaded beforehand.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

STAGES = ("sources", "chunks", "extractions", "statements", "topics", "facts", "entities", "relations")
TABLES = ("sources", "statements", "entities")


def prepare(home: Path, work: Path) -> Path:
    from lexgraph.settings import Settings

    index = Settings.from_env(home=home).index_dir
    target = work / "home" / index.relative_to(home)
    if work.exists():
        shutil.rmtree(work)
    target.mkdir(parents=True)
    shutil.copytree(index / "graph.kuzu", target / "graph.kuzu") if (index / "graph.kuzu").is_dir() else \
        shutil.copy2(index / "graph.kuzu", target / "graph.kuzu")
    for table in TABLES:
        shutil.copytree(index / "lance" / f"{table}.lance", target / "lance" / f"{table}.lance")
    for stage in STAGES:
        shutil.copytree(index / "extract" / stage, target / "extract" / stage, copy_function=shutil.copy2)
    shutil.copytree(index / "corpus", target / "corpus", ignore=shutil.ignore_patterns("knn_*", "keyword_*"))
    return work / "home"


def add_document(home: Path, embedder, chunks: int = 20) -> str:
    from benchmarks.synthetic_index import CorpusSpec, document_name, document_text
    from lexgraph.indexing import lexical
    from lexgraph.indexing.pipeline import chunk_documents, load_graph, load_sources
    from lexgraph.extract.nlp_extractor import NLPExtractor
    from lexgraph.ids import document_id
    from lexgraph.settings import Settings
    from lexgraph.storage.extract_store import ExtractStore
    from lexgraph.storage.graph_store import GraphStore
    from lexgraph.storage.vector_store import VectorStore

    settings = Settings.from_env(home=home)
    spec = CorpusSpec(100_000, 100)
    inbox = home.parent / "inbox"
    inbox.mkdir(exist_ok=True)
    name = document_name(spec.documents)
    (inbox / name).write_text(document_text(spec, spec.documents, chunks))
    store, vectors = ExtractStore(settings.extract_dir), VectorStore(settings.lance_uri)
    doc_id = document_id(name)
    sources = load_sources({doc_id: inbox / name}, inbox, store, settings.index_version)
    done = chunk_documents(sources.done, store, embedder, settings.chunk_tokens).done
    with GraphStore.writer(settings.graph_path) as graph:
        load_graph(done, store, graph, vectors)
    lexical.extract_documents(done, store, set(), None, NLPExtractor(settings.entity_types), None, None, "bench")
    lexical.flatten_documents(done, store)
    return doc_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--old", type=Path, help="an older lexical.py to time instead of this checkout's")
    parser.add_argument("--profile", action="store_true", help="print the step's cProfile (cumulative, top 40)")
    args = parser.parse_args()
    from lexgraph.indexing import lexical
    from lexgraph.indexing.corpus_index import CorpusFiles
    from lexgraph.extract.embedder import Embedder
    from lexgraph.settings import Settings
    from lexgraph.storage.extract_store import ExtractStore
    from lexgraph.storage.graph_store import GraphStore
    from lexgraph.storage.vector_store import VectorStore

    home = prepare(args.home, args.work)
    embedder = Embedder.shared()
    embedder.embed(["warm up"])
    doc_id = add_document(home, embedder)
    settings = Settings.from_env(home=home)
    vectors, store = VectorStore(settings.lance_uri), ExtractStore(settings.extract_dir)
    module, kwargs = lexical, {"state_dir": CorpusFiles(settings.index_dir).lexical_state}
    if args.old:
        spec = importlib.util.spec_from_file_location("old_lexical", args.old)
        module = importlib.util.module_from_spec(spec)
        sys.modules["old_lexical"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        kwargs = {}
    import cProfile
    import pstats

    profile = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    with GraphStore.writer(settings.graph_path) as graph:
        if profile:
            profile.enable()
        result = module.build_lexical_graph(sorted(vectors.indexed_hashes()), store, graph, vectors, embedder,
                                             run_id="bench", **kwargs)
        if profile:
            profile.disable()
    seconds = time.perf_counter() - started
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    print(json.dumps({"code": str(args.old or "checkout"), "seconds": round(seconds, 2), "added": doc_id,
                      "mode": getattr(result, "mode", "rebuild"), "reason": getattr(result, "reason", ""),
                      "documents_read": len(getattr(result, "documents_read", result.documents)),
                      "counts": result.counts, "embedded": result.embedded,
                      "written": getattr(result, "written", {}), "digest": result.digest}))


if __name__ == "__main__":
    main()
