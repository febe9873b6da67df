"""`make bench-combined`: the four development corpora indexed together, each corpus's recall against its own
index's (issue 42).

LiHua-World, the MuSiQue file, HippoRAG's MuSiQue and HotpotQA passages (bench_generalize.CORPORA) go into one
folder, each corpus in a subfolder and every file name prefixed with its corpus ("hotpotqa-passages__p00…txt"), so
document keys stay apart across corpora and each corpus's evidence ids are prefixed to match. The folder is indexed
once through the product's Dagster ingest (ensure_index, index_bench_corpus) under .lexgraph/bench/combined-<hash>/,
then evaluated with LEXGRAPH_QUERY_BACKEND=memory on that index and =lance on a copy of it (the lance run builds
LanceDB's search indexes and graph tables in the copy only). Alone figures come from the per-corpus report.json
files of `lexgraph bench` on each corpus's own index given with --alone (none given: "–").

    python -m benchmarks.bench_combined [--shared ../shared] [--alone memory=R.json --alone lance=R.json ...]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from benchmarks.bench_generalize import CORPORA
from benchmarks.common import peak_rss_mb
from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.bench import build_cost, ensure_index, evaluate_index
from lexgraph.evaluation.corpus import PreparedCorpus, prepare_corpus
from lexgraph.ids import content_hash, document_key, normalise_evidence_id
from lexgraph.inbox import iter_corpus_files
from orchestration.cli import index_bench_corpus

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("hybrid", "statement", "entity", "path", "semantic", "graph", "agentic")
BACKENDS = ("memory", "lance")
SEP = "__"  # corpus prefix separator in file names, hence in document keys


def prefixed(corpus: str, key: str) -> str:
    """The combined index's document key of a corpus's document key (an evidence id)."""
    return normalise_evidence_id(f"{corpus}{SEP}{key}")


def corpus_of(key: str) -> str:
    return key.split(SEP, 1)[0]


def mapped_questions(corpus: str, source: Path, target: Path) -> list[ev.Question]:
    """The corpus's questions with prefixed evidence ids, written where evaluate_index can read them."""
    questions = ev.load_questions(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps([{"id": q.qid, "question": q.question, "answer": q.answer, "type": q.qtype,
                                   "answer_aliases": list(q.aliases), "evidence": [prefixed(corpus, e) for e in q.evidence]}
                                  for q in questions], indent=1))
    return ev.load_questions(target)


def materialise(parts: dict[str, PreparedCorpus], cache: Path) -> PreparedCorpus:
    """One folder of every corpus's files (copied once; a marker holding the hash says it is complete)."""
    digest = content_hash("|".join(f"{name}={p.corpus_hash}" for name, p in sorted(parts.items())) + f"|sep={SEP}")
    home = cache / "bench" / f"combined-{digest[:12]}"
    folder = home / "corpus"
    if not (folder / ".complete").exists():
        partial = folder.with_name("corpus.partial")
        shutil.rmtree(partial, ignore_errors=True)
        for name, part in parts.items():
            for path in iter_corpus_files(part.folder):
                relative = path.relative_to(part.folder)
                target = partial / name / relative.parent / f"{name}{SEP}{path.name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        (partial / ".complete").write_text(digest)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return PreparedCorpus(Path(f"combined:{','.join(parts)}"), folder, "folder", digest, home)


def alone_figures(reports: list[str]) -> dict[tuple[str, str], dict]:
    """(corpus, backend) -> {"figures": {method: value}, "per_question": {(method, qid): recall@5 or coverage},
    "source"} from the named `lexgraph bench` report.json files of the alone indexes (a later one wins)."""
    found: dict[tuple[str, str], dict] = {}
    for item in reports:
        backend, _, path = item.partition("=")
        data = json.loads(Path(path).read_text())
        corpus = next(n for n, (p, _, _) in CORPORA.items() if data["corpus"]["path"].endswith(p))
        budget = data["settings"]["budget_tokens"]
        found[(corpus, backend)] = {"figures": {m: score(s["overall"], budget) for m, s in data["summary"].items()},
                                    "per_question": {(r["method"], r["qid"]): question_score(r, budget)
                                                     for r in data["per_question"]}, "source": path}
    return found


def score(overall: dict, budget: int) -> float:
    """The table's figure: coverage at the MuSiQue file's 12,000 tokens, else recall@5."""
    return overall["coverage"] if budget == CORPORA["musique"][2] else overall["recall"]["5"]


def question_score(result: dict, budget: int):
    return result["covered"] if budget == CORPORA["musique"][2] else result["recall"]["5"]


def evaluate(prepared: PreparedCorpus, backend: str, datasets: Path) -> dict[str, dict]:
    """Every corpus's questions on the combined index under one query backend: corpus -> report data."""
    os.environ["LEXGRAPH_QUERY_BACKEND"] = backend
    settings, build = ensure_index(prepared, index_bench_corpus, progress=True)
    print(f"[{backend}] index {settings.index_dir}: {build.new} new, {build.changed} changed, "
          f"{build.unchanged} unchanged in {build.seconds:.0f} s", file=sys.stderr, flush=True)
    reports = {}
    for name, (_, questions, budget) in CORPORA.items():
        path = prepared.home / "questions" / f"{name}.json"
        mapped_questions(name, datasets / questions, path)
        print(f"[{backend}] {name}: {questions} at {budget} tokens", file=sys.stderr, flush=True)
        report = evaluate_index(settings, path, budget, methods=METHODS, out_dir=prepared.home / "report" / f"{name}-{backend}",
                                corpus_info={"path": str(prepared.folder), "index_dir": str(settings.index_dir)},
                                build=build, cost=build_cost(prepared.home), progress=True)
        missing = report.data["questions"]["unmatched_evidence_ids"]
        if missing:
            raise SystemExit(f"{name}: {len(missing)} evidence id(s) name no indexed document, e.g. {missing[:3]}")
        reports[name] = json.loads((report.out_dir / "report.json").read_text())  # as saved: string keys
    return reports


def _f(value: float | None, form: str = ".3f") -> str:
    return "–" if value is None else format(value, form)


def foreign_share(data: dict, corpus: str, method: str) -> float:
    """Share of the top-5 documents that belong to another corpus."""
    tops = [r["documents"][:5] for r in data["per_question"] if r["method"] == method]
    return ev.mean(sum(corpus_of(d) != corpus for d in top) / max(len(top), 1) for top in tops)


def changes(method: str, data: dict, alone: dict) -> tuple[list[dict], int, int]:
    """This method's questions, most lost against the alone run first, and how many went down and up."""
    budget = data["settings"]["budget_tokens"]
    rows = [r for r in data["per_question"] if r["method"] == method]
    drop = {r["qid"]: (alone.get((method, r["qid"])) or 0) - (question_score(r, budget) or 0) for r in rows}
    return sorted(rows, key=lambda r: -drop[r["qid"]]), sum(d > 0 for d in drop.values()), sum(d < 0 for d in drop.values())


def explain(corpus: str, large: list[tuple[str, str]], combined: dict, alone: dict, questions: list[ev.Question]) -> None:
    """Per method and backend past 0.01: questions down and up against alone; one example, the worst question of
    the first of them, with its combined top 5 (each document's corpus in its key)."""
    counts = []
    for method, backend in large:
        _, down, up = changes(method, combined[backend][corpus], alone[(corpus, backend)]["per_question"])
        counts.append(f"{method}/{backend} {down} down {up} up")
    method, backend = large[0]
    worst = changes(method, combined[backend][corpus], alone[(corpus, backend)]["per_question"])[0][0]
    question = next(q for q in questions if q.qid == worst["qid"])
    budget = combined[backend][corpus]["settings"]["budget_tokens"]
    print(f"- {corpus}: {'; '.join(counts)}.\n  e.g. {method}/{backend} {worst['qid']} {question.question!r}: alone "
          f"{alone[(corpus, backend)]['per_question'].get((method, worst['qid']))}, combined {question_score(worst, budget)}; "
          f"evidence {list(question.evidence)}; combined top 5 {worst['documents'][:5]}")


def print_table(prepared: PreparedCorpus, alone: dict, combined: dict[str, dict[str, dict]], lance_seconds: float) -> None:
    index, built = combined["memory"]["lihua-world"]["index"], json.loads((prepared.home / "combined.json").read_text())
    print(f"\ncombined index: {index['chunks']} chunks, {index['documents']} documents, "
          f"{index['size_bytes']['total'] / 2**20:.0f} MiB; build {build_cost(prepared.home)['build_seconds']:.0f} s "
          f"({built}); lance search indexes and graph tables {lance_seconds:.0f} s")
    print(f"alone figures from: {sorted({v['source'] for v in alone.values()})}\n")
    print("| corpus | method | alone memory / lance | combined memory / lance | Δ memory / lance | other corpora in top 5 (memory) |")
    print("|---|---|---|---|---|---|")
    large = []
    for name in CORPORA:
        for method in METHODS:
            a = [alone[(name, b)]["figures"].get(method) if (name, b) in alone else None for b in BACKENDS]
            c = [score(combined[b][name]["summary"][method]["overall"], CORPORA[name][2]) for b in BACKENDS]
            d = [None if x is None else y - x for x, y in zip(a, c)]
            large += [(name, method, b) for b, x in zip(BACKENDS, d) if x is not None and abs(x) > 0.01]
            print(f"| {name} | {method} | {_f(a[0])} / {_f(a[1])} | {_f(c[0])} / {_f(c[1])} | {_f(d[0], '+.3f')} / "
                  f"{_f(d[1], '+.3f')} | {foreign_share(combined['memory'][name], name, method):.3f} |")
    print(f"\nmore than 0.01 from alone: {len(large)} of {len(CORPORA) * len(METHODS) * len(BACKENDS)}")
    for name in CORPORA:
        if any(c == name for c, _, _ in large):
            explain(name, [(m, b) for c, m, b in large if c == name], combined,
                    alone, ev.load_questions(prepared.home / "questions" / f"{name}.json"))
    print(f"\nreports: {prepared.home / 'report'}; peak RSS this process {peak_rss_mb():.0f} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--alone", action="append", default=[], metavar="BACKEND=REPORT.json",
                        help="a per-corpus `lexgraph bench` report.json of the alone index on that backend")
    args = parser.parse_args(argv)
    datasets, cache = Path(args.shared) / "datasets", ROOT / ".lexgraph"
    alone = alone_figures(args.alone)
    parts = {name: prepare_corpus(datasets / path, cache) for name, (path, _, _) in CORPORA.items()}
    prepared = materialise(parts, cache)
    keys = {document_key(p.relative_to(prepared.folder).as_posix()) for p in iter_corpus_files(prepared.folder)}
    for name, (_, questions, _) in CORPORA.items():  # before a long build: every evidence id names a file
        missing = {e for q in mapped_questions(name, datasets / questions, prepared.home / "questions" / f"{name}.json")
                   for e in q.evidence} - keys
        if missing:
            raise SystemExit(f"{name}: evidence ids name no file of the combined folder, e.g. {sorted(missing)[:3]}")
    print(f"combined corpus {prepared.folder}: {len(keys)} files", file=sys.stderr, flush=True)

    os.environ["LEXGRAPH_QUERY_BACKEND"] = "memory"
    settings, build = ensure_index(prepared, index_bench_corpus, progress=True)
    info = prepared.home / "combined.json"
    if not build.reused or not info.exists():
        info.write_text(json.dumps({"build_seconds": round(build.seconds, 1), "peak_rss_mb": round(peak_rss_mb()),
                                    "children_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
                                    "reused": build.reused}, indent=1))
    print(f"built {prepared.home}: {json.loads(info.read_text())}", file=sys.stderr, flush=True)
    lance_home = prepared.home / "lance"
    if not (lance_home / "index").exists():  # a copy, so the lance tables never touch the memory side
        shutil.rmtree(lance_home / "index.partial", ignore_errors=True)
        shutil.copytree(prepared.index_home, lance_home / "index.partial")
        (lance_home / "index.partial").rename(lance_home / "index")
    homes = {"memory": prepared, "lance": PreparedCorpus(prepared.source, prepared.folder, prepared.kind,
                                                         prepared.corpus_hash, lance_home)}
    combined = {backend: evaluate(homes[backend], backend, datasets) for backend in BACKENDS}

    print_table(prepared, alone, combined, build_cost(lance_home)["build_seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
