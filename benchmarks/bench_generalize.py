"""`make bench-generalize`: the routed and answered question measured where it was not tuned (issue 39).

Four development corpora of three kinds (LiHua-World's chat logs, the MuSiQue Wikipedia file, HippoRAG's
MuSiQue and HotpotQA passages, one file each), each indexed once through the product's Dagster ingest and
cached under .lexgraph/bench/. Every question runs once through the engine (lexgraph.evaluation.question_runs);
then lexgraph.evaluation.generalize chooses the reader's abstention thresholds leave-one-corpus-out and
5-fold within each corpus, and measures them where they were not chosen. The sample corpus's questions,
their paraphrases and its unanswerable questions are answered with thresholds chosen on the four.

    python -m benchmarks.bench_generalize [--shared ../shared] [--out DIR] [--corpora a,b]

Prints the tables (Markdown) and writes report.json with every question's run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lexgraph.evaluation import generalize as gz
from lexgraph.evaluation import metrics as ev
from lexgraph.evaluation.bench import ensure_index
from lexgraph.evaluation.corpus import prepare_corpus
from lexgraph.evaluation.question_runs import run_questions
from lexgraph.settings import Settings
from orchestration.cli import index_bench_corpus

ROOT = Path(__file__).resolve().parents[1]
# name: (corpus path under shared/datasets, questions file, context budget in tokens)
CORPORA = {
    "lihua-world": ("lihua-world/LiHuaWorld.zip", "lihua-world/questions.dev.json", 1024),
    "musique": ("musique/corpus/document.txt", "musique/questions.dev.json", 12000),
    "musique-passages": ("musique-hipporag/corpus", "musique-hipporag/questions.dev.json", 1024),
    "hotpotqa-passages": ("hotpotqa-hipporag/corpus", "hotpotqa-hipporag/questions.dev.json", 1024),
}
SAMPLE_BUDGET = 1024


def indexed(corpus: Path, cache: Path) -> Settings:
    prepared = prepare_corpus(corpus, cache)
    settings, build = ensure_index(prepared, index_bench_corpus, progress=True)
    if not build.reused:
        print(f"  indexed {corpus}: {build.new} new, {build.changed} changed in {build.seconds:.0f} s", file=sys.stderr)
    return settings


def _f(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def retrieval_table(figures: dict[str, dict]) -> str:
    rows = ["| corpus | questions | hybrid r@5 | auto r@5 | auto − hybrid | hybrid all@5 | auto all@5 | "
            "hybrid coverage | auto coverage | routes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in figures.items():
        delta = None if f["auto_recall@5"] is None else f["auto_recall@5"] - f["hybrid_recall@5"]
        routes = ", ".join(f"{r} {n}" for r, n in f["routes"].items())
        rows.append(f"| {name} | {f['questions']} | {_f(f['hybrid_recall@5'])} | {_f(f['auto_recall@5'])} | "
                    f"{'–' if delta is None else f'{delta:+.3f}'} | {_f(f['hybrid_all@5'])} | {_f(f['auto_all@5'])} | "
                    f"{_f(f['hybrid_coverage'])} | {_f(f['auto_coverage'])} | {routes} |")
    return "\n".join(rows)


def answers_table(figures: dict[str, dict], with_thresholds: bool = True) -> str:
    head = "| corpus | thresholds (span / sentence) | answerable | gold in answer | false abstention | " \
           "unanswerable | abstained on them | precision of answers |"
    rows = [head, "|---|---|---|---|---|---|---|---|"]
    for name, f in figures.items():
        if "thresholds" in f:
            t = f"{f['thresholds']['span_below']:.2f} / {f['thresholds']['sentence_below']:.2f}"
        else:
            t = "per fold: " + ", ".join(f"{x['span_below']:.2f}/{x['sentence_below']:.2f}"
                                         for x in f.get("thresholds_per_fold", []))
        rows.append(f"| {name} | {t} | {f['answerable']} | {_f(f['gold_in_answer'])} | {_f(f['false_abstention'])} | "
                    f"{f['unanswerable']} | {_f(f['abstention_on_unanswerable'])} | {_f(f['precision'])} |")
    return "\n".join(rows)


def buckets_table(buckets: list[dict]) -> str:
    rows = ["| router confidence | questions | routes | auto r@5 | hybrid r@5 | gold in answer | precision |",
            "|---|---|---|---|---|---|---|"]
    for b in buckets:
        routes = ", ".join(f"{r} {n}" for r, n in b["routes"].items())
        rows.append(f"| {b['confidence']} | {b['questions']} | {routes} | {_f(b['auto_recall@5'])} | "
                    f"{_f(b['hybrid_recall@5'])} | {_f(b['gold_in_answer'])} | {_f(b['precision'])} |")
    return "\n".join(rows)


def paraphrase_figures(originals: list[gz.QuestionRun], paraphrased: list[gz.QuestionRun],
                       pairs: dict[str, str], thresholds: gz.Thresholds) -> dict:
    """Route and answer agreement between each original and its paraphrase, and the paraphrases' answers."""
    by_question = {r.qid: r for r in originals}
    same_route, same_answer = [], []
    for run in paraphrased:
        original = by_question[pairs[run.qid]]
        same_route.append(run.route == original.route)
        a, b = run.abstains(thresholds), original.abstains(thresholds)
        same_answer.append(a == b and (a or ev.normalise_answer(run.answer) == ev.normalise_answer(original.answer)))
    return {"pairs": len(paraphrased), "same_route": ev.mean(same_route), "same_answer": ev.mean(same_answer),
            "paraphrase": gz.answer_figures(paraphrased, thresholds), "original": gz.answer_figures(originals, thresholds)}


def sample_runs(cache: Path) -> dict[str, list[gz.QuestionRun]]:
    """The sample corpus's own questions, their paraphrases and its unanswerable questions, run once."""
    settings = indexed(ROOT / "sample" / "corpus", cache)
    return {part: run_questions(f"sample-{part}", settings, ev.load_questions(ROOT / "sample" / file), SAMPLE_BUDGET)
            for part, file in (("original", "questions.json"), ("paraphrased", "questions.paraphrased.json"),
                               ("unanswerable", "questions.unanswerable.json"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--out", default=str(ROOT / ".lexgraph" / "bench" / "generalize"))
    parser.add_argument("--corpora", default=",".join(CORPORA), help="a comma-separated subset of "
                        + ", ".join(CORPORA))
    parser.add_argument("--runs", help="a report.json of an earlier run: its question runs are scored again "
                        "(calibration only, nothing is indexed or asked)")
    args = parser.parse_args(argv)
    datasets, cache = Path(args.shared) / "datasets", ROOT / ".lexgraph"
    chosen = [c.strip() for c in args.corpora.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CORPORA]
    if unknown:
        parser.error(f"unknown corpora {', '.join(unknown)}; expected some of {', '.join(CORPORA)}")
    started = time.perf_counter()
    runs: dict[str, list[gz.QuestionRun]] = {}
    if args.runs:
        saved = [gz.QuestionRun(**r) for r in json.loads(Path(args.runs).read_text())["runs"]]
        runs = {name: [r for r in saved if r.corpus == name] for name in chosen}
        sample = {part: [r for r in saved if r.corpus == f"sample-{part}"]
                  for part in ("original", "paraphrased", "unanswerable")}
    for name in ([] if args.runs else chosen):
        corpus, questions, budget = CORPORA[name]
        settings = indexed(datasets / corpus, cache)
        print(f"{name}: running {questions}", file=sys.stderr, flush=True)
        runs[name] = run_questions(name, settings, ev.load_questions(datasets / questions), budget, progress=True)

    if not args.runs:
        sample = sample_runs(cache)
    pairs = {qid: next(q.qid for q in ev.load_questions(ROOT / "sample" / "questions.json")
                       if q.question == record["original"])
             for qid, record in json.loads((ROOT / "sample" / "questions.paraphrased.json").read_text()).items()}

    # the sample's own questions and its unanswerable ones train every choice (only LiHua-World among the four
    # has unanswerable questions) and are measured only under thresholds chosen on the four
    always = {"sample": sample["original"] + sample["unanswerable"]}
    retrieval = {name: gz.retrieval_figures(r) for name, r in runs.items()}
    loco = gz.leave_one_corpus_out(runs, always=always) if len(runs) > 1 else {}
    folds = {name: gz.k_fold(r, always=always) for name, r in runs.items()}
    shipped = gz.calibrate({**runs, **always})
    on_four = gz.calibrate(runs)
    in_sample = {name: {"thresholds": asdict(shipped), **gz.answer_figures(r, shipped)} for name, r in runs.items()}
    per_corpus = {name: gz.Thresholds(**f["thresholds"]) for name, f in loco.items()}
    buckets = gz.confidence_buckets([r for rs in runs.values() for r in rs],
                                    lambda r: per_corpus.get(r.corpus, shipped))
    paraphrases = paraphrase_figures(sample["original"], sample["paraphrased"], pairs, on_four)
    sample_null = gz.answer_figures(sample["unanswerable"], on_four)

    report = {
        "corpora": {name: {"path": CORPORA[name][0], "questions": CORPORA[name][1], "budget": CORPORA[name][2]}
                    for name in runs},
        "retrieval": retrieval, "leave_one_corpus_out": loco, "five_fold": folds,
        "in_sample_dev_figures": in_sample, "shipped_thresholds": asdict(shipped),
        "thresholds_on_the_four": asdict(on_four), "confidence_buckets": buckets,
        "sample": {"paraphrases": paraphrases, "unanswerable": sample_null},
        "seconds": round(time.perf_counter() - started, 1),
        "runs": [asdict(r) for rs in [*runs.values(), *sample.values()] for r in rs],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))

    print("## Retrieval: auto against the hybrid ranking (no tuned setting; recall@5 at document level)\n")
    print(retrieval_table(retrieval))
    if loco:
        print("\n## Answers, leave one corpus out (thresholds chosen on the other corpora and the sample's questions)\n")
        print(answers_table(loco))
        for name, lower in (("gold_in_answer", True), ("false_abstention", False)):
            found = gz.worst({k: v for k, v in loco.items() if v["answerable"]}, name, lower)
            if found:
                print(f"\nworst {name.replace('_', ' ')} out of corpus: {found[1]:.3f} ({found[0]})")
    print("\n## Answers, 5-fold within each corpus (thresholds chosen on the other folds and the sample's questions)\n")
    print(answers_table(folds))
    print(f"\n## In-sample (dev) figures: the shipped thresholds ({shipped.span_below:.2f} / {shipped.sentence_below:.2f}), "
          "chosen on all four corpora and the sample, measured on the four. Not a result.\n")
    print(answers_table(in_sample))
    print("\n## Router confidence (each corpus under its leave-one-out thresholds)\n")
    print(buckets_table(buckets))
    print(f"\n## Sample corpus: paraphrases and unanswerable questions (thresholds chosen on the four: "
          f"{on_four.span_below:.2f} / {on_four.sentence_below:.2f})\n")
    p = paraphrases
    print(f"paraphrase pairs {p['pairs']}: same route {_f(p['same_route'])}, same answer {_f(p['same_answer'])}; "
          f"gold in answer: originals {_f(p['original']['gold_in_answer'])}, paraphrases "
          f"{_f(p['paraphrase']['gold_in_answer'])}; false abstention: originals "
          f"{_f(p['original']['false_abstention'])}, paraphrases {_f(p['paraphrase']['false_abstention'])}")
    print(f"unanswerable ({sample_null['unanswerable']}): abstained on {_f(sample_null['abstention_on_unanswerable'])}")
    print(f"\nreport: {out / 'report.json'} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
