"""`lexgraph serve` under load, with no LLM: start the server on an indexed corpus (by default the
`lexgraph bench` cache of LiHua-World), then

1. time to the first answer after the process starts (the index loads lazily on the first question);
2. one client asking every dev question once (route auto): p50/p95 latency per route the router took;
3. N concurrent clients (default 8) asking the dev questions round robin for S seconds (default 60):
   errors, throughput (answers/s), p50/p95 latency per route;

and the server's resident memory. The index is only read: the server's home is a temporary folder
whose collection is a symbolic link to the cached index, so the query log and provenance records
the server writes go to the temporary folder, never into the cache."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOME = ROOT / ".lexgraph" / "bench" / "lihuaworld-aac215cda60d" / "index"
DEFAULT_QUESTIONS = ROOT.parent / "shared" / "datasets" / "lihua-world" / "questions.dev.json"


def load_questions(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data.values() if isinstance(data, dict) else data
    return [row["question"] for row in rows]


def start_server(scratch: Path, **env_extra: str) -> tuple[subprocess.Popen, int, Path]:
    """`lexgraph serve` on a free loopback port over LEXGRAPH_HOME=scratch, with no LLM and no token; its
    output goes to scratch/serve.log. Returns the process, its port and the log's path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LEXGRAPH_LLM_BASE_URL", "OPENAI_BASE_URL", "LEXGRAPH_SERVE_TOKEN")}
    env.update(HF_HUB_OFFLINE="1", LEXGRAPH_HOME=str(scratch), **env_extra)
    port, log_path = free_port(), scratch / "serve.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "lexgraph.cli", "serve", "--host", "127.0.0.1",
                                   "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return server, port, log_path


def until_up(server: subprocess.Popen, log_path: Path, call):
    """`call()`'s result once the server accepts connections; exits with its log if the server dies first."""
    while True:
        if server.poll() is not None:
            raise SystemExit(f"serve exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            return call()
        except OSError:
            time.sleep(0.05)


def stop(server: subprocess.Popen, scratch: Path) -> None:
    """End the server (killed if it has not stopped within 30 s) and remove its scratch home."""
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(scratch, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process in MB, from /proc."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", float("nan")), values.get("VmHWM", float("nan"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Client:
    """One keep-alive HTTP connection."""

    def __init__(self, port: int, timeout: float = 300):
        self.port, self.timeout = port, timeout
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            self.connection.request(method, path, body=payload, headers=headers)
            response = self.connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            raise
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, None

    def ask(self, question: str, route: str = "auto") -> tuple[int, dict | None, float]:
        started = time.perf_counter()
        status, body = self.request("POST", "/ask", {"question": question, "route": route})
        return status, body, time.perf_counter() - started

    def close(self) -> None:
        self.connection.close()


def query_log(home: Path) -> list[dict]:
    """The server's query log lines (one per answered question)."""
    path = home / "queries" / "log.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return lines


def server_latency(lines: list[dict]) -> dict[str, list[float]]:
    by_route: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        total = (line.get("latency_ms") or {}).get("total")
        if total is not None:
            by_route[line.get("route", "?")].append(total / 1000)
    return by_route


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def latency_table(title: str, by_route: dict[str, list[float]]) -> list[str]:
    lines = [f"{title}", "", "| route | answers | p50 ms | p95 ms | max ms |", "|---|---|---|---|---|"]
    everything = [v for values in by_route.values() for v in values]
    if not everything:
        return lines + ["| (none) | 0 | | | |"]
    for route in sorted(by_route) + ["all"]:
        values = everything if route == "all" else by_route[route]
        lines.append(f"| {route} | {len(values)} | {1000 * percentile(values, 50):.0f} | "
                     f"{1000 * percentile(values, 95):.0f} | {1000 * max(values):.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=DEFAULT_HOME,
                        help="index home to serve, read-only (default: the bench cache of LiHua-World)")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sequential", type=int, default=None,
                        help="questions in the one-client pass (default: all of them)")
    args = parser.parse_args()

    home = args.home.resolve()
    collection = os.environ.get("LEXGRAPH_COLLECTION", "").strip() or "default"
    if not (home / collection).is_dir():
        raise SystemExit(f"no index at {home / collection}; run `make bench` first to build the LiHua-World cache")
    questions = load_questions(args.questions)
    if not questions:
        raise SystemExit(f"{args.questions}: no questions")

    load_before = f"{os.getloadavg()[0]:.1f}"
    scratch = Path(tempfile.mkdtemp(prefix="lexgraph-serve-bench-"))
    (scratch / collection).symlink_to(home / collection, target_is_directory=True)
    started = time.perf_counter()
    server, port, log_path = start_server(scratch)
    try:
        client = Client(port)
        status, health = until_up(server, log_path, lambda: client.request("GET", "/health"))
        up = time.perf_counter() - started
        if status != 200:
            raise SystemExit(f"/health answered {status}: {health}")
        status, first, first_latency = client.ask(questions[0])
        first_answer = time.perf_counter() - started
        if status != 200:
            raise SystemExit(f"the first question got {status}: {first}\n{log_path.read_text()[-3000:]}")
        print(f"index {home / collection}: {health['documents']} documents, {health['chunks']} chunks, "
              f"LLM {'on' if health['llm'] else 'off'}", flush=True)
        print(f"server up (health answers) {up:.1f} s after start; first answer {first_answer:.1f} s after start "
              f"(that question took {first_latency:.1f} s, the index loading with it)", flush=True)

        # warm-up, not counted: every route once (each loads its own structures on first use)
        for route in ("semantic", "graph", "agentic"):
            client.ask(questions[1], route)
        logged = len(query_log(scratch))
        cpu_start = cpu_seconds(server.pid)

        # 2. one client, every question once
        sequential: dict[str, list[float]] = defaultdict(list)
        errors_sequential = Counter()
        for question in questions[: args.sequential]:
            status, body, latency = client.ask(question)
            if status == 200:
                sequential[body["route"]].append(latency)
            else:
                errors_sequential[status] += 1
        client.close()
        server_sequential = server_latency(query_log(scratch)[logged:])
        cpu_sequential = cpu_seconds(server.pid) - cpu_start
        logged = len(query_log(scratch))
        print(f"one client: {sum(map(len, sequential.values()))} answers, errors: {dict(errors_sequential) or 0}",
              flush=True)

        # 3. N clients for S seconds
        loaded: dict[str, list[float]] = defaultdict(list)
        errors: Counter = Counter()
        lock = threading.Lock()
        deadline = time.perf_counter() + args.seconds
        barrier = threading.Barrier(args.clients + 1)

        def worker(number: int) -> None:
            mine = Client(port)
            barrier.wait()
            position = number * len(questions) // args.clients
            while time.perf_counter() < deadline:
                question = questions[position % len(questions)]
                position += 1
                try:
                    status, body, latency = mine.ask(question)
                except (OSError, http.client.HTTPException) as error:
                    with lock:
                        errors[type(error).__name__] += 1
                    continue
                with lock:
                    if status == 200:
                        loaded[body["route"]].append(latency)
                    else:
                        errors[status] += 1
            mine.close()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.clients)]
        for thread in threads:
            thread.start()
        barrier.wait()
        load_started, cpu_start = time.perf_counter(), cpu_seconds(server.pid)
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - load_started
        cpu_loaded = cpu_seconds(server.pid) - cpu_start
        rss, hwm = rss_mb(server.pid)
        server_loaded = server_latency(query_log(scratch)[logged:])
        answers = sum(map(len, loaded.values()))
    finally:
        stop(server, scratch)

    print()
    print(f"command: python -m benchmarks.bench_serve --home {args.home} --questions {args.questions} "
          f"--clients {args.clients} --seconds {args.seconds:g}")
    print(f"machine: {os.cpu_count()} cores, load average {load_before} before and {os.getloadavg()[0]:.1f} after; "
          f"server: one uvicorn process, FastAPI thread pool, torch threads "
          f"{os.environ.get('LEXGRAPH_SERVE_TORCH_THREADS') or 1}; no LLM")
    print()
    print(f"| measure | value |")
    print("|---|---|")
    print(f"| server up (/health answers) after start | {up:.1f} s |")
    print(f"| first answer after start (index loads on it) | {first_answer:.1f} s |")
    print(f"| {args.clients} clients for {args.seconds:g} s: answers | {answers} |")
    print(f"| errors | {sum(errors.values())}{' ' + str(dict(errors)) if errors else ''} |")
    print(f"| throughput | {answers / elapsed:.2f} answers/s |")
    print(f"| server resident memory after the load (peak) | {rss:.0f} MB ({hwm:.0f} MB) |")
    n_sequential = sum(map(len, sequential.values()))
    print(f"| server CPU time per answer: one client / {args.clients} clients | "
          f"{1000 * cpu_sequential / max(n_sequential, 1):.0f} ms / {1000 * cpu_loaded / max(answers, 1):.0f} ms |")
    print()
    for line in latency_table(f"One client, each of {sum(map(len, sequential.values()))} dev questions once "
                              f"(route auto; latency per route taken), seen by the client:", sequential):
        print(line)
    print()
    for line in latency_table("The same, inside the server (the query log's total: no HTTP, no queueing):",
                              server_sequential):
        print(line)
    print()
    for line in latency_table(f"{args.clients} concurrent clients for {args.seconds:g} s, seen by the clients:",
                              loaded):
        print(line)
    print()
    for line in latency_table("The same, inside the server:", server_loaded):
        print(line)


if __name__ == "__main__":
    main()
