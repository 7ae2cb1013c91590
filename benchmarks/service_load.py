"""Load on `flink-memory serve`: concurrent clients recalling one agent's memory over HTTP, against the CLI.

    flock /tmp/heavy.lock python benchmarks/service_load.py --store out/memory.sqlite --seconds 60
    flock /tmp/heavy.lock python benchmarks/service_load.py --postgres --seconds 60

The store holds one agent with `--agent-units` memory units among `--rows` rows (benchmarks/recall_latency.py
builds it: into a temporary SQLite file, or with --postgres into a throwaway PostgreSQL server started from the
machine's binaries; --store reuses a built store, SQLite file or PostgreSQL URL, read only). `flink-memory
serve --read-only` runs in its own process; `--clients` keep-alive connections from this process (one asyncio
loop, plain HTTP/1.1 on sockets: well under 1 ms of CPU per request) each send
`POST /v1/agents/agent-0/recall` with a distinct question (three words of one of the agent's units, recall_latency's
questions) as soon as the previous answer arrived, for `--seconds` after a warm-up. Reported: requests/s, p50/p99
latency, errors (anything but a 200 with hits),
and the CPU time of the server, of the database server (PostgreSQL) and of the clients, per request and in
cores, so that what the clients take from the server's two cores is known, and what other processes of the
machine took meanwhile; then one client alone (the latency
of a request on an idle server); then an open loop at `--rate` requests/s (40), each request timed from its
scheduled start, so that a server that falls behind shows it. Then the
baseline: `flink-memory recall agent-0 QUESTION --store ...` per question, a new process each time, one after the
other. Last, the results as a row of a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # (pgserver: a throwaway PostgreSQL server)

from recall_latency import build, questions  # noqa: E402

from flink_memory.store import open_store  # noqa: E402
from flink_memory.store.schema import NODES  # noqa: E402

AGENT = "agent-0"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_cpu() -> float:
    """CPU seconds every process of the machine spent (busy time of all cores, from /proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / TICKS


def tree_cpu(root: int) -> float:
    """CPU seconds of a process and its live descendants (the PostgreSQL server and its backends)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0.0
    for pid in tree:
        try:
            total += process_cpu(pid)
        except OSError:
            continue
    return total


def postgres_pid(url: str) -> int | None:
    """The PostgreSQL server listening on the URL's port, when its command line names the port (servers
    started by pg_ctl -o "-p PORT", as tests/pgserver.py does); None: its CPU is not measured."""
    port = str(urlsplit(url).port or 5432)
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"postgres") and any(a == b"-p" and b == port.encode() for a, b in zip(argv, argv[1:])):
            return int(entry.name)
    return None


def sample_texts(location: str, n: int) -> list[str]:
    """Texts of `n` of the agent's units, spread over the agent's rows (read only)."""
    with open_store(location) as store:
        rows = store.connection.query(f"SELECT text FROM {NODES} WHERE agent_id = ? AND kind = 'unit' "
                                     "ORDER BY node_id", (AGENT,))
    step = max(1, len(rows) // n)
    return [row[0] for row in rows[::step]][:n]


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("flink-memory")
    return [str(script)] if script.exists() else [sys.executable, "-m", "flink_memory.cli"]


def child_env() -> dict[str, str]:
    """This checkout first on the path of the server and CLI processes."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def start_server(store: str, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([*cli_command(), "serve", "--store", store, "--port", str(port), "--read-only", *extra],
                              env=child_env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=5) as answer:
                health = json.loads(answer.read())
            if health["status"] == "ok":
                return server
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the server did not start (exit {server.poll()})")
        time.sleep(0.2)


class Load:
    """Closed-loop clients on keep-alive connections: each sends its next question when its answer arrived."""

    def __init__(self, port: int, asked: list[str], mode: str, k: int, timeout_s: float) -> None:
        self.port, self.asked, self.mode, self.k, self.timeout_s = port, asked, mode, k, timeout_s
        self.next = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}

    def question(self) -> str:
        question = self.asked[self.next % len(self.asked)]
        self.next += 1
        return question

    def _error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bytes]:
        body = json.dumps({"question": self.question(), "k": self.k, "mode": self.mode}).encode()
        writer.write(f"POST /v1/agents/{AGENT}/recall HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")),
                      None)
        if length is None:
            raise OSError(f"an answer without content-length: {lines[0]}")
        return int(lines[0].split()[1]), await reader.readexactly(length)

    async def _client(self, until: float, record: bool) -> None:
        connection = None
        while True:  # at least one request each
            started = time.perf_counter()
            try:
                if connection is None:
                    connection = await asyncio.open_connection("127.0.0.1", self.port)
                status, body = await asyncio.wait_for(self._request(*connection), self.timeout_s)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
                if record:
                    self._error(type(exc).__name__)
                if connection is not None:
                    connection[1].close()
                connection = None
                if time.perf_counter() >= until:
                    break
                continue
            if record:
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self._error(f"HTTP {status}")
                elif not json.loads(body)["hits"]:
                    self._error("no hits")
            if time.perf_counter() >= until:
                break
        if connection is not None:
            connection[1].close()

    async def open_loop(self, rate: float, seconds: float) -> float:
        """Requests at `rate` per second for `seconds`, each on a free keep-alive connection (a new one when
        all are busy), each timed from its scheduled start: a server that falls behind shows it in the
        latencies, not in a slower schedule. The wall time until the last answer."""
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        started = time.perf_counter()

        async def one(scheduled: float) -> None:
            connection = idle.pop() if idle else None
            for attempt in range(2):  # (a kept-alive connection the server closed while idle: once more, anew)
                try:
                    if connection is None:
                        connection = await asyncio.open_connection("127.0.0.1", self.port)
                        attempt = 1
                    status, body = await asyncio.wait_for(self._request(*connection), self.timeout_s)
                    break
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
                    if connection is not None:
                        connection[1].close()
                    connection = None
                    if attempt or not isinstance(exc, (asyncio.IncompleteReadError, ConnectionResetError)):
                        self._error(type(exc).__name__)
                        return
            self.latencies.append(time.perf_counter() - scheduled)
            if status != 200:
                self._error(f"HTTP {status}")
            elif not json.loads(body)["hits"]:
                self._error("no hits")
            idle.append(connection)

        tasks = []
        for n in range(int(rate * seconds)):
            scheduled = started + n / rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*tasks)
        for _, writer in idle:
            writer.close()
        return time.perf_counter() - started

    async def run(self, clients: int, seconds: float, record: bool) -> float:
        """Run the clients for `seconds`; the wall time until the last answer."""
        started = time.perf_counter()
        await asyncio.gather(*(self._client(started + seconds, record) for _ in range(clients)))
        return time.perf_counter() - started


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def phase(load: Load, clients: int, seconds: float) -> dict[str, Any]:
    """One measured run of the clients: requests/s, latencies and errors."""
    load.latencies, load.errors = [], {}
    wall = asyncio.run(load.run(clients, seconds, record=True))
    done = len(load.latencies)
    return {"clients": clients, "seconds": wall, "requests": done, "requests_per_s": done / wall,
            "p50_ms": 1000 * statistics.median(load.latencies), "p99_ms": 1000 * percentile(load.latencies, 0.99),
            "max_ms": 1000 * max(load.latencies), "errors": sum(load.errors.values()), "error_kinds": load.errors}


def open_phase(load: Load, rate: float, seconds: float) -> dict[str, Any]:
    """An open loop at `rate` requests/s: latencies from each request's scheduled start."""
    load.latencies, load.errors = [], {}
    wall = asyncio.run(load.open_loop(rate, seconds))
    done = len(load.latencies)
    return {"rate": rate, "seconds": wall, "requests": done, "requests_per_s": done / wall,
            "p50_ms": 1000 * statistics.median(load.latencies), "p99_ms": 1000 * percentile(load.latencies, 0.99),
            "max_ms": 1000 * max(load.latencies), "errors": sum(load.errors.values()), "error_kinds": load.errors}


def measure_service(store: str, asked: list[str], args: argparse.Namespace, database_pid: int | None
                    ) -> dict[str, Any]:
    """The first request alone (it loads the agent's vectors), a warm-up, the clients for `--seconds` (with the
    CPU of every process), then one client alone for `--solo-seconds`: the latency of a request on an idle server."""
    port = free_port()
    server = start_server(store, port, args.serve_arg)
    try:
        load = Load(port, asked, args.mode, args.k, args.timeout)
        first = asyncio.run(load.run(1, 0, record=False))
        asyncio.run(load.run(args.clients, args.warmup, record=False))
        cpu = (tree_cpu(server.pid), time.process_time(), tree_cpu(database_pid) if database_pid else 0.0,
               machine_cpu())
        loaded = phase(load, args.clients, args.seconds)
        server_s, client_s, database_s = (tree_cpu(server.pid) - cpu[0], time.process_time() - cpu[1],
                                          (tree_cpu(database_pid) - cpu[2]) if database_pid else 0.0)
        others_s = max(0.0, machine_cpu() - cpu[3] - server_s - client_s - database_s)
        solo = phase(load, 1, args.solo_seconds) if args.solo_seconds else None
        opened = open_phase(load, args.rate, args.seconds) if args.rate else None
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    wall, done = loaded["seconds"], loaded["requests"]
    return {**loaded, "first_request_ms": 1000 * first, "questions_asked": load.next,
            "distinct_questions": min(load.next, len(asked)), "solo": solo, "open_loop": opened,
            "cpu": {"server_cores": server_s / wall, "server_ms_per_request": 1000 * server_s / done,
                    "database_cores": database_s / wall, "database_ms_per_request": 1000 * database_s / done,
                    "client_cores": client_s / wall, "client_ms_per_request": 1000 * client_s / done,
                    "other_processes_cores": others_s / wall}}


def measure_cli(store: str, asked: list[str], mode: str, k: int) -> dict[str, Any]:
    times = []
    for question in asked:
        started = time.perf_counter()
        done = subprocess.run([*cli_command(), "recall", AGENT, question, "--store", store, "--k", str(k),
                               "--mode", mode, "--json"], env=child_env(), capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"flink-memory recall failed ({done.returncode}): {done.stderr[-500:]}")
    return {"questions": len(times), "median_s": statistics.median(times), "mean_s": statistics.fmean(times),
            "requests_per_s": 1 / statistics.fmean(times)}


def prepared_store(args: argparse.Namespace, workdir: Path) -> tuple[str, list[str], int | None]:
    """(store location, sampled texts of the agent, pid of the PostgreSQL server or None)."""
    if args.store:
        return args.store, sample_texts(args.store, 2000), postgres_pid(args.store) if "://" in args.store else None
    from flink_memory.config import load_config
    from flink_memory.embeddings import embedder_for

    embedder = embedder_for(load_config(None, [], environ={}).embeddings)
    assert embedder is not None
    database_pid = None
    location = str(workdir / "memory.sqlite")
    if args.postgres:
        from pgserver import start_postgres

        location = start_postgres(workdir / "pg")
        database_pid = postgres_pid(location)
    plan = argparse.Namespace(rows=args.rows, agent_units=args.agent_units, others=args.others,
                              vocabulary=20_000, chunk=5000, vectors="random", bulk=False, existing=False)
    built, sample, _, _ = build(location, plan, embedder)
    print(f"built {built['rows']} rows in {built['build_s']:.0f} s", file=sys.stderr, flush=True)
    return location, sample, database_pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="a store built by recall_latency.py (SQLite path or postgresql:// URL), "
                        "used read only")
    parser.add_argument("--postgres", action="store_true", help="build the store in a throwaway PostgreSQL server")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--agent-units", type=int, default=100_000)
    parser.add_argument("--others", type=int, default=900)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=5, help="seconds of load before measuring")
    parser.add_argument("--solo-seconds", type=float, default=10, help="then one client alone (0: not measured)")
    parser.add_argument("--mode", choices=["hybrid", "keyword", "vector"], default="hybrid")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--rate", type=float, default=40, help="then an open loop at this many requests/s for "
                        "--seconds, each timed from its scheduled start (0: not measured)")
    parser.add_argument("--timeout", type=float, default=30, help="seconds before a request counts as an error")
    parser.add_argument("--questions", type=int, default=20_000, help="distinct questions to ask")
    parser.add_argument("--cli-questions", type=int, default=10, help="questions for the CLI baseline (0: none)")
    parser.add_argument("--serve-arg", action="append", default=[], help="an extra argument of `serve`")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="service-load-"))
    location, sample, database_pid = prepared_store(args, workdir)
    try:
        asked = questions(sample, args.questions)
        service = measure_service(location, asked, args, database_pid)
        cli = measure_cli(location, asked[-args.cli_questions:], args.mode, args.k) if args.cli_questions else None
    finally:
        if args.postgres:
            from pgserver import stop_postgres

            stop_postgres(workdir / "pg")
        shutil.rmtree(workdir, ignore_errors=True)
    store_kind = "postgresql" if "://" in location else "sqlite"
    results = {"store": store_kind, "mode": args.mode, "service": service, "cli": cli}
    cpu = service["cpu"]
    print(f"{store_kind} {args.mode}: {args.clients} clients for {service['seconds']:.0f} s: "
          f"{service['requests_per_s']:.1f} requests/s, p50 {service['p50_ms']:.1f} ms, "
          f"p99 {service['p99_ms']:.1f} ms, "
          f"{service['errors']} errors {service['error_kinds'] or ''}({service['requests']} requests, first request "
          f"{service['first_request_ms']:.0f} ms)")
    print(f"  CPU: server {cpu['server_cores']:.2f} cores ({cpu['server_ms_per_request']:.1f} ms per request), "
          f"database {cpu['database_cores']:.2f} cores ({cpu['database_ms_per_request']:.1f} ms), "
          f"clients {cpu['client_cores']:.2f} cores ({cpu['client_ms_per_request']:.2f} ms), other processes of the "
          f"machine {cpu['other_processes_cores']:.2f} cores (of {os.cpu_count()})")
    solo = service["solo"]
    if solo:
        print(f"  one client alone: {solo['requests_per_s']:.1f} requests/s, p50 {solo['p50_ms']:.1f} ms, "
              f"p99 {solo['p99_ms']:.1f} ms, {solo['errors']} errors")
    opened = service["open_loop"]
    if opened:
        print(f"  open loop at {opened['rate']:g} requests/s: {opened['requests_per_s']:.1f} requests/s answered, "
              f"p50 {opened['p50_ms']:.1f} ms, p99 {opened['p99_ms']:.1f} ms from the scheduled start, "
              f"{opened['errors']} errors")
    if cli:
        results["cli_s_over_service_p50"] = cli["median_s"] / (service["p50_ms"] / 1000)
        results["service_over_cli_requests_per_s"] = service["requests_per_s"] / cli["requests_per_s"]
        print(f"  CLI (a process per question, {cli['questions']} questions): median {cli['median_s']:.2f} s, "
              f"{cli['requests_per_s']:.2f} requests/s")
        print(f"  service / CLI requests/s: {results['service_over_cli_requests_per_s']:.1f}x; CLI s per question / "
              f"service p50: {results['cli_s_over_service_p50']:.2f}x with {args.clients} clients", end="")
        if solo:
            results["cli_s_over_solo_p50"] = cli["median_s"] / (solo["p50_ms"] / 1000)
            print(f", {results['cli_s_over_solo_p50']:.1f}x with one client", end="")
        print()
    print(markdown_row(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


HEADER = ("| store | mode | clients | requests/s | p50 ms | p99 ms | errors | server CPU ms/request | database CPU "
          "ms/request | one client: p50 ms | CLI s/question | service / CLI requests/s |\n" + "|---" * 12 + "|")


def markdown_row(results: dict[str, Any]) -> str:
    """The results as a row of HEADER's table (docs/benchmarks.md)."""
    service, cli, solo = results["service"], results["cli"], results["service"]["solo"]
    cells = [results["store"], results["mode"], service["clients"], f"{service['requests_per_s']:.1f}",
             f"{service['p50_ms']:.0f}", f"{service['p99_ms']:.0f}", service["errors"],
             f"{service['cpu']['server_ms_per_request']:.1f}", f"{service['cpu']['database_ms_per_request']:.1f}",
             f"{solo['p50_ms']:.0f}" if solo else "", f"{cli['median_s']:.2f}" if cli else "",
             f"{results['service_over_cli_requests_per_s']:.1f}" if cli else ""]
    return HEADER + "\n| " + " | ".join(str(c) for c in cells) + " |"


if __name__ == "__main__":
    raise SystemExit(main())
