"""Kùzu writes of one small document's diff into a big graph: the GraphStore of a base commit (COPY for every
add, whole-table counts around each diff) against the working tree's, alternating on fresh copies of a graph,
each timed from the first write to the end of close() (which checkpoints what the writes left in the WAL).

    cp -a <index>/graph.kuzu /tmp/kzA/graph.kuzu   # never the original: Kùzu admits one writer process
    .venv/bin/python benchmarks/bench_kuzu_writes.py --graph /tmp/kzA/graph.kuzu --repeats 3
    .venv/bin/python benchmarks/bench_kuzu_writes.py --graph /tmp/kzA/graph.kuzu --sizes 900,5000,20000,100000

The second form times adds of n SIMILAR edges by COPY (what GraphStore does) and by one LOAD FROM ... CREATE.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import polars as pl

from lexgraph.storage import graph_store as new_graph_store

BASE = "4c2f9a2"  # the last commit before the write paths changed


def base_module(commit: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:lexgraph/storage/graph_store.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    module = types.ModuleType("graph_store_base")
    exec(compile(source, f"{commit}:graph_store.py", "exec"), module.__dict__)
    return module


class Batches:
    """Realistic batches drawn from the graph: edges between existing chunks, one document's keyword links."""

    def __init__(self, graph: Path, rng: np.random.Generator):
        store = new_graph_store.GraphStore(graph)
        chunks = store.query("MATCH (c:Chunk) RETURN c.id AS id, c.doc_id AS doc_id")
        similar = store.query("MATCH (a:Chunk)-[r:SIMILAR]->(b:Chunk) RETURN a.id AS src, b.id AS dst, r.kind AS kind")
        self.doc = chunks["doc_id"][int(rng.integers(chunks.height))]
        self.doc_links = store.query("MATCH (c:Chunk)<-[r:KEYWORD_IN]-(k:Keyword) WHERE c.doc_id = $d RETURN k.id AS "
                                     "keyword, c.id AS chunk_id, r.occurrences AS sentence_count", {"d": self.doc})
        self.doc_chunks = chunks.filter(pl.col("doc_id") == self.doc)["id"].to_list()
        self.topics = store.query("MATCH (t:Topic) RETURN t.id AS id LIMIT 5")["id"].to_list()
        store.close()
        ids = chunks["id"].to_numpy()
        pick = lambda n: ids[rng.integers(len(ids), size=n)]  # noqa: E731
        self.added = pl.DataFrame({"src": pick(900), "dst": pick(900), "kind": rng.choice(["semantic", "lexical"], 900),
                                   "weight": rng.random(900)})
        self.removed = similar.sample(350, seed=int(rng.integers(1 << 30)))
        self.gone_keywords = sorted(set(self.doc_links["keyword"].sample(5, seed=1).to_list()))
        self.new_keywords = [f"bench-keyword-{i}" for i in range(5)]
        # ~300 links into the document's chunks, some to the new keywords
        links = self.doc_links.filter(~pl.col("keyword").is_in(self.gone_keywords)).head(295)
        self.links = pl.concat([links, pl.DataFrame({
            "keyword": self.new_keywords, "chunk_id": self.doc_chunks[:5], "sentence_count": [1] * 5},
            schema=links.schema)])
        self.statements, self.statement_edges = self.lexical_rows(100, rng)
        # PageRank scores: every chunk (as skeleton_selection writes them) or the ~1% whose score changed
        self.scores = pl.DataFrame({"chunk_id": ids, "pagerank": rng.random(len(ids)),
                                    "selected": rng.random(len(ids)) < 0.1})
        self.changed_scores = self.scores.sample(1000, seed=3)

    def lexical_rows(self, n: int, rng: np.random.Generator) -> tuple[pl.DataFrame, dict[str, pl.DataFrame]]:
        ids = [f"bench-statement-{i}" for i in range(n)]
        chunk = [self.doc_chunks[i % len(self.doc_chunks)] for i in range(n)]
        topic = [self.topics[i % len(self.topics)] for i in range(n)]
        at = pl.datetime(2026, 1, 1, time_unit="us")
        statements = pl.DataFrame({"id": ids, "doc_id": [self.doc] * n, "chunk_id": chunk, "topic_id": topic,
                                   "text": [f"statement {i}" for i in range(n)]}).with_columns(
            pl.lit("bench").alias("extractor"), pl.lit("m").alias("model"), pl.lit("p1").alias("prompt_version"),
            at.alias("extracted_at"))
        return statements, {"EXTRACTED_FROM": pl.DataFrame({"from": ids, "to": chunk}),
                            "BELONGS_TO": pl.DataFrame({"from": ids, "to": topic})}


# --- one add's Kùzu writes, as the callers in lexgraph/indexing did them at BASE and do them now ---

def similarity_base(g, b: Batches) -> None:
    g.count("SIMILAR")
    g.delete_similarity_edges(b.removed)
    g.count("SIMILAR")
    g.add_similarity_edges(b.added)
    g.count("SIMILAR")


def similarity_now(g, b: Batches) -> None:
    g.delete_similarity_edges(b.removed)
    g.add_similarity_edges(b.added)
    g.count("SIMILAR")


def keywords_base(g, b: Batches) -> None:
    g.count("KEYWORD_IN")
    g.delete_keywords([])
    g.add_keywords(b.new_keywords)
    g.delete_keyword_links([b.doc])
    g.count("KEYWORD_IN")
    g.add_keyword_links(b.links)
    g.count("KEYWORD_IN")
    g.count("KEYWORD_IN"), g.count("Keyword")


def keywords_now(g, b: Batches) -> None:
    g.delete_keywords([])
    g.add_keywords(b.new_keywords)
    g.delete_keyword_links([b.doc])
    g.add_keyword_links(b.links)
    g.count("KEYWORD_IN"), g.count("Keyword")


def keywords_gone(g, b: Batches) -> None:
    g.delete_keywords(b.gone_keywords)


def lexical(g, b: Batches) -> None:
    g.add_lexical_rows("Statement", b.statements)
    for rel, frame in b.statement_edges.items():
        g.add_lexical_rows(rel, frame)


def scores_all(g, b: Batches) -> None:
    g.set_chunk_scores(b.scores)


def scores_changed(g, b: Batches) -> None:
    g.set_chunk_scores(b.changed_scores)


def fingerprint(path: Path, b: Batches) -> str:
    """Digest of what the writes touch: SIMILAR edges of the batches' chunks, the document's keyword links,
    keywords, the new statements' edges and the chunks' scores."""
    g = new_graph_store.GraphStore(path)
    chunks = sorted(set(b.added["src"]) | set(b.added["dst"]) | set(b.removed["src"]) | set(b.removed["dst"]))
    parts = [
        g.query("MATCH (a:Chunk)-[r:SIMILAR]-(c:Chunk) WHERE a.id IN $ids RETURN a.id, c.id, r.kind, r.weight",
                {"ids": chunks}),
        g.query("MATCH (c:Chunk)<-[r:KEYWORD_IN]-(k:Keyword) WHERE c.doc_id = $d RETURN k.id, c.id, r.occurrences",
                {"d": b.doc}),
        g.query("MATCH (k:Keyword) RETURN k.id"),
        g.query("MATCH (s:Statement)-[r]->(n) WHERE s.doc_id = $d RETURN s.id, s.text, s.extracted_at, label(r), n.id",
                {"d": b.doc}),
        g.query("MATCH (c:Chunk) RETURN c.id, c.pagerank, c.in_skeleton"),
        g.query("MATCH (a)-[r:SIMILAR]->(b) WITH a.id AS s RETURN count(*)"),
        g.query("MATCH (a)-[r:KEYWORD_IN]->(b) WITH a.id AS s RETURN count(*)"),
    ]
    g.close()
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.sort(part.columns).write_csv().encode())
    return digest.hexdigest()[:16]


def run(module, work: Path, source: Path, write, b: Batches, check: bool) -> tuple[float, str]:
    shutil.copyfile(source, work)
    store = module.GraphStore(work, writable=True)
    start = time.perf_counter()
    write(store, b)
    store.close()  # checkpoints
    seconds = time.perf_counter() - start
    return seconds, fingerprint(work, b) if check else ""


def compare(args, source: Path, work: Path, b: Batches) -> None:
    base = base_module(args.base)
    now = new_graph_store
    cases = [("SIMILAR: delete 350, add 900, counts",
              {"before": (base, similarity_base), "after": (now, similarity_now)}),
             (f"KEYWORD_IN: one document's {b.links.height} links replaced, 5 keywords added, counts",
              {"before": (base, keywords_base), "after": (now, keywords_now)}),
             (f"KEYWORD_IN: {len(b.gone_keywords)} keywords deleted with their links",
              {"before": (base, keywords_gone), "after": (now, keywords_gone)}),
             (f"lexical: {b.statements.height} statements + EXTRACTED_FROM + BELONGS_TO",
              {"before": (base, lexical), "after": (now, lexical)}),
             ("set_chunk_scores (unchanged method), input of",
              {"all 100k chunks": (now, scores_all), "the 1,000 changed": (now, scores_changed)})]
    for name, variants in cases:
        times: dict[str, list[float]] = {label: [] for label in variants}
        prints = {}
        order = list(variants)
        for repeat in range(args.repeats):
            for label in order if repeat % 2 == 0 else order[::-1]:
                module, write = variants[label]
                seconds, digest = run(module, work, source, write, b, check=repeat == 0 and "set_chunk" not in name)
                times[label].append(seconds)
                prints.setdefault(label, digest)
        print(name)
        first = statistics.median(times[order[0]])
        for label in order:
            median = statistics.median(times[label])
            same = "" if "set_chunk" in name else f"  same graph as {order[0]}: {prints[label] == prints[order[0]]}"
            print(f"  {label:24} median {median:6.3f} s  ({first / median:4.2f}x)  runs {[round(t, 2) for t in times[label]]}"
                  f"{same}", flush=True)


def sizes(args, work: Path, rng: np.random.Generator) -> None:
    """SIMILAR adds of n edges by COPY and by CREATE, each into a fresh copy, through close(): COPY rewrites
    the node groups it touches at once, CREATE leaves that to the checkpoint at close."""
    store = new_graph_store.GraphStore(args.graph)
    ids = store.query("MATCH (c:Chunk) RETURN c.id AS id")["id"].to_numpy()
    store.close()
    print(f"{'edges':>8} {'COPY s':>8} {'CREATE s':>9}")
    for n in (int(x) for x in args.sizes.split(",")):
        frame = pl.DataFrame({"from": ids[rng.integers(len(ids), size=n)], "to": ids[rng.integers(len(ids), size=n)],
                              "kind": ["semantic"] * n, "weight": rng.random(n)})
        times: dict[str, list[float]] = {"copy": [], "create": []}
        for repeat in range(args.repeats):
            for way in ("copy", "create") if repeat % 2 == 0 else ("create", "copy"):
                shutil.copyfile(args.graph, work)
                store = new_graph_store.GraphStore(work, writable=True)
                start = time.perf_counter()
                if way == "create":  # both chunks joined on their ids: two id lookups plan a cross product
                    store.conn.execute("LOAD FROM $rows MATCH (a:Chunk) WHERE a.id = from_ MATCH (b:Chunk) "
                                       "WHERE b.id = to_ CREATE (a)-[:SIMILAR {kind: kind, weight: weight}]->(b)",
                                       {"rows": frame.rename({"from": "from_", "to": "to_"}).to_arrow()})
                else:
                    store.conn.execute("COPY SIMILAR FROM $rows", {"rows": frame.to_arrow()})
                store.close()
                times[way].append(time.perf_counter() - start)
        print(f"{n:8d} {statistics.median(times['copy']):8.3f} {statistics.median(times['create']):9.3f}", flush=True)


def prepare(source: Path, base: Path, b: Batches) -> None:
    """A copy in which the document holds ~300 keyword links (a synthetic document holds thousands)."""
    shutil.copyfile(source, base)
    store = new_graph_store.GraphStore(base, writable=True)
    store.delete_keyword_links([b.doc])
    store.add_keyword_links(b.links.filter(~pl.col("keyword").is_in(b.new_keywords)))
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph", type=Path, required=True, help="a copy of an index's graph.kuzu (left unchanged)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", default=BASE, help="commit whose GraphStore is the 'before'")
    parser.add_argument("--sizes", help="comma-separated SIMILAR batch sizes: COPY against CREATE instead")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(dir=args.graph.parent) as scratch:
        work = Path(scratch) / "graph.kuzu"
        if args.sizes:
            sizes(args, work, rng)
        else:
            b = Batches(args.graph, rng)
            prepare(args.graph, Path(scratch) / "base.kuzu", b)
            compare(args, Path(scratch) / "base.kuzu", work, b)


if __name__ == "__main__":
    main()
