"""The leave-one-corpus-out and k-fold harness (lexgraph.evaluation.generalize) on small made-up corpora: a
threshold is chosen only on the runs it is not measured on, so one tuned on the held-out corpus is caught."""
from dataclasses import replace

import pytest

from lexgraph.evaluation import generalize as gz
from lexgraph.evaluation.metrics import Question


def run(corpus: str, i: int, score: float, correct: bool | None, answerable: bool = True,
        asked: str = "person_or_organisation", answer: str = "Annika Vogt", confidence: float = 0.9) -> gz.QuestionRun:
    return gz.QuestionRun(corpus, f"{corpus}-{i}", "Single" if answerable else "Null", answerable, "semantic",
                          confidence, "", 1.0, 1.0, True, True, True, True, asked, asked, answer, score, correct)


def corpus(name: str, right: float, wrong: float, n: int = 20, null: int = 0) -> list[gz.QuestionRun]:
    """n answerable questions, nine in ten answered right at score `right`, the rest wrong at `wrong`;
    `null` unanswerable ones answered (wrongly) at the wrong answers' score."""
    runs = [run(name, i, right if i % 10 else wrong, bool(i % 10)) for i in range(n)]
    return runs + [run(name, n + i, wrong, None, answerable=False) for i in range(null)]


@pytest.fixture
def corpora():
    # on A, B and C right answers score 0.6 and wrong ones 0.2; on D right answers score only 0.22
    return {"A": corpus("A", 0.6, 0.2, null=5), "B": corpus("B", 0.6, 0.2), "C": corpus("C", 0.6, 0.2),
            "D": corpus("D", 0.22, 0.1)}


def test_the_held_out_corpus_never_chooses_its_own_thresholds(corpora):
    loco = gz.leave_one_corpus_out(corpora)
    others = gz.calibrate({k: v for k, v in corpora.items() if k != "D"})
    assert loco["D"]["thresholds"] == {"span_below": others.span_below, "sentence_below": others.sentence_below}
    # another held-out corpus changes the figures, never the thresholds measured on it
    changed = {**corpora, "D": corpus("D", 0.9, 0.1)}
    assert gz.leave_one_corpus_out(changed)["D"]["thresholds"] == loco["D"]["thresholds"]
    assert gz.leave_one_corpus_out(changed)["D"]["false_abstention"] != loco["D"]["false_abstention"]


def test_a_setting_tuned_on_the_held_out_corpus_is_caught(corpora):
    # chosen on D itself, D looks fine; chosen on the others (the only figure that counts), D's right answers
    # fall below the threshold: out of corpus, its false abstention shows it
    on_itself = gz.answer_figures(corpora["D"], gz.calibrate({"D": corpora["D"]}))
    out_of_corpus = gz.leave_one_corpus_out(corpora)["D"]
    assert on_itself["false_abstention"] <= gz.FALSE_ABSTENTION_BUDGET
    assert out_of_corpus["false_abstention"] > 0.5
    assert out_of_corpus["gold_in_answer"] < on_itself["gold_in_answer"]


def test_the_choice_keeps_false_abstention_within_budget_and_prefers_right_answers(corpora):
    training = {k: corpora[k] for k in "ABC"}
    chosen = gz.calibrate(training)
    for runs in training.values():
        figures = gz.answer_figures(runs, chosen)
        assert figures["false_abstention"] <= gz.FALSE_ABSTENTION_BUDGET
    # wrong answers (score 0.2) are held back while right ones (0.6) pass: every answer given is right
    assert chosen.span_below == 0.6  # ties: the highest that keeps the right answers (the budget is spent)
    assert gz.answer_figures(corpora["A"], chosen)["precision"] == 1.0
    assert gz.answer_figures(corpora["A"], chosen)["abstention_on_unanswerable"] == 1.0


def test_k_fold_chooses_each_folds_thresholds_without_it():
    runs = corpus("A", 0.6, 0.2, n=40)
    folds = gz.k_fold(runs)
    assert len(folds["thresholds_per_fold"]) == gz.FOLDS and folds["questions"] == 40
    # rewriting the questions of fold 0 cannot change the thresholds fold 0 is measured with
    rewritten = [replace(r, score=0.99) if i % gz.FOLDS == 0 else r for i, r in enumerate(runs)]
    assert gz.k_fold(rewritten)["thresholds_per_fold"][0] == folds["thresholds_per_fold"][0]


def test_a_span_question_without_a_span_always_abstains_and_sentence_answers_use_their_own_threshold():
    no_span = run("A", 0, 0.9, False, answer="")
    sentence = run("A", 1, 0.35, True, asked="sentence", answer="The hull was delivered in May.")
    assert no_span.abstains(gz.Thresholds(0.0, 0.0))
    assert not sentence.abstains(gz.Thresholds(0.9, 0.3)) and sentence.abstains(gz.Thresholds(0.0, 0.4))


def test_gold_answers_and_aliases_are_found_in_the_answer():
    question = Question("q", "Who?", "G. Stanley Hall", ("a",), "Multi", ("Stanley Hall",))
    assert gz.gold_in(question, "Stanley Hall") and gz.gold_in(question, "G. Stanley Hall, its first president")
    assert not gz.gold_in(question, "Hall")
    assert gz.gold_in(Question("n", "Who?", "Insufficient information", (), "Null"), "anything") is None


def test_confidence_buckets_report_what_each_confidence_bought():
    runs = [run("A", i, 0.6, True, confidence=0.95) for i in range(4)] + \
           [run("A", 10 + i, 0.6, False, confidence=0.55) for i in range(4)]
    buckets = gz.confidence_buckets(runs, lambda r: gz.Thresholds(0.3, 0.3))
    assert [b["questions"] for b in buckets] == [4, 4]
    assert buckets[0]["precision"] == 0.0 and buckets[1]["precision"] == 1.0


def test_always_trains_every_choice_and_is_never_measured(corpora):
    # unanswerable questions only in `always`: they pull the held-out corpora's thresholds up, and no
    # held-out row is theirs
    nulls = {"sample": [run("S", i, 0.5, None, answerable=False) for i in range(10)]
             + [run("S", 10 + i, 0.7, True) for i in range(10)]}
    without = gz.leave_one_corpus_out(corpora)
    with_nulls = gz.leave_one_corpus_out(corpora, always=nulls)
    assert set(with_nulls) == set(corpora)
    assert with_nulls["D"]["thresholds"]["span_below"] >= without["D"]["thresholds"]["span_below"]
    folds = gz.k_fold([run("A", i, 0.6, True) for i in range(20)], always=nulls)
    assert all(t["span_below"] > 0.5 for t in folds["thresholds_per_fold"])  # the nulls at 0.5 are held back


def test_the_bench_scores_saved_runs_again_and_prints_every_table(tmp_path, capsys):
    """`make bench-generalize --runs report.json`: the tables from saved runs, without indexing anything."""
    import json
    from dataclasses import asdict

    from benchmarks import bench_generalize
    from tests.conftest import ROOT

    def sample(part: str, file: str, answerable: bool):
        ids = json.loads((ROOT / "sample" / file).read_text())
        return [replace(run(f"sample-{part}", 0, 0.4, True if answerable else None, answerable), qid=qid)
                for qid in ids]

    runs = [*corpus("lihua-world", 0.6, 0.2, null=4), *corpus("musique", 0.5, 0.1),
            *sample("original", "questions.json", True), *sample("paraphrased", "questions.paraphrased.json", True),
            *sample("unanswerable", "questions.unanswerable.json", False)]
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"runs": [asdict(r) for r in runs]}))
    out = tmp_path / "out"
    assert bench_generalize.main(["--runs", str(saved), "--corpora", "lihua-world,musique", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for heading in ("Retrieval: auto against the hybrid", "leave one corpus out", "5-fold within each corpus",
                    "In-sample (dev) figures", "Router confidence", "paraphrase pairs 22: same route 1.000"):
        assert heading in printed
    report = json.loads((out / "report.json").read_text())
    assert set(report["leave_one_corpus_out"]) == {"lihua-world", "musique"} and len(report["runs"]) == len(runs)
