r"""A real OpenAI-compatible chat-completions server on 127.0.0.1 for tests and benchmarks.

It answers ``POST /v1/chat/completions`` with a deterministic, schema-valid ``ChunkExtraction``
derived from the chunk in the request (the text between ``<chunk>`` and ``</chunk>`` in the first
user message that has one, else the whole last user message):

- one topic (the ``Section:`` heading when there is one, else "general"), whose statements are the
  chunk's sentences;
- entities: runs of capitalised words (placeholders such as ``[EMAIL]`` excluded), typed
  deterministically from the entity types the request's JSON schema allows;
- per sentence with two or more entities: a fact (first entity, the words between, second entity)
  and relations between consecutive entities (strength 0.5);
- ``usage``: prompt_tokens = words in all messages, completion_tokens = words in the answer (``\w+`` runs:
  tiktoken is not installed here, and a word count is deterministic and model-free).

Replay mode (``LLMTestServer(replay=RecordedExtractions.load(path))``, ``--replay PATH``): extraction requests
are answered from a recorded LLM's output instead, HippoRAG's GPT-3.5 triples for the MuSiQue passages: the
recorded passages found in the chunk, mapped onto ``ChunkExtraction`` as tests/recorded_llm.py describes; a
chunk with no recorded passage gets the empty extraction. Usage is counted the same way. Answers and
sub-questions keep the rules below.

Both instructor modes are understood: a request with ``tools`` (Mode.TOOLS) gets a forced tool call
whose ``arguments`` are the JSON; any other request (Mode.JSON, the extractor's default) gets the
JSON as ``message.content``. ``GET /v1/models`` lists the one model.

Faults, on demand (kinds: ``"429"`` with Retry-After, any other status such as ``"500"``/``"503"``,
``"timeout"`` (the handler sleeps ``seconds`` before answering, longer than the client timeout),
``"malformed"`` (the answer is not JSON), ``"invalid"`` (JSON that fails the schema), ``"garbage"``
(the HTTP body itself is not JSON), ``"disconnect"`` (the connection is closed without an answer)):

- ``server.fail_next(kind, times=1, retry_after=None, seconds=None)``: the next ``times`` calls;
- ``server.fail_when(marker, kind, times=None, ...)``: calls whose messages contain ``marker``
  (every such call when ``times`` is None); marker rules are checked before the queue;
- ``server.fail_every(n, kind)``: every n-th call (for benchmarks);
- ``server.clear_faults()``, ``server.reset()`` (faults, records and counters).

What it saw: ``server.calls`` (chat-completion requests, faulted ones included), ``server.requests``
(every request body, parsed), ``server.user_texts()`` (the user messages), ``server.served`` (per
call: "ok" or the fault kind), ``server.stats()``.

In-process: ``with LLMTestServer() as server: ... server.base_url`` (a thread; stopped on exit, and
in any case after ``max_lifetime`` seconds). Standalone, for benchmarks::

    python -m tests.llm_server --port 8765 [--latency 0.05] [--fail-every 10 --fail-kind 429] [--replay PATH]

which prints its base URL and serves until SIGTERM/SIGINT or ``--max-seconds``; its faults and
records are reachable over HTTP: ``POST /_control/faults`` with ``{"kind", "times", "marker",
"retry_after", "seconds"}``, ``POST /_control/reset``, ``GET /_control/stats``,
``GET /_control/requests``.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.recorded_llm import RecordedExtractions

DEFAULT_MODEL = "lexgraph-test-llm"
FAULT_KINDS = ("timeout", "malformed", "invalid", "garbage", "disconnect")
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"[^\W\d_][\w'’&.-]*")
_LEADING_STOPWORDS = {"the", "a", "an", "it", "its", "this", "that", "these", "those", "in", "on", "at", "by",
                      "for", "from", "to", "and", "but", "or", "if", "when", "while", "after", "before", "he",
                      "she", "they", "we", "i", "you", "his", "her", "their", "our", "there", "here", "as", "of",
                      "with", "section"}


@dataclass
class Fault:
    kind: str
    retry_after: float | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        self.kind = str(self.kind).lower()
        if self.kind not in FAULT_KINDS and not (self.kind.isdigit() and 400 <= int(self.kind) <= 599):
            raise ValueError(f"unknown fault {self.kind!r}: use an HTTP status (429, 500, …) or one of {FAULT_KINDS}")


@dataclass
class _MarkerRule:
    marker: str
    fault: Fault
    remaining: int | None


# -- the deterministic "model" --------------------------------------------------------------------------------

def _message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def chunk_of(body: dict) -> tuple[str, str]:
    """(heading, chunk text) the request asks about."""
    messages = body.get("messages") or []
    for message in messages:
        if message.get("role") == "user":
            text = _message_text(message)
            found = re.search(r"<chunk>\n?(.*?)\n?</chunk>", text, re.S)
            if found:
                heading = re.search(r"^Section: (.*)$", text, re.M)
                return (heading.group(1).strip() if heading else ""), found.group(1)
    users = [_message_text(m) for m in messages if m.get("role") == "user"]
    return "", users[-1] if users else ""


def _allowed_types(node: Any) -> list[str]:
    """The entity-type enum of the schema in the request (tools parameters or a JSON-mode system message)."""
    if isinstance(node, dict):
        enum = node.get("enum")
        if isinstance(enum, list) and "other" in enum:
            return [str(value) for value in enum]
        for value in node.values():
            found = _allowed_types(value)
            if found:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _allowed_types(value)
            if found:
                return found
    elif isinstance(node, str) and '"enum"' in node:
        match = re.search(r'"enum":\s*(\[[^\]]*\])', node)
        if match:
            try:
                values = json.loads(match.group(1))
            except json.JSONDecodeError:
                return []
            return [str(value) for value in values] if "other" in values else []
    return []


def _entities_in(sentence: str) -> list[tuple[str, int, int]]:
    """Runs of capitalised words in a sentence: (name, start, end)."""
    runs: list[list[re.Match]] = []
    for token in _TOKEN.finditer(sentence):
        word = token.group(0).rstrip(".'’-")
        if not word or not word[0].isupper() or (token.start() > 0 and sentence[token.start() - 1] == "["):
            continue
        previous = runs[-1][-1] if runs else None
        if previous is not None and sentence[previous.end():token.start()] == " " \
                and not previous.group(0).endswith("."):
            runs[-1].append(token)
        else:
            runs.append([token])
    found = []
    for run in runs:
        while run and run[0].group(0).lower() in _LEADING_STOPWORDS:
            run = run[1:]
        if not run:
            continue
        start, end = run[0].start(), run[-1].end()
        name = sentence[start:end].rstrip(".'’-")
        if len(name) > 1:
            found.append((name, start, start + len(name)))
    return found


# A question containing this marker gets an answer citing an id that is not in the evidence.
BOGUS_CITATION_MARKER = "CITE-SOMETHING-ELSE"


def _asks_for(body: dict, field: str) -> bool:
    """Whether the request's response schema (JSON-mode system message or tool parameters) has this field."""
    texts = [_message_text(m) for m in body.get("messages", [])] + [json.dumps(body.get("tools", []))]
    return any(f'"{field}"' in text for text in texts)


def cited_answer_for(body: dict) -> dict:
    """The answerer's schema: the first sentence of the first evidence item, citing that item's id."""
    users = [_message_text(m) for m in body.get("messages", []) if m.get("role") == "user"]
    first = users[0] if users else ""
    found = re.search(r"^\[([^\]\n]+)\] \([^)\n]*\)\n(.+)$", first, re.M)
    if not found:
        return {"answer": "", "cited_ids": [], "abstain": True}
    sentence = _SENTENCE_END.split(found.group(2).strip())[0]
    cited = "no-such-evidence-id" if BOGUS_CITATION_MARKER in first else found.group(1)
    return {"answer": sentence, "cited_ids": [cited], "abstain": False}


def sub_questions_for(body: dict) -> dict:
    """The decomposer's schema: the question split at "and" / "then" / commas."""
    users = [_message_text(m) for m in body.get("messages", []) if m.get("role") == "user"]
    question = users[-1] if users else ""
    parts = [p.strip(" ,?") for p in re.split(r"\b(?:and then|then|and)\b|,", question) if len(p.split()) >= 3]
    return {"sub_questions": [p + "?" for p in parts] or [question]}


def answer_for(body: dict, replay: "RecordedExtractions | None" = None) -> dict:
    """The deterministic answer (as a dict) for a request: an answer with citations, sub-questions, or a
    ChunkExtraction, by the fields of the response schema the request carries (with ``replay``, the extraction
    is the recording's for the chunk)."""
    if _asks_for(body, "cited_ids"):
        return cited_answer_for(body)
    if _asks_for(body, "sub_questions"):
        return sub_questions_for(body)
    heading, text = chunk_of(body)
    types = _allowed_types(body) or ["other"]
    if replay is not None:
        return replay.extraction(text, types)
    sentences = [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]
    statements, entities, relations = [], {}, []
    for sentence in sentences:
        found = _entities_in(sentence)
        facts = []
        for name, _, _ in found:
            if name.casefold() not in entities:
                entities[name.casefold()] = {
                    "name": name, "type": types[zlib.crc32(name.encode()) % len(types)],
                    "description": f"{name}, as named in the text.", "mention": sentence[:200]}
        for (first, _, first_end), (second, second_start, _) in zip(found, found[1:]):
            if first.casefold() == second.casefold():
                continue
            between = " ".join(_WORD.findall(sentence[first_end:second_start])[:6]) or "related to"
            if not facts:
                facts.append({"subject": first, "predicate": between, "object": second})
            relations.append({"source": first, "target": second, "predicate": between,
                              "description": sentence[:200], "strength": 0.5})
        statements.append({"text": sentence, "facts": facts})
    topics = [{"name": heading if heading and heading != "(none)" else "general", "statements": statements}] \
        if statements else []
    return {"topics": topics, "entities": list(entities.values()), "relations": relations}


def _words(text: str) -> int:
    return len(_WORD.findall(text))


# -- the server -----------------------------------------------------------------------------------------------

class LLMTestServer:
    """An OpenAI chat-completions endpoint on 127.0.0.1 (ephemeral port by default), in a thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, model: str = DEFAULT_MODEL, latency: float = 0.0,
                 max_lifetime: float = 600.0, timeout_seconds: float = 5.0,
                 replay: "RecordedExtractions | None" = None):
        self.host, self.port = host, port
        self.replay = replay  # extraction answers from a recording (read-only, shared by the handler threads)
        self.model = model
        self.latency = latency
        self.max_lifetime = max_lifetime
        self.timeout_seconds = timeout_seconds  # how long a "timeout" fault stalls by default
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Timer | None = None
        self.reset()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> "LLMTestServer":
        if self._httpd is not None:
            return self
        server = self

        class Handler(_Handler):
            owner = server

        self._stopping.clear()
        self._httpd = ThreadingHTTPServer((self.host, self.port), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"llm-test-server:{self.port}", daemon=True)
        self._thread.start()
        if self.max_lifetime:
            self._watchdog = threading.Timer(self.max_lifetime, self.stop)
            self._watchdog.daemon = True
            self._watchdog.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        self._stopping.set()  # wakes handlers stalled by a "timeout" fault
        if self._watchdog is not None:
            self._watchdog.cancel()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "LLMTestServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url."""
        return f"{self.url}/v1"

    # -- faults ------------------------------------------------------------------------------------------

    def fail_next(self, kind: str | int, times: int = 1, *, retry_after: float | None = None,
                  seconds: float | None = None) -> None:
        """Fail the next ``times`` calls (after any already queued) with ``kind``."""
        fault = Fault(str(kind), retry_after, seconds)
        with self._lock:
            self._queue.extend(Fault(fault.kind, retry_after, seconds) for _ in range(times))

    def fail_when(self, marker: str, kind: str | int, times: int | None = None, *,
                  retry_after: float | None = None, seconds: float | None = None) -> None:
        """Fail calls whose messages contain ``marker``: the next ``times`` such calls, or all (None)."""
        with self._lock:
            self._rules.append(_MarkerRule(marker, Fault(str(kind), retry_after, seconds), times))

    def fail_every(self, n: int, kind: str | int, *, retry_after: float | None = None) -> None:
        """Fail every n-th call (n, 2n, …); 0 turns it off."""
        with self._lock:
            self._every = (n, Fault(str(kind), retry_after)) if n else None

    def clear_faults(self) -> None:
        with self._lock:
            self._queue.clear()
            self._rules.clear()
            self._every = None

    def reset(self) -> None:
        """Forget faults, records and counters."""
        with self._lock:
            self._queue: deque[Fault] = deque()
            self._rules: list[_MarkerRule] = []
            self._every: tuple[int, Fault] | None = None
            self._requests: list[dict] = []
            self._authorizations: list[str | None] = []  # each request's Authorization header (None: none sent)
            self._served: list[str] = []
            self._prompt_tokens = 0
            self._completion_tokens = 0

    # -- records -----------------------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def requests(self) -> list[dict]:
        with self._lock:
            return list(self._requests)

    @property
    def served(self) -> list[str]:
        with self._lock:
            return list(self._served)

    @property
    def authorizations(self) -> list[str | None]:
        """The Authorization header of each chat-completion request, in order (e.g. "Bearer sk-...")."""
        with self._lock:
            return list(self._authorizations)

    def user_texts(self) -> list[str]:
        return ["\n".join(_message_text(m) for m in body.get("messages", []) if m.get("role") == "user")
                for body in self.requests]

    def all_text(self) -> str:
        """Every message of every request, as one string (for 'did X reach the LLM?')."""
        return "\n".join(_message_text(m) for body in self.requests for m in body.get("messages", []))

    def stats(self) -> dict:
        with self._lock:
            return {"calls": len(self._requests), "served": dict(Counter(self._served)),
                    "prompt_tokens": self._prompt_tokens, "completion_tokens": self._completion_tokens}

    # -- one request -------------------------------------------------------------------------------------

    def _admit(self, body: dict, authorization: str | None = None) -> tuple[int, Fault | None]:
        """Record a chat-completion request and pick its fault (marker rules, then the queue, then every-n)."""
        text = "\n".join(_message_text(m) for m in body.get("messages", []) if isinstance(m, dict))
        with self._lock:
            self._requests.append(body)
            self._authorizations.append(authorization)
            number = len(self._requests)
            fault = None
            for rule in self._rules:
                if rule.marker in text and (rule.remaining is None or rule.remaining > 0):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    fault = rule.fault
                    break
            if fault is None and self._queue:
                fault = self._queue.popleft()
            if fault is None and self._every is not None and number % self._every[0] == 0:
                fault = self._every[1]
            self._served.append(fault.kind if fault else "ok")
            return number, fault

    def _account(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self._prompt_tokens += prompt_tokens
            self._completion_tokens += completion_tokens

    def completion(self, body: dict, number: int, fault: Fault | None) -> dict:
        """The chat.completion object for a request (a malformed/invalid one when the fault says so)."""
        if fault is not None and fault.kind == "malformed":
            answer = '{"topics": [{"name": "general", "statements": [ this is not JSON'
        elif fault is not None and fault.kind == "invalid":
            answer = json.dumps({"topics": "not a list", "entities": [{"name": 42}], "relations": {"x": 1}})
        else:
            answer = json.dumps(answer_for(body, self.replay), ensure_ascii=False)
        prompt_tokens = sum(_words(_message_text(m)) for m in body.get("messages", []) if isinstance(m, dict))
        completion_tokens = _words(answer)
        self._account(prompt_tokens, completion_tokens)
        message: dict[str, Any] = {"role": "assistant", "content": answer, "refusal": None}
        finish = "stop"
        tools = body.get("tools")
        if tools:
            choice = body.get("tool_choice")
            name = (choice.get("function", {}).get("name") if isinstance(choice, dict) else None) \
                or tools[0].get("function", {}).get("name", "ChunkExtraction")
            message = {"role": "assistant", "content": None, "refusal": None,
                       "tool_calls": [{"id": f"call_{number}", "type": "function",
                                       "function": {"name": name, "arguments": answer}}]}
        return {
            "id": f"chatcmpl-test-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


class _Handler(BaseHTTPRequestHandler):
    owner: LLMTestServer
    protocol_version = "HTTP/1.1"
    server_version = "lexgraph-test-llm/1"
    # Headers and body go out as two writes; with Nagle's algorithm on, the second waits for the client's
    # delayed ACK of the first, ~40 ms on every keep-alive request. A real server answers at once.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, json.dumps(payload).encode(), headers)

    def _send_raw(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout fault)
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "param": None, "code": kind}}, headers)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw or b"{}")

    def do_GET(self) -> None:  # noqa: N802
        owner = self.owner
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": owner.model, "object": "model", "created": 0, "owned_by": "lexgraph-tests"}]})
        elif self.path == "/_control/stats":
            self._send_json(200, owner.stats())
        elif self.path == "/_control/requests":
            self._send_json(200, owner.requests)
        else:
            self._error(404, f"no route {self.path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        owner = self.owner
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError) as error:
            self._error(400, f"request body is not JSON: {error}", "invalid_request_error")
            return
        if self.path == "/_control/faults":
            try:
                if body.get("marker"):
                    owner.fail_when(body["marker"], body["kind"], body.get("times"),
                                    retry_after=body.get("retry_after"), seconds=body.get("seconds"))
                else:
                    owner.fail_next(body["kind"], int(body.get("times") or 1),
                                    retry_after=body.get("retry_after"), seconds=body.get("seconds"))
            except (KeyError, ValueError, TypeError) as error:
                self._error(400, f"bad fault: {error}", "invalid_request_error")
                return
            self._send_json(200, {"ok": True})
            return
        if self.path == "/_control/reset":
            owner.reset()
            self._send_json(200, {"ok": True})
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}", "not_found")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "'messages' must be a list", "invalid_request_error")
            return
        number, fault = owner._admit(body, self.headers.get("Authorization"))
        if owner.latency:
            owner._stopping.wait(owner.latency)
        if fault is None or fault.kind in ("malformed", "invalid"):
            self._send_json(200, owner.completion(body, number, fault))
        elif fault.kind == "timeout":
            owner._stopping.wait(fault.seconds if fault.seconds is not None else owner.timeout_seconds)
            self._send_json(200, owner.completion(body, number, None))
        elif fault.kind == "garbage":
            self._send_raw(200, b"<html>this is not JSON", content_type="application/json")
        elif fault.kind == "disconnect":
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
        else:
            status = int(fault.kind)
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = f"{fault.retry_after:g}"
            elif status == 429:
                headers["Retry-After"] = "1"
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            self._error(status, f"injected fault {status}", kind, headers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.llm_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--fail-every", type=int, default=0, help="fail every n-th call with --fail-kind")
    parser.add_argument("--fail-kind", default="429")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long (0: never)")
    parser.add_argument("--replay", metavar="PATH", help="answer extractions from this recording, e.g. "
                        "../shared/datasets/musique-hipporag/openie_gpt-3.5-turbo-1106.json")
    parser.add_argument("--replay-corpus", metavar="DIR", help="the recorded passages (default: corpus/ beside it)")
    args = parser.parse_args(argv)
    replay = None
    if args.replay:
        from tests.recorded_llm import RecordedExtractions

        replay = RecordedExtractions.load(args.replay, args.replay_corpus)
    server = LLMTestServer(args.host, args.port, model=args.model, latency=args.latency,
                           max_lifetime=args.max_seconds, replay=replay)
    if args.fail_every:
        server.fail_every(args.fail_every, args.fail_kind)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    with server:
        mode = f", replaying {len(replay)} recorded passages" if replay is not None else ""
        print(f"LLM test server listening on {server.base_url} (model {server.model}{mode})", flush=True)
        while not done.is_set() and server.running:
            done.wait(0.2)
    print(json.dumps(server.stats()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
