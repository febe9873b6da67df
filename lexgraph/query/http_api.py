"""`lexgraph serve`: the query service over HTTP (FastAPI under uvicorn).

    POST /ask                    {"question": str, "route"?: "auto"|"semantic"|"graph"|"agentic"} -> the answer JSON
    GET  /provenance/{query_id}  the provenance as JSON, or as one HTML page when Accept prefers text/html
    GET  /health                 {"status": "ok", "documents", "chunks", "index_version", "lexgraph_version", "llm"}

Bad bodies and bad questions give 422, unknown query ids 404, an empty index 503. When a token is
configured, every endpoint but /health needs ``Authorization: Bearer <token>`` (else 401); the server
refuses to listen on a non-loopback address without one. The service is synchronous and CPU-bound,
so the endpoints are plain functions, which FastAPI runs in its thread pool."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, field_validator

from lexgraph.settings import Settings

ROUTES = ("auto", "semantic", "graph", "agentic")
# The server's variables are read by lexgraph.settings: Settings.serve_token and Settings.serve_torch_threads (torch
# intra-op threads per request, 1 by default: lexgraph.defaults says why). The token's, for messages:
TOKEN_ENV = Settings.ENV["serve_token"]
# Larger request bodies are refused (413) before they are read whole; the service's own question
# length limit is far below this, so an over-long question still gets its 422.
MAX_BODY_BYTES = 1 << 20
OPEN_PATHS = frozenset({"/health"})


class AskBody(BaseModel):
    """The body of POST /ask: a question and, optionally, the route (default auto). Nothing else."""

    model_config = ConfigDict(extra="forbid", strict=True)
    question: str
    route: Literal["auto", "semantic", "graph", "agentic"] = "auto"

    @field_validator("question")
    @classmethod
    def _encodable(cls, question: str) -> str:
        # JSON may carry a lone surrogate (\ud800), which no UTF-8 response could echo back
        try:
            question.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("the question is not valid Unicode (it holds a lone surrogate)") from None
        return question


class ServeError(ValueError):
    """A server that must not start as asked (a non-loopback host without a token): CLI exit code 2."""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also as [::1] or ::ffff:127.x.y.z) and `localhost`; every other host is not."""
    host = host.strip().strip("[]")
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than localhost may resolve anywhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def resolve_token(token: str | None, settings: Settings) -> str | None:
    """The token given, else the settings' ($LEXGRAPH_SERVE_TOKEN); blank means none."""
    token = token if token is not None and token.strip() else settings.serve_token
    return token.strip() or None


def check_bind(host: str, token: str | None) -> None:
    if not host.strip():
        raise ServeError("the host is empty; give an address to listen on, e.g. --host 127.0.0.1")
    if token is None and not is_loopback(host):
        raise ServeError(f"refusing to serve on {host!r} without a token: a host other than loopback "
                         f"(127.0.0.0/8, ::1, localhost) needs --token T or ${TOKEN_ENV}")


def _digest(value: str | bytes) -> bytes:
    return hashlib.sha256(value.encode("utf-8") if isinstance(value, str) else value).digest()


def prefers_html(accept: str | None) -> bool:
    """Whether an Accept header ranks text/html above application/json (a tie goes to the one named
    explicitly, then to JSON): browsers get the page, scripts and `*/*` get JSON."""
    if not accept:
        return False
    ranges = []
    for position, part in enumerate(accept.split(",")):
        media, *params = [p.strip() for p in part.split(";")]
        if not media:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = max(0.0, min(1.0, float(value)))
                except ValueError:
                    q = 0.0
        ranges.append((media.lower(), q, position))

    def rank(kind: str, subtype: str) -> tuple[float, int]:
        """(q, specificity) of the most specific range that matches; (0, -1) when none does."""
        best = (0.0, -1)
        for media, q, _ in ranges:
            mtype, _, msub = media.partition("/")
            if media == f"{kind}/{subtype}":
                specificity = 2
            elif mtype == kind and msub == "*":
                specificity = 1
            elif media == "*/*":
                specificity = 0
            else:
                continue
            if specificity > best[1]:
                best = (q, specificity)
        return best

    html, json_ = rank("text", "html"), rank("application", "json")
    if html[0] <= 0:
        return False
    return html[0] > json_[0] or (html[0] == json_[0] and html[1] > json_[1])


class _Guard:
    """Pure ASGI middleware in front of every route: the bearer token and the body size limit.
    Both are checked before any body is parsed, so an unauthenticated request never reaches validation."""

    def __init__(self, app, token: str | None, max_body: int):
        self.app, self.max_body = app, max_body
        self.token_digest = _digest(token) if token is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.token_digest is not None and scope.get("path") not in OPEN_PATHS:
            scheme, _, credentials = headers.get(b"authorization", b"").strip().partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(_digest(credentials.strip()),
                                                                      self.token_digest)
            if not ok:
                return await _reply(send, 401, {"detail": "a bearer token is required (Authorization: Bearer <token>)"},
                                    [(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, {"detail": f"the request body is over {self.max_body} bytes"})
        state = {"received": 0, "refused": False, "started": False}

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_body and not state["refused"]:
                    state["refused"] = True  # a chunked body that outgrew the limit
                    if not state["started"]:
                        await _reply(send, 413, {"detail": f"the request body is over {self.max_body} bytes"})
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if state["refused"]:
                return  # the 413 was sent; whatever the app says after the disconnect is dropped
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not state["refused"]:
                raise


async def _reply(send, status: int, body: dict, headers: list | None = None) -> None:
    import json

    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": payload})


def create_app(service, token: str | None = None, max_body: int = MAX_BODY_BYTES):
    """The FastAPI app over a QueryService (anything with ask / provenance / health). token: the
    bearer token every endpoint but /health requires; None requires none."""
    from lexgraph.query.retrieval import EmptyIndexError
    from lexgraph.query.provenance_html import CSP, render_provenance_html
    from lexgraph.query.service import QueryError, UnknownQueryError

    from lexgraph import __version__

    app = FastAPI(title="lexgraph", version=__version__,
                  description="Answers with citations over a lexgraph index, and their provenance.")
    token = (token.strip() or None) if token is not None else None
    app.add_middleware(_Guard, token=token, max_body=max_body)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, error: RequestValidationError):
        # where and what, never the input itself: it may be 100 kB, or not encodable as UTF-8
        return JSONResponse({"detail": [{"loc": [p if isinstance(p, int) else _printable(p) for p in e.get("loc", ())],
                                         "msg": _printable(e.get("msg", "")), "type": _printable(e.get("type", ""))}
                                        for e in error.errors()]}, status_code=422)

    @app.exception_handler(QueryError)
    def _query_error(request: Request, error: QueryError):
        return JSONResponse({"detail": str(error)}, status_code=422)

    @app.exception_handler(UnknownQueryError)
    def _unknown(request: Request, error: UnknownQueryError):
        return JSONResponse({"detail": _message(error, "unknown query id")}, status_code=404)

    @app.exception_handler(EmptyIndexError)
    def _empty(request: Request, error: EmptyIndexError):
        return JSONResponse({"detail": f"{_message(error, 'the index is empty')}; run `lexgraph ingest PATH` "
                                       "with the same LEXGRAPH_* settings first"}, status_code=503)

    @app.post("/ask")
    def ask(body: AskBody):
        return JSONResponse(service.ask(body.question, route=body.route))

    @app.get("/provenance/{query_id}")
    def provenance(query_id: str, request: Request):
        record = service.provenance(query_id)
        if prefers_html(request.headers.get("accept")):
            return HTMLResponse(render_provenance_html(record), headers={"Content-Security-Policy": CSP, "Vary": "Accept"})
        return JSONResponse(record, headers={"Vary": "Accept"})

    @app.get("/health")
    def health():
        return JSONResponse(service.health())

    return app


def _printable(value) -> str:
    """Text that survives UTF-8: lone surrogates become backslash escapes; over-long text is cut."""
    text = str(value).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 200 else text[:200] + "…"


def _message(error: Exception, default: str) -> str:
    # KeyError-style errors repr their argument; show the plain message
    return str(error.args[0]) if error.args and isinstance(error.args[0], str) else (str(error) or default)


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          log_level: str = "info") -> None:
    """Run the API under uvicorn until interrupted. Raises ServeError, before anything is loaded, for a
    non-loopback host without a token (given or the settings', from $LEXGRAPH_SERVE_TOKEN)."""
    token = resolve_token(token, settings)
    check_bind(host, token)
    if not 0 <= port <= 65535:
        raise ServeError(f"the port must be from 0 to 65535, got {port}")
    threads = settings.serve_torch_threads
    from lexgraph.extract.embedder import TORCH

    if settings.embed_backend == TORCH:  # the onnx backends never load torch: importing it costs seconds
        import torch

        torch.set_num_threads(threads)  # process-wide: the request threads use it too

    from lexgraph.query.service import QueryService

    service = QueryService(settings)
    service.warm()  # the index and the model load while uvicorn starts; the first question waits for them
    import uvicorn

    app = create_app(service, token)
    config = uvicorn.Config(app, host=host.strip().strip("[]"), port=port, log_level=log_level,
                            proxy_headers=False, server_header=False, lifespan="off")
    uvicorn.Server(config).run()
