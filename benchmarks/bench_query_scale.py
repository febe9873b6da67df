"""The query side at scale: `lexgraph serve` on synthetic LanceDB indexes of 100,000 and 1,000,000 chunks.

What is synthetic (nothing here is a real corpus):
- texts: 80 words each, 70 % drawn from a Zipf(1.1) distribution over a 30,000-word made-up vocabulary and
  30 % from the chunk's topic (one of √N/1 topics, Zipf-distributed sizes, 200 words each);
- vectors: unit 384-d vectors clustered by topic (topic centroid + Gaussian noise, cosine ≈ 0.5 to the
  centroid), not embeddings of the texts: dense hits are meaningful for the ANN's recall, not for answers;
- keywords: 20 per topic, vectors near the topic centroid, linked to the chunks whose text holds them;
- documents: 20 consecutive chunks each; spans are consecutive within a document (no source files).

The index is cached under .lexgraph/bench/query-scale-<N>/ (built once; re-runs skip the build), then
`lexgraph serve` starts on it as a subprocess with the real query embedder and the lance backend, and this
prints one line per figure: time from process start to the first answer, the server's VmHWM and VmRSS after
the load, the semantic route's p50/p95 over sequential questions, 8 concurrent clients for 30 s (errors,
answers/s), and the ANN's dense recall@10 against exact search (synthetic query vectors drawn like chunks,
and real embedded questions).

    .venv/bin/python benchmarks/bench_query_scale.py --chunks 100000
    .venv/bin/python benchmarks/bench_query_scale.py --chunks 1000000
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_serve import Client, percentile, rss_mb, start_server, stop, until_up  # noqa: E402
from lexgraph.ids import chunk_id  # noqa: E402
from lexgraph.query.retrieval import sub_queries  # noqa: E402
from lexgraph.settings import Settings  # noqa: E402
from lexgraph.storage import lance_indexes as li  # noqa: E402
from lexgraph.storage.vector_store import (CHUNKS, KEYWORDS, SEARCH_TEXT, SOURCE_SCHEMA, VectorStore,  # noqa: E402
                                          chunk_schema)
from lexgraph.terms import search_terms  # noqa: E402

DIM, WORDS, TOPIC_WORDS, CHUNK_WORDS, TOPIC_SHARE, DOC_CHUNKS, KEYWORDS_PER_TOPIC = 384, 30_000, 200, 80, 0.3, 20, 20
BATCH = 50_000
CACHE = ROOT / ".lexgraph" / "bench"
QUESTIONS = ROOT.parent / "shared" / "datasets" / "lihua-world" / "questions.dev.json"


def vocabulary(rng: np.random.Generator) -> np.ndarray:
    """WORDS distinct made-up words of 2–4 syllables."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words: dict[str, None] = {}
    while len(words) < WORDS:
        parts = rng.integers(0, len(syllables), size=rng.integers(2, 5))
        words["".join(syllables[p] for p in parts)] = None
    return np.array(list(words))


class Corpus:
    """The synthetic corpus's generators, all from one seed."""

    def __init__(self, n: int, seed: int = 7):
        self.n, self.rng = n, np.random.default_rng(seed)
        self.words = vocabulary(self.rng)
        self.topics = max(10, int(np.sqrt(n)))
        centroids = self.rng.normal(size=(self.topics, DIM)).astype(np.float32)
        self.centroids = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
        self.topic_words = self.rng.integers(0, WORDS, size=(self.topics, TOPIC_WORDS))
        sizes = 1.0 / np.arange(1, self.topics + 1) ** 0.8
        self.topic_p = self.rng.permutation(sizes / sizes.sum())
        ranks = 1.0 / np.arange(1, WORDS + 1) ** 1.1
        self.word_p = ranks / ranks.sum()

    def vectors(self, topics: np.ndarray, noise: float = 1.0) -> np.ndarray:
        v = self.centroids[topics] + self.rng.normal(scale=noise / np.sqrt(DIM), size=(len(topics), DIM)).astype(
            np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def texts(self, topics: np.ndarray) -> list[str]:
        general = self.rng.choice(WORDS, size=(len(topics), CHUNK_WORDS), p=self.word_p)
        own = self.topic_words[topics[:, None], np.minimum(self.rng.zipf(1.3, size=(len(topics), CHUNK_WORDS)) - 1,
                                                           TOPIC_WORDS - 1)]
        mix = np.where(self.rng.random((len(topics), CHUNK_WORDS)) < TOPIC_SHARE, own, general)
        return [" ".join(self.words[row]) for row in mix]

    def batch(self, start: int, stop: int) -> tuple[pa.Table, pl.DataFrame, np.ndarray]:
        """Chunk rows start..stop as the chunk table's Arrow schema, their keyword links and their topics."""
        topics = self.rng.choice(self.topics, size=stop - start, p=self.topic_p)
        texts, vectors = self.texts(topics), self.vectors(topics)
        rows = np.arange(start, stop)
        docs = [f"synthetic-{r // DOC_CHUNKS:07d}" for r in rows]
        orders = rows % DOC_CHUNKS
        lengths = np.array([len(t) + 1 for t in texts])
        starts = np.zeros(len(rows), dtype=np.int64)
        for i in range(1, len(rows)):  # spans run on within a document
            starts[i] = 0 if orders[i] == 0 else starts[i - 1] + lengths[i - 1]
        if orders[0]:
            starts[0] = 0  # a batch starting mid-document (never, with BATCH a multiple of DOC_CHUNKS)
        ids = [chunk_id(d, int(o), t) for d, o, t in zip(docs, orders, texts)]
        frame = pl.DataFrame({
            "chunk_id": ids, "doc_id": docs, "order": orders.astype(np.int32), "text": texts,
            "char_start": starts, "char_end": starts + lengths - 1, "heading_path": [""] * len(rows),
            "token_count": np.full(len(rows), CHUNK_WORDS + 20, dtype=np.int32),
            "source_path": [f"synthetic/{d}.txt" for d in docs], "content_hash": [d for d in docs],
            "page_start": pl.Series([None] * len(rows), dtype=pl.Int32),
            "page_end": pl.Series([None] * len(rows), dtype=pl.Int32), "model": ["all-MiniLM-L6-v2"] * len(rows)})
        table = frame.to_arrow().append_column("vector", pa.FixedSizeListArray.from_arrays(
            pa.array(vectors.ravel()), DIM)).append_column(
            SEARCH_TEXT, pa.array([search_terms(t) for t in texts], pa.string())).cast(chunk_schema(DIM))
        links = []
        for i, t in enumerate(topics):  # a topic keyword links to the chunks whose text holds it
            held = set(texts[i].split())
            links.extend((k, ids[i]) for k in self.topic_keywords[t] if k in held)
        links = pl.DataFrame(links, schema={"keyword": pl.String, "chunk_id": pl.String}, orient="row")
        return table, links, topics

    @property
    def topic_keywords(self) -> list[list[str]]:
        if not hasattr(self, "_topic_keywords"):
            self._topic_keywords = [list(dict.fromkeys(self.words[self.topic_words[t, :KEYWORDS_PER_TOPIC]].tolist()))
                                    for t in range(self.topics)]
        return self._topic_keywords

    def keyword_table(self) -> pa.Table:
        """Each keyword once, its vector near the centroid of the first topic that has it."""
        first: dict[str, int] = {}
        for t, names in enumerate(self.topic_keywords):
            for name in names:
                first.setdefault(name, t)
        vectors = self.vectors(np.array(list(first.values())), noise=0.7)
        return pa.table({"keyword": list(first), "sentence_count": pa.array(np.ones(len(first), dtype=np.int64)),
                         "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)})


def index_dir(home: Path) -> Path:
    """The one index version folder of a cached home."""
    found = sorted(p for p in (home / "default").iterdir() if p.is_dir() and (p / "lance").is_dir())
    if len(found) != 1:
        raise SystemExit(f"{home / 'default'}: expected one index version folder, found {[p.name for p in found]}")
    return found[0]


def bench_home(n: int) -> Path:
    return CACHE / f"query-scale-{n}-g1"  # g1: with the synthetic lexical graph


def build(n: int, home: Path) -> dict:
    """Write the synthetic index (chunk rows in batches, sources, keywords, links), then its search indexes."""
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    store = VectorStore(Settings(home=partial).lance_uri)
    corpus = Corpus(n)
    started = time.perf_counter()
    link_frames, topics, chunk_ids, doc_ids = [], [], [], []
    table = None
    for start in range(0, n, BATCH):
        rows, links, batch_topics = corpus.batch(start, min(n, start + BATCH))
        table = store.db.create_table(CHUNKS, data=rows) if table is None else table
        if start:
            table.add(rows)
        link_frames.append(links)
        topics.append(batch_topics)
        chunk_ids += rows.column("chunk_id").to_pylist()
        doc_ids += rows.column("doc_id").to_pylist()
        print(f"  rows {min(n, start + BATCH)}/{n} ({time.perf_counter() - started:.0f} s)", flush=True)
    docs = (n + DOC_CHUNKS - 1) // DOC_CHUNKS
    names = [f"synthetic-{d:07d}" for d in range(docs)]
    sources = pa.table({"doc_id": names, "uri": [f"synthetic/{d}.txt" for d in names],
                        "relative_path": [f"{d}.txt" for d in names], "title": names, "format": ["txt"] * docs,
                        "content_hash": names, "size_bytes": pa.array(np.zeros(docs), pa.int64()),
                        "chunk_count": pa.array(np.full(docs, DOC_CHUNKS), pa.int32()),
                        "ingested_at": pa.array([None] * docs, pa.timestamp("us", tz="UTC"))}).cast(SOURCE_SCHEMA)
    store.db.create_table("sources", data=sources)
    store.db.create_table(KEYWORDS, data=corpus.keyword_table())
    written = time.perf_counter() - started
    report = li.refresh(store, Settings(home=partial).index_dir / "corpus", pl.concat(link_frames))
    report["write_seconds"] = round(written, 1)
    report["graph"] = build_graph(corpus, np.concatenate(topics), chunk_ids, doc_ids, partial)
    (partial / "synthetic.json").write_text(json.dumps({"chunks": n, "topics": corpus.topics, **report}, indent=1))
    shutil.rmtree(home, ignore_errors=True)
    partial.rename(home)
    return report


def build_graph(corpus: Corpus, topics: np.ndarray, chunk_ids: list[str], doc_ids: list[str], home: Path) -> dict:
    """The synthetic lexical graph (benchmarks.synthetic_graph) written by the product's graph tables writer, as
    the graph_tables corpus step writes it; seconds to generate and to write, rows per table."""
    from lexgraph.indexing.corpus_state import CorpusFiles
    from lexgraph.query.lance_graph_tables import record_tables, write_graph_tables
    from synthetic_graph import lexical_graph

    started = time.perf_counter()
    graph, types = lexical_graph(corpus, topics, DOC_CHUNKS)
    generated = time.perf_counter() - started
    settings = Settings(home=home)
    store = VectorStore(settings.lance_uri)
    counts = write_graph_tables(store, graph, chunk_ids, doc_ids, entity_types=types)
    record_tables(CorpusFiles(settings.index_dir), graph, counts, "synthetic", None)
    written = time.perf_counter() - started - generated
    print(f"  lexical graph: generated in {generated:.0f} s, tables written in {written:.0f} s: {counts}", flush=True)
    return {"generate_seconds": round(generated, 1), "write_seconds": round(written, 1), "rows": counts,
            "bridge_pair_share": round(graph.bridge_pair_share, 4)}


def indexed_copy(home: Path) -> Path:
    """A copy of a real index home (e.g. the LiHua-World cache, never written to) with the search indexes the
    corpus job's search_indexes asset builds, keyword links from its Extract store included; kept beside the
    bench caches and reused."""
    from lexgraph.indexing import corpus_keywords
    from lexgraph.storage.extract_store import ExtractStore

    copy = CACHE / f"query-scale-copy-{home.parent.name}"
    if (copy / "search_indexes.done").exists():
        return copy
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(home, copy, symlinks=True)
    version = index_dir(copy)
    store = VectorStore(str(version / "lance"))
    links = corpus_keywords.keyword_chunk_links(ExtractStore(version / "extract"), sorted(store.indexed_hashes()))
    report = li.refresh(store, version / "corpus", links)
    (copy / "search_indexes.done").write_text(json.dumps(report))
    return copy


def ensure_index(n: int) -> Path:
    home = bench_home(n)
    if (home / "synthetic.json").exists():
        print(f"cached synthetic index: {home}")
        settings = Settings(home=home)
        store = VectorStore(settings.lance_uri)
        if li.rows_without_terms(store.db.open_table(CHUNKS)):  # cached before search_text: what an ingest does
            print("  bringing its full-text index up to search_text (once)", flush=True)
            print(f"  {li.refresh(store, settings.index_dir / 'corpus')}", flush=True)
        return home
    print(f"building the synthetic index of {n} chunks in {home} (once; cached)", flush=True)
    report = build(n, home)
    print(f"build of {n} chunks: write {report['write_seconds']} s, search indexes {report['build_seconds']}")
    return home


def questions(corpus: Corpus, count: int, seed: int = 11) -> list[str]:
    """Questions in the synthetic vocabulary: four words of one topic (its keywords among them) and two
    common words, so that the full-text and keyword channels have hits, as real questions do; one in four
    is compound (two clauses, so the hybrid also retrieves for each clause, as it does for real ones)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        topic = rng.choice(corpus.topics, p=corpus.topic_p)
        own = corpus.words[corpus.topic_words[topic, rng.integers(0, KEYWORDS_PER_TOPIC * 2, size=4)]]
        common = corpus.words[rng.integers(0, 200, size=2)]
        joint = "and" if len(out) % 4 == 3 else "of"
        out.append(f"What did {own[0]} {own[1]} say about {own[2]} {joint} {common[0]} {own[3]} {common[1]}?")
    return out


def route_latencies(client: Client, asked: list[str], route: str) -> tuple[list[float], int, list[str]]:
    """One client over `asked` on one route: latencies of the answered questions, errors, the routes taken."""
    latencies, failed, taken = [], 0, []
    for question in asked:
        status, body, latency = client.ask(question, route)
        if status == 200:
            latencies.append(latency)
            taken.append((body or {}).get("route", "?"))
        else:
            failed += 1
    return latencies, failed, taken


def serve_figures(home: Path, asked: list[str], env_extra: dict, clients: int, seconds: float,
                  route_questions: int = 60) -> dict:
    """Start `lexgraph serve` on a scratch home whose collection links to the index; time the first answer,
    read the server's memory, then one client over `asked` and `clients` clients for `seconds`."""
    scratch = Path(tempfile.mkdtemp(prefix="lexgraph-query-scale-"))
    # the cached index under the version today's settings look for (the embedder backend is part of it; the
    # synthetic vectors are no embedder's)
    (scratch / "default").mkdir()
    (scratch / "default" / Settings.from_env(home=scratch).index_version).symlink_to(
        index_dir(home), target_is_directory=True)
    started = time.perf_counter()
    server, port, log_path = start_server(scratch, **env_extra)
    figures: dict = {}
    try:
        client = Client(port)
        status, body, _ = until_up(server, log_path, lambda: client.ask(asked[0], "semantic"))
        figures["first_answer_s"] = time.perf_counter() - started
        if status != 200:
            raise SystemExit(f"the first question got {status}: {body}\n{log_path.read_text()[-3000:]}")
        figures["rss_mb"], figures["hwm_mb"] = rss_mb(server.pid)
        figures["health"] = client.request("GET", "/health")[1]
        for question in asked[1:6]:  # warm-up, not counted
            client.ask(question, "semantic")
        latencies, compound, failed = [], [], 0
        for question in asked[6:]:
            status, _, latency = client.ask(question, "semantic")
            if status == 200:
                latencies.append(latency)
                compound.append(bool(sub_queries(question)))
            else:
                failed += 1
        figures.update(sequential=latencies, sequential_errors=failed, sequential_compound=compound)
        for route in ("graph", "agentic"):  # the same questions on the graph routes, one client
            for question in asked[1:4]:
                client.ask(question, route)  # warm-up: the graph tables' first reads
            figures[route] = route_latencies(client, asked[6:6 + route_questions], route)
        figures.update(concurrent(port, asked, clients, seconds))
        figures["rss_after_load_mb"], figures["hwm_after_load_mb"] = rss_mb(server.pid)
    finally:
        stop(server, scratch)
    return figures


def concurrent(port: int, asked: list[str], clients: int, seconds: float) -> dict:
    answered, errors, latencies = [0], [0], []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(number: int) -> None:
        mine, position = Client(port), number * len(asked) // clients
        while time.perf_counter() < deadline:
            try:
                status, _, latency = mine.ask(asked[position % len(asked)], "semantic")
            except OSError:
                status, latency = 0, 0.0
            position += 1
            with lock:
                if status == 200:
                    answered[0] += 1
                    latencies.append(latency)
                else:
                    errors[0] += 1
        mine.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"concurrent_answers": answered[0], "concurrent_errors": errors[0],
            "throughput": answered[0] / (time.perf_counter() - began), "concurrent_latency": latencies}


def ann_recall(search, table, vectors: np.ndarray) -> float:
    """Overlap of the lance backend's dense top 10 (its own limit, nprobes and refine factor) with exact search's."""
    found = []
    for vector in vectors:
        exact = table.search(vector).distance_type("cosine").limit(10).bypass_vector_index().select(
            ["_rowid"]).to_arrow().column("_rowid").to_pylist()
        rows, _ = search.dense(vector)
        approx = search.rows.rowids[rows[:10]].tolist()
        found.append(len(set(exact) & set(approx)) / 10)
    return float(np.mean(found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--home", type=Path, help="serve a copy of this index home (with LanceDB's search indexes "
                        "built in the copy) instead of the synthetic one, e.g. .lexgraph/bench/lihuaworld-aac215cda60d/index")
    parser.add_argument("--backend", default="auto", choices=("auto", "memory", "lance"))
    parser.add_argument("--questions", type=int, default=220, help="sequential questions (≥ 200 are timed)")
    parser.add_argument("--route-questions", type=int, default=60, help="questions timed on the graph and agentic routes")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--recall-samples", type=int, default=50)
    parser.add_argument("--hybrid-only", action="store_true",
                        help="only time the hybrid ranking in process, memory against lance backend")
    args = parser.parse_args()
    home = indexed_copy(args.home.resolve()) if args.home else ensure_index(args.chunks)
    if args.build_only:
        return
    corpus = Corpus(args.chunks)
    asked = questions(corpus, args.questions + 6) if not args.home else real_questions(args.questions + 6)
    name = args.home.resolve().parent.name if args.home else f"synthetic {args.chunks}"
    label = f"{name} [{args.backend}]"
    if args.hybrid_only:
        ratio = hybrid_ratio(home, asked[:60])
        print(f"{name}: load memory {ratio['load_s']['memory']:.1f} s, lance {ratio['load_s']['lance']:.1f} s; "
              f"hybrid ranking median memory {ratio['median_ms']['memory']:.1f} ms, lance "
              f"{ratio['median_ms']['lance']:.1f} ms (lance/memory {ratio['ratio']:.2f}, same process, 3 passes "
              f"over 60 questions, embedding excluded)")
        return
    figures = serve_figures(home, asked, {"LEXGRAPH_QUERY_BACKEND": args.backend}, args.clients, args.seconds,
                            args.route_questions)
    backend = figures["health"]["query_backend"]
    chunks = figures["health"]["chunks"]
    for route, (latencies, failed, taken) in (("semantic", (figures["sequential"], figures["sequential_errors"], [])),
                                              ("graph", figures["graph"]), ("agentic", figures["agentic"])):
        fell_back = sum(t != route for t in taken)
        print(f"query-scale chunks={chunks} backend={backend['backend']} route={route} "
              f"p50_ms={1000 * percentile(latencies, 50):.0f} p95_ms={1000 * percentile(latencies, 95):.0f} "
              f"first_answer_s={figures['first_answer_s']:.1f} rss_mb={figures['rss_after_load_mb']:.0f}"
              + (f" errors={failed}" if failed else "") + (f" answered_on_another_route={fell_back}" if fell_back else ""))
    print(f"{label}: chunks {figures['health']['chunks']}, backend {backend['backend']} ({backend['reason']})")
    print(f"{label}: first answer {figures['first_answer_s']:.1f} s after process start")
    print(f"{label}: memory after the first answer VmHWM {figures['hwm_mb']:.0f} MB, VmRSS {figures['rss_mb']:.0f} MB")
    seq = figures["sequential"]
    print(f"{label}: semantic route, one client, {len(seq)} questions: p50 {1000 * percentile(seq, 50):.0f} ms, "
          f"p95 {1000 * percentile(seq, 95):.0f} ms, errors {figures['sequential_errors']}")
    for kind, wanted in (("one-clause", False), ("compound", True)):
        part = [t for t, c in zip(seq, figures["sequential_compound"]) if c == wanted]
        if part:
            print(f"{label}:   {kind} questions ({len(part)}): p50 {1000 * percentile(part, 50):.0f} ms, "
                  f"p95 {1000 * percentile(part, 95):.0f} ms")
    print(f"{label}: {args.clients} clients for {args.seconds:.0f} s: {figures['concurrent_answers']} answers, "
          f"{figures['throughput']:.1f} answers/s, errors {figures['concurrent_errors']}, p95 "
          f"{1000 * percentile(figures['concurrent_latency'], 95):.0f} ms")
    print(f"{label}: memory after the load VmHWM {figures['hwm_after_load_mb']:.0f} MB, "
          f"VmRSS {figures['rss_after_load_mb']:.0f} MB")
    if not args.home and args.recall_samples:
        for kind, value in recall(home, corpus, args.recall_samples).items():
            print(f"{label}: dense recall@10 of the ANN against exact search, {kind}: {value:.3f}")


def hybrid_ratio(home: Path, asked: list[str], repeats: int = 3) -> dict:
    """The hybrid ranking alone (the semantic route's channels and fusion, no answering, no retry), memory
    backend against lance backend in this one process over the same questions, alternating question by
    question: load seconds and median ms of each, and lance/memory."""
    from lexgraph.extract.embedder import Embedder
    from lexgraph.query.retrieval import Retriever, load_index, load_lance_index

    settings = Settings.from_env(home=home)
    version = index_dir(home).name
    settings = Settings.from_env(home=home) if settings.index_version == version else _pinned(home, version)
    embedder = Embedder.shared(settings.embed_model, backend=settings.embed_backend)
    cached = {q: embedder.embed_query(q) for q in asked}  # both backends get the same vectors, embedding excluded
    loads, retrievers = {}, {}
    for name, load in (("memory", load_index), ("lance", load_lance_index)):
        started = time.perf_counter()
        retrievers[name] = Retriever(load(settings), cached.__getitem__, None,
                                     lambda texts: [cached.get(t) if t in cached else embedder.embed_query(t)
                                                    for t in texts])
        loads[name] = time.perf_counter() - started
    times = {"memory": [], "lance": []}
    for _ in range(repeats):
        for question in asked:
            for name, retriever in retrievers.items():
                started = time.perf_counter()
                retriever.scores("hybrid", question)
                times[name].append(time.perf_counter() - started)
    medians = {name: 1000 * float(np.median(values)) for name, values in times.items()}
    return {"load_s": loads, "median_ms": medians, "ratio": medians["lance"] / medians["memory"]}


def _pinned(home: Path, version: str) -> Settings:
    """Settings that find the cached index version (built before the embedder backend was part of it)."""
    from lexgraph.extract.embedder import TORCH

    settings = Settings.from_env(home=home, embed_backend=TORCH)
    if settings.index_version != version:
        raise SystemExit(f"{home}: no settings find index version {version}")
    return settings


def real_questions(count: int) -> list[str]:
    data = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    rows = list(data.values() if isinstance(data, dict) else data)
    return [rows[i % len(rows)]["question"] for i in range(count)]


def recall(home: Path, corpus: Corpus, samples: int) -> dict[str, float]:
    """Dense recall@10 of the ANN (the lance backend's nprobes and refine factor) against exact flat search:
    query vectors drawn like chunk vectors, and real questions embedded by the query embedder."""
    from lexgraph.extract.embedder import Embedder
    from lexgraph.query import lance_backend

    settings = Settings(home=home)
    store = VectorStore(str(index_dir(home) / "lance"))
    _, search, _ = lance_backend.load(store, 1.2, 0.75, True)
    table = store.db.open_table(CHUNKS)
    drawn = corpus.vectors(np.random.default_rng(5).choice(corpus.topics, size=samples, p=corpus.topic_p))
    embedder = Embedder.shared(settings.embed_model)
    real = np.stack([embedder.embed_query(q) for q in real_questions(samples)]).astype(np.float32)
    return {f"{samples} synthetic query vectors": ann_recall(search, table, drawn),
            f"{samples} embedded LiHua-World questions": ann_recall(search, table, real)}


if __name__ == "__main__":
    main()
