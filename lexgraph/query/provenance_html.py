"""The provenance of one answer as a single self-contained HTML page: the question, the answer and its
flags, the router's log line, the index it was answered from, and every citation's span highlighted
(``<mark>``) in the stored normalised source text around it, with the source version (sha256), the
extractor, model and prompt version of the cited statement.

A pure function of the provenance dict (``QueryService.provenance``): no I/O, no external resources,
no script, so the page opens offline and an audit bundle can write it as it is. Every value is escaped."""
from __future__ import annotations

import json
from html import escape
from typing import Any, Mapping

# The page loads nothing and runs nothing: inline styles only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
_CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:60rem;
padding:0 1rem;color:#1d1d1f;background:#fff}
h1{font-size:1.35rem;margin:0 0 .25rem}h2{font-size:1.1rem;margin:2rem 0 .5rem;border-bottom:1px solid #ddd}
h3{font-size:1rem;margin:0 0 .4rem}
.question{font-size:1.15rem;font-weight:600}
.answer{font-size:1.1rem;padding:.75rem 1rem;background:#f4f7fb;border-left:4px solid #3a6ea5;margin:.5rem 0}
.flags span{display:inline-block;margin:0 .4rem .3rem 0;padding:.1rem .5rem;border-radius:.8rem;
font-size:.85rem;background:#eee}
.flags .on{background:#ffe2b3}.flags .abstained.on{background:#f8c9c9}
table{border-collapse:collapse;font-size:.9rem;margin:.3rem 0}
th,td{text-align:left;vertical-align:top;padding:.15rem .8rem .15rem 0}th{color:#555;font-weight:500}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85rem}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
.citation{border:1px solid #ddd;border-radius:6px;padding:.75rem 1rem;margin:1rem 0}
.source{white-space:pre-wrap;background:#fafafa;border:1px solid #eee;padding:.6rem;font-size:.9rem}
.context{color:#666}mark{background:#fff176;padding:0 .1rem}
.muted{color:#777}
"""


class _Html(str):
    """Markup made here from escaped parts: inserted as it is."""


def _text(value: Any) -> str:
    """A value as escaped text; absent values as an em dash."""
    if isinstance(value, _Html):
        return str(value)
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return escape(f"{value:.3f}")
    if isinstance(value, (dict, list)):
        return escape(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))
    return escape(str(value))


def _rows(pairs: list[tuple[str, Any]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(name)}</th><td>{_text(value)}</td></tr>"
                               for name, value in pairs) + "</table>"


def _span(citation: Mapping[str, Any]) -> _Html:
    start, end = citation.get("char_start"), citation.get("char_end")
    if start is None and end is None:
        return _Html("—")
    return _Html(f"{_text(start)}–{_text(end)}")


def _citation(number: int, citation: Mapping[str, Any]) -> str:
    page = citation.get("page")
    heading = f"[{_text(citation.get('id'))}] {_text(citation.get('source'))}"
    if page is not None:
        heading += f" p. {_text(page)}"
    before = str(citation.get("context_before") or "")
    after = str(citation.get("context_after") or "")
    source_text = (f'<div class="source"><span class="context">{escape(before)}</span>'
                   f'<mark>{escape(str(citation.get("text") or ""))}</mark>'
                   f'<span class="context">{escape(after)}</span></div>')
    details = _rows([
        ("source", citation.get("source")),
        ("page", page),
        ("characters", _span(citation)),
        ("source sha256", citation.get("source_sha256")),
        ("document id", citation.get("doc_id")),
        ("chunk id", citation.get("chunk_id")),
        ("statement id", citation.get("statement_id")),
        ("statement", citation.get("statement")),
        ("extractor", citation.get("extractor")),
        ("model", citation.get("model")),
        ("prompt version", citation.get("prompt_version")),
        ("extracted at", citation.get("extracted_at")),
    ])
    return (f'<section class="citation" id="citation-{number}"><h3>{number}. {heading}</h3>'
            f"{source_text}{details}</section>")


def render_provenance_html(provenance: Mapping[str, Any]) -> str:
    """One HTML page for one answer's provenance (the dict of ``QueryService.provenance``)."""
    index = provenance.get("index") or {}
    citations = provenance.get("citations") or []
    abstained, uncertain = bool(provenance.get("abstained")), bool(provenance.get("uncertain"))
    answer = provenance.get("answer")
    flags = (f'<p class="flags"><span class="abstained{" on" if abstained else ""}">abstained: '
             f'{_text(abstained)}</span><span class="uncertain{" on" if uncertain else ""}">uncertain: '
             f'{_text(uncertain)}</span><span>route: {_text(provenance.get("route"))}</span>'
             f'<span>confidence: {_text(provenance.get("confidence"))}</span></p>')
    log = provenance.get("log")
    log_text = json.dumps(log, ensure_ascii=False, indent=2, sort_keys=True, default=str) if log else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>lexgraph provenance {_text(provenance.get('query_id'))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Answer provenance</h1><p class=\"muted\">query <code>{_text(provenance.get('query_id'))}</code>"
        f" · asked {_text(provenance.get('asked_at'))}</p>",
        "<h2>Question</h2>",
        f'<p class="question">{_text(provenance.get("question"))}</p>',
        "<h2>Answer</h2>",
        f'<div class="answer">{_text(answer) if answer else "<em>no answer</em>"}</div>',
        flags,
        "<h2>Index</h2>",
        _rows([("index version", index.get("index_version")),
               ("lexgraph version", index.get("lexgraph_version")),
               ("catalog digest", index.get("catalog_digest"))]),
        f"<h2>Citations ({len(citations)})</h2>",
        "".join(_citation(n, c) for n, c in enumerate(citations, 1)) if citations
        else '<p class="muted">No citations.</p>',
        "<h2>Router log</h2>",
        f"<pre>{escape(log_text)}</pre>" if log_text else '<p class="muted">No log line.</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
