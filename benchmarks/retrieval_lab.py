"""In-process lab for the `auto` route's ranking on LiHua-World dev and MuSiQue dev together.

`cache` computes, once per question, the router's decision and every channel's scores for the whole question and
for each of its clauses (on copies of the cached indexes), and pickles them; `evaluate(variant)` then scores a
ranking function over the cache on both sets (LiHua recall@5 Single / Multi, all@5 Multi; MuSiQue cov@12000),
so an idea costs seconds, not a bench run. The figures of the shipped variant equal `lexgraph bench --methods auto`.

    LEXGRAPH_EMBED_BACKEND=torch python -m benchmarks.retrieval_lab cache --lihua HOME --musique HOME --out FILE
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.answers import build_engine
from lexgraph.index import LexIndex
from lexgraph.query.retrieval import sub_queries
from lexgraph.settings import Settings

CHANNELS = ("hybrid", "statement", "entity", "path", "keyword", "dense", "bm25")
KEEP = 400  # rows kept per channel ranking


def _top(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    finite = np.flatnonzero(np.isfinite(scores))
    best = finite[np.argsort(-scores[finite], kind="stable")][:KEEP]
    return best.astype(np.int32), scores[best].astype(np.float64)


def cache_set(home: Path, questions_path: Path, budget: int) -> dict:
    retriever = LexIndex(Settings.from_env(home=home)).retriever()
    engine = build_engine(retriever, budget)
    rows = []
    questions = [q for q in ev.load_questions(questions_path) if not q.is_null]
    for i, q in enumerate(questions):
        route, decision = engine.decide(q.question)
        auto = engine.retrieve(q.question)  # what `lexgraph bench --methods auto` ranks (with its retry)
        texts = [q.question, *sub_queries(q.question)]
        per_text = []
        for text in texts:
            channels = {c: _top(engine.retriever.scores(c, text)) for c in CHANNELS if c != "statement"}
            channels["statement"] = _top(engine._statement_channel(text)[0])
            per_text.append(channels)
        rows.append({"qid": q.qid, "qtype": q.qtype, "question": q.question, "answer": q.answer,
                     "evidence": q.evidence, "route": route, "auto_route": auto.route, "auto": _top(auto.scores),
                     "probabilities": decision.probabilities if decision else None, "texts": texts,
                     "channels": per_text})
        if (i + 1) % 25 == 0:
            print(f"  {questions_path.parent.name}: {i + 1}/{len(questions)}", file=sys.stderr, flush=True)
    chunks = retriever.index.chunks
    return {"rows": rows, "size": retriever.index.size, "source_path": chunks["source_path"].to_list(),
            "text": chunks["text"].to_list(), "token_count": chunks["token_count"].to_list(),
            "doc_id": chunks["doc_id"].to_list(), "selectivity": engine.graph_selectivity,
            "graph_weights": engine.graph_weights}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["cache"])
    parser.add_argument("--lihua", required=True)
    parser.add_argument("--musique", required=True)
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    shared = Path(args.shared) / "datasets"
    data = {"lihua": cache_set(Path(args.lihua), shared / "lihua-world" / "questions.dev.json", 1024),
            "musique": cache_set(Path(args.musique), shared / "musique" / "questions.dev.json", 12000)}
    Path(args.out).write_bytes(pickle.dumps(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------------------------------------
# evaluation over the cache


def full(size: int, pair) -> np.ndarray:
    scores = np.full(size, -np.inf)
    scores[pair[0]] = pair[1]
    return scores


def figures(data: dict, name: str, ranking) -> dict:
    """ranking(row, set data) -> scores per chunk. LiHua: recall@5 Single / Multi, all@5 Multi; MuSiQue:
    coverage at 12,000 tokens (the bench's hits: top 50 / top 375 chunks)."""
    d = data[name]
    keys = [ev.document_key(p) for p in d["source_path"]]
    out: dict[str, list] = {}
    for row in d["rows"]:
        order = _order(row, d, ranking)
        if name == "lihua":
            docs = [keys[i] for i in order[:50]]
            out.setdefault(f"R5 {row['qtype']}", []).append(ev.evidence_recall(docs, row["evidence"], 5))
            if row["qtype"] == "Multi":
                out.setdefault("all5 Multi", []).append(ev.all_evidence_found(docs, row["evidence"], 5))
        else:
            out.setdefault("cov12k", []).append(ev.answer_covered(row["answer"], _within_budget(order, d)))
    return {k: round(float(ev.mean(v)), 3) for k, v in out.items()}


def _order(row: dict, d: dict, ranking) -> np.ndarray:
    """Chunk positions by the ranking's score, best first (unscored ones left out)."""
    scores = ranking(row, d)
    finite = np.flatnonzero(np.isfinite(scores))
    return finite[np.argsort(-scores[finite], kind="stable")]


def _within_budget(order: np.ndarray, d: dict, budget: int = 12000) -> list[str]:
    """The ranked chunks' texts that fit in the token budget (the coverage measure's context)."""
    texts, used = [], 0
    for i in order[:375]:
        if used + d["token_count"][i] > budget:
            break
        texts.append(d["text"][i])
        used += d["token_count"][i]
    return texts


def per_question(data: dict, name: str, ranking) -> list:
    d = data[name]
    keys = [ev.document_key(p) for p in d["source_path"]]
    values = []
    for row in d["rows"]:
        order = _order(row, d, ranking)
        if name == "lihua":
            values.append(ev.evidence_recall([keys[i] for i in order[:50]], row["evidence"], 5))
        else:
            values.append(ev.answer_covered(row["answer"], _within_budget(order, d)))
    return values


def both(data: dict, ranking) -> dict:
    return {**figures(data, "lihua", ranking), **figures(data, "musique", ranking)}


def load(path: str) -> dict:
    return pickle.loads(Path(path).read_bytes())
