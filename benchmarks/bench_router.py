"""Router agreement on the labelled set of issue 9: LiHua-World dev (Single → semantic, Multi → graph;
Null questions have no route and are left out) plus the multi-step questions written on the sample
corpus (→ agentic).

Every question is routed by a router that never saw it:
- `shipped`: the router as it ships (exemplars: router.EXEMPLAR_FILES in sample/).
  The LiHua questions are new to it; the agentic questions are its own exemplars, so they are routed
  in 5 folds, each by a router fitted without that fold.
- `with LiHua exemplars`: 5-fold cross-validation over everything labelled (LiHua dev + sample files),
  i.e. what a deployment that adds its own labelled questions as exemplars would see.

    python -m benchmarks.bench_router [--shared ../shared]
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from lexgraph.evaluation.metrics import load_questions
from lexgraph.extract.embedder import Embedder
from lexgraph.query.router import EXEMPLAR_FILES, SAMPLE, Exemplar, Router, load_exemplars
from lexgraph.settings import Settings

FOLDS = 5
LIHUA_ROUTES = {"Single": "semantic", "Multi": "graph"}


def lihua_labelled(shared: Path) -> list[Exemplar]:
    questions = load_questions(shared / "datasets" / "lihua-world" / "questions.dev.json")
    return [Exemplar(q.question, LIHUA_ROUTES[q.qtype]) for q in questions if q.qtype in LIHUA_ROUTES]


def route_all(train: list[Exemplar], test: list[Exemplar], embed) -> list[str]:
    router = Router(train, embed)
    vectors = embed([e.question for e in test])
    return [router.route(e.question, v).route for e, v in zip(test, vectors)]


def cross_validated(labelled: list[Exemplar], fixed: list[Exemplar], embed) -> list[str]:
    """Each of `labelled` routed by a router fitted on `fixed` plus the other folds of `labelled`."""
    routed: list[str | None] = [None] * len(labelled)
    for fold in range(FOLDS):
        held = [i for i in range(len(labelled)) if i % FOLDS == fold]
        train = fixed + [e for i, e in enumerate(labelled) if i % FOLDS != fold]
        for i, route in zip(held, route_all(train, [labelled[i] for i in held], embed)):
            routed[i] = route
    return routed


def agreement(rows: list[tuple[str, Exemplar, str]]) -> dict:
    by_source: dict[str, list[bool]] = {}
    confusion = Counter()
    for source, exemplar, routed in rows:
        by_source.setdefault(source, []).append(exemplar.route == routed)
        confusion[(exemplar.route, routed)] += 1
    figures = {source: round(sum(v) / len(v), 3) for source, v in by_source.items()}
    figures["overall"] = round(sum(sum(v) for v in by_source.values()) / len(rows), 3)
    figures["n"] = {source: len(v) for source, v in by_source.items()}
    figures["confusion"] = {f"{gold}->{routed}": n for (gold, routed), n in sorted(confusion.items())}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default="../shared", help="folder holding datasets/lihua-world")
    args = parser.parse_args(argv)
    embed = Embedder.shared(backend=Settings.from_env().embed_backend).embed_queries
    lihua = lihua_labelled(Path(args.shared))
    agentic = load_exemplars([SAMPLE / "questions.agentic.json"])
    # every other shipped exemplar file (the sample corpus's semantic/graph questions, the chat-style ones)
    others = load_exemplars([SAMPLE / name for name in EXEMPLAR_FILES if name != "questions.agentic.json"])

    shipped_lihua = route_all(others + agentic, lihua, embed)
    shipped_agentic = cross_validated(agentic, others, embed)
    shipped = agreement([("lihua", e, r) for e, r in zip(lihua, shipped_lihua)]
                        + [("agentic", e, r) for e, r in zip(agentic, shipped_agentic)])
    labelled = lihua + agentic
    with_lihua = agreement([("lihua" if i < len(lihua) else "agentic", e, r)
                            for i, (e, r) in enumerate(zip(labelled, cross_validated(labelled, others, embed)))])
    print(f"labelled set: {len(lihua)} LiHua-World dev (Single→semantic, Multi→graph) + {len(agentic)} agentic")
    for name, figures in (("shipped", shipped), ("with LiHua exemplars (5-fold)", with_lihua)):
        print(f"{name:32s} overall {figures['overall']:.3f}  lihua {figures['lihua']:.3f}  "
              f"agentic {figures['agentic']:.3f}")
    print(json.dumps({"shipped": shipped, "with_lihua_exemplars": with_lihua}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
