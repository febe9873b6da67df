"""The audit bundle of one answer: one self-contained file an auditor can archive, with the same content
as ``GET /provenance/{query_id}`` (the kept provenance record of ``QueryService.provenance``).

    write_audit_bundle(Settings.from_env(), "q20261130163012-1a2b3c4d5e", Path("audit.html"))

``.html`` is the page of ``render_provenance_html`` (the question, the answer, the route and its router
log line, every citation's span in ``<mark>`` inside the stored source text around it, the source sha256,
the extractor, model and prompt version of the cited statement, the index and lexgraph versions); it loads
nothing and runs no script, so it opens offline. ``.json`` is the provenance JSON, exactly as the HTTP
endpoint returns it. Without an output path the bundle goes to ``<home>/queries/audit/<query_id>.html``.

Reads only the query log of the index home: it needs neither the loaded index nor a running Dagster."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Union

from lexgraph.query.provenance_html import render_provenance_html
from lexgraph.query.service import QueryLog, UnknownQueryError
from lexgraph.settings import Settings

__all__ = ["AuditError", "SUFFIXES", "UnknownQueryError", "audit_record", "default_bundle_path",
           "render_audit_bundle", "write_audit_bundle"]

SUFFIXES = (".html", ".json")
AUDIT_FOLDER = Path("queries") / "audit"


class AuditError(ValueError):
    """An output path the bundle cannot be written to (an unknown suffix, a folder); the message says why."""


class _HasProvenance(Protocol):
    def provenance(self, query_id: str) -> dict: ...


Source = Union[Settings, _HasProvenance]


def audit_record(source: Source, query_id: str) -> dict:
    """The provenance record of one answer, from a QueryService (or anything with ``provenance``) or from
    the query log of the settings' index home. Raises UnknownQueryError for an id that was never asked."""
    if isinstance(source, Settings):
        return QueryLog(Path(source.home) / "queries").read(query_id)
    return source.provenance(query_id)


def default_bundle_path(settings: Settings, query_id: str, suffix: str = ".html") -> Path:
    """``<home>/queries/audit/<query_id>.html`` (or ``.json``)."""
    return Path(settings.home) / AUDIT_FOLDER / f"{query_id}{suffix}"


def bundle_format(out: Path) -> str:
    """"html" or "json" from the output's suffix; AuditError for any other."""
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise AuditError(f"{out}: the audit bundle is written as .html or .json, not "
                         f"{suffix or 'a file without a suffix'}")
    return suffix[1:]


def render_audit_bundle(record: dict, fmt: str) -> str:
    """The bundle's text: the provenance page, or the provenance JSON as the HTTP endpoint returns it."""
    if fmt == "json":
        return json.dumps(record, ensure_ascii=False, indent=2, default=str) + "\n"
    return render_provenance_html(record)


def write_audit_bundle(source: Source, query_id: str, out: Path | str | None = None) -> Path:
    """Write the audit bundle of ``query_id`` to ``out`` (.html or .json) and return the path written.

    source: Settings (the query log of its index home is read) or a QueryService. out: None writes
    ``<home>/queries/audit/<query_id>.html`` (needs Settings, or a service with ``.settings``).
    Raises AuditError for a bad output path and UnknownQueryError for an unknown id, in both cases
    before anything is written. The file is replaced atomically, so an archive never holds half a bundle."""
    if out is None:
        settings = source if isinstance(source, Settings) else getattr(source, "settings", None)
        if settings is None:
            raise AuditError("no output path given and no index home to put the bundle in")
        out = default_bundle_path(settings, query_id)
    out = Path(out)
    fmt = bundle_format(out)
    if out.is_dir():
        raise AuditError(f"{out}: is a folder; name the file to write, e.g. {out / (query_id + '.' + fmt)}")
    text = render_audit_bundle(audit_record(source, query_id), fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(out)
    return out
