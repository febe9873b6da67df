"""Rendering a benchmark report: Markdown tables, ratios against the baselines, an SVG chart."""
from __future__ import annotations

from typing import Sequence


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _all_found_k(ks: Sequence[int]) -> int:
    return 5 if 5 in ks else max(ks)


def summary_table(summary: dict, ks: Sequence[int], budget: int) -> str:
    """One row per method × question type: recall@k, all-found, coverage at the budget, latency."""
    ks = [int(k) for k in ks]
    k_all = _all_found_k(ks)
    head = ["method", "type", "n", *(f"R@{k}" for k in ks), f"all@{k_all}", f"cov@{budget}", "p50 ms", "p95 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, groups in summary.items():
        for name, g in groups.items():
            recall, found = _keyed(g["recall"]), _keyed(g["all_found"])
            cells = [method, name, str(g["questions"]), *(_fmt(recall.get(k)) for k in ks), _fmt(found.get(k_all)),
                     _fmt(g["coverage"]), _fmt(g["latency_ms_p50"], 1), _fmt(g["latency_ms_p95"], 1)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def answers_table(summary: dict) -> str:
    """The answering methods' own figures (bench method `answer`), and the route mix of `auto`/`answer`."""
    lines = []
    for method, groups in summary.items():
        overall = groups["overall"]
        if "answers" in overall:
            a = overall["answers"]
            if not lines:
                lines = ["| method | answer coverage | citation precision | abstained on Null | false abstention | "
                         "routes |", "|---|---|---|---|---|---|"]
            lines.append(f"| {method} | {_fmt(a['answer_coverage'])} | {_fmt(a['citation_precision'])} | "
                         f"{_fmt(a['abstention_on_null'])} ({a['null']}) | {_fmt(a['false_abstention'])} "
                         f"({a['answerable']}) | {_routes(overall)} |")
    return "\n".join(lines)


def _routes(overall: dict) -> str:
    return ", ".join(f"{route} {n}" for route, n in overall.get("routes", {}).items()) or "–"


def _keyed(values: dict) -> dict[int, float | None]:
    """JSON turns int keys into strings; accept both."""
    return {int(k): v for k, v in values.items()}


def ratio_table(summary: dict, k: int) -> str:
    """Recall@k of every method as a ratio to the dense and BM25 baselines, per question type."""
    baselines = [b for b in ("dense", "bm25") if b in summary]
    if not baselines:
        return ""
    types = [t for t in next(iter(summary.values())) if t != "Null"]
    head = ["method", *(f"{t} vs {b}" for t in types for b in baselines)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, groups in summary.items():
        cells = [method]
        for t in types:
            for b in baselines:
                mine, base = _keyed(groups[t]["recall"]).get(k), _keyed(summary[b][t]["recall"]).get(k)
                cells.append("–" if mine is None or not base else f"{mine / base:.2f}×")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recall_bars_markdown(summary: dict, ks: Sequence[int], width: int = 30) -> str:
    """Recall@k per method over the questions with evidence, as a Markdown bar chart."""
    lines = ["| method | k | recall | |", "|---|---|---|---|"]
    for method, groups in summary.items():
        recall = _keyed(groups["overall"]["recall"])
        for k in ks:
            value = recall.get(int(k)) or 0.0
            lines.append(f"| {method} | {k} | {value:.3f} | {'█' * round(width * value)} |")
    return "\n".join(lines)


def recall_svg(summary: dict, ks: Sequence[int]) -> str:
    """A dependency-free SVG bar chart of overall recall@k per method (grouped by k)."""
    methods = list(summary)
    colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"]
    bar, gap, height, left, top = 16, 18, 200, 40, 20
    group_width = len(methods) * bar + gap
    width = left + len(ks) * group_width + 150
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="14">evidence recall@k (questions with evidence)</text>']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + height * (1 - tick)
        parts.append(f'<line x1="{left}" x2="{left + len(ks) * group_width}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                     f'<text x="4" y="{y + 4}">{tick:.2f}</text>')
    for gi, k in enumerate(ks):
        x0 = left + gi * group_width + gap / 2
        for mi, method in enumerate(methods):
            value = _keyed(summary[method]["overall"]["recall"]).get(int(k)) or 0.0
            h = height * value
            parts.append(f'<rect x="{x0 + mi * bar}" y="{top + height - h}" width="{bar - 2}" height="{h}" '
                         f'fill="{colours[mi % len(colours)]}"><title>{method} R@{k} = {value:.3f}</title></rect>')
        parts.append(f'<text x="{x0}" y="{top + height + 16}">k={k}</text>')
    for mi, method in enumerate(methods):
        y = top + 14 * mi
        x = left + len(ks) * group_width + 10
        parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colours[mi % len(colours)]}"/>'
                     f'<text x="{x + 14}" y="{y + 9}">{method}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def report_markdown(data: dict) -> str:
    """The whole report: what was run on what, the table, baseline ratios, index size and cost."""
    s, ks = data["settings"], data["settings"]["ks"]
    k_ratio = 5 if 5 in ks else max(ks)
    corpus, questions, index = data["corpus"], data["questions"], data["index"]
    cost = index["cost"]
    lines = [
        "# Retrieval benchmark", "",
        f"- date: {data['date']}",
        f"- corpus: `{corpus.get('path', corpus.get('index_dir'))}` ({corpus.get('kind', 'index')}, "
        f"sha256 {str(corpus.get('sha256', '–'))[:12]}), {index['documents']} documents, {index['chunks']} chunks",
        f"- questions: `{questions['path']}`: {questions['count']} "
        f"({', '.join(f'{t} {n}' for t, n in questions['by_type'].items())})",
        f"- settings: index {s['index_version']}, {s['embed_model']}, chunks ≤ {s['chunk_tokens']} word pieces, "
        f"context budget {s['budget_tokens']} word pieces, top {s['top_n_chunks']} chunks per query",
        f"- machine: {data['machine']['cpus']} CPUs, Python {data['machine']['python']}",
        "", data["table_markdown"], "",
        "R@k: mean share of a question's evidence documents among the top-k distinct documents; "
        f"all@{_all_found_k(ks)}: share of questions with every evidence document there; cov: normalised gold "
        "answer found in the context cut at the budget (Null questions excluded); latency per query including "
        "the query embedding.", "",
        f"## Recall@{k_ratio} relative to the baselines", "", ratio_table(data["summary"], k_ratio), "",
        "## Null questions", "",
        "No answerer runs here (no LLM), so there is no abstention rate. Mean score of the top hit, "
        "answerable vs Null questions (a threshold can only abstain if these differ):", "",
        "| method | top score, answerable | top score, Null |", "|---|---|---|",
        *(f"| {m} | {_fmt(g['overall']['top_score_answerable'])} | {_fmt(g['overall']['top_score_null'])} |"
          for m, g in data["summary"].items()), "",
        "## Index", "",
        "| part | size |", "|---|---|",
        *(f"| {part} | {_mb(size)} |" for part, size in index["size_bytes"].items()), "",
        f"Cost: {cost.get('embedding_tokens', '–')} embedding tokens at build (chunks and keyword sentences; "
        f"chunk tokens alone {cost.get('chunk_embedding_tokens', '–')}), build wall time "
        f"{cost.get('build_seconds', '–')} s, LLM calls {cost['llm_calls']} ({cost.get('llm_cache_hits', 0)} cache "
        f"hits), LLM tokens {cost.get('llm_prompt_tokens', 0)} prompt + {cost.get('llm_completion_tokens', 0)} "
        f"completion (from the cost ledger). "
        f"Query embedding tokens this run: {data['query_embedding_tokens']}.",
    ]
    if questions["unmatched_evidence_ids"]:
        missing = questions["unmatched_evidence_ids"]
        lines += ["", f"Warning: {len(missing)} evidence id(s) name no indexed document: {', '.join(missing[:10])}"]
    return "\n".join(lines) + "\n"
