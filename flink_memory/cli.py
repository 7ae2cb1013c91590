"""flink-memory: run the job locally, serve the embedded model, read an agent's memory (show, recall)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flink_memory import budgets
from flink_memory.config import Config, ConfigError, load_config
from flink_memory.llm.client import resolve_api_key

if TYPE_CHECKING:
    from flink_memory.llm.embedded import EmbeddedServer

log = logging.getLogger("flink_memory")


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's flags: shared by `flink-memory run` and jobs/memory_summarization.py (flink run -py)."""
    parser.add_argument("--input", required=True, help="a JSON-lines file or a directory of them")
    parser.add_argument("--output", required=True, help="output directory (summaries/, manifests/, dead-letters/)")
    parser.add_argument("--config", help="YAML config file (default: conf/flink-memory.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting; repeatable")
    parser.add_argument("--follow", action="store_true", help="keep watching the input directory for new files")
    parser.add_argument("--parallelism", type=_positive, help="shorthand for --set job.parallelism=N")
    parser.add_argument("--restore", metavar="PATH", help="resume from a retained checkpoint or a savepoint")


def job_config(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.parallelism is not None:
        overrides.append(f"job.parallelism={args.parallelism}")
    config = load_config(args.config, overrides)
    budgets.check(config)
    config.store.location(args.output)  # (refuses an output it cannot put the store next to)
    return config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


KINDS = ("calibrate", "plan", "batch", "part", "merge", "global")


def count_lines(path: str) -> int | None:
    """Lines of a bounded local input (a file, or the files of a folder); None when it cannot be read here."""
    root = Path(path.removeprefix("file://"))
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                total += block.count(b"\n")
    return total


class Progress:
    """Polls the local cluster's REST API for the job's counters and reports them.

    On a terminal: one line, rewritten every second. Otherwise (a log, CI): a line every 30 seconds.
    """

    NAMES = ("records_in", "dead_letters", "units_in", "batches", "merges", "globals", "llm_in_flight",
             "pending_keys", *(f"llm_calls_{k}" for k in KINDS))

    def __init__(self, port: int, job_id: str, stream: Any = sys.stderr, total: int | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.job_id = job_id
        self.stream = stream
        self.total = total
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every_s = 1.0 if self.tty else 30.0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Progress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def snapshot(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        job = _get_json(f"{self.base}/jobs/{self.job_id}")
        for vertex in job.get("vertices", []):
            url = f"{self.base}/jobs/{self.job_id}/vertices/{vertex['id']}/subtasks/metrics"
            available = [m["id"] for m in _get_json(url)]
            wanted = [m for m in available if m.rsplit(".", 1)[-1] in self.NAMES and "flink_memory" in m]
            if not wanted:
                continue
            for metric in _get_json(f"{url}?get={','.join(wanted)}&agg=sum"):
                name = metric["id"].rsplit(".", 1)[-1]
                totals[name] = totals.get(name, 0) + float(metric.get("sum", 0))
        return totals

    def line(self, s: dict[str, float]) -> str:
        read = int(s.get("records_in", 0))
        elapsed = time.monotonic() - self.started
        if self.total:
            records = f"records {read}/{self.total}"
            if 0 < read < self.total:
                records += f" (input ends in ~{elapsed * (self.total - read) / read:.0f} s)"
        else:
            records = f"records {read}"
        calls = ", ".join(f"{k} {int(s[f'llm_calls_{k}'])}" for k in KINDS if s.get(f"llm_calls_{k}"))
        return (f"[flink-memory] {elapsed:5.0f} s | {records} | dead letters {int(s.get('dead_letters', 0))}"
                f" | batches {int(s.get('batches', 0))} | merges {int(s.get('merges', 0))}"
                f" | globals {int(s.get('globals', 0))} | calls {calls or 0}"
                f" | in flight {int(s.get('llm_in_flight', 0))}")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                text = self.line(self.snapshot())
            except (OSError, ValueError, KeyError):
                continue
            self.stream.write(f"\r\033[K{text}" if self.tty else text + "\n")
            self.stream.flush()


def read_outputs(output_dir: str) -> dict[str, list[dict[str, Any]]]:
    """Committed output records (in-progress part files are hidden and skipped)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for name in ("summaries", "manifests", "dead-letters"):
        rows: list[dict[str, Any]] = []
        folder = Path(output_dir) / name
        for path in sorted(folder.glob("*")) if folder.exists() else []:
            if path.name.startswith(".") or not path.is_file():
                continue
            rows.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        found[name] = rows
    return found


def latest_globals(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for node in summaries:
        if node["kind"] == "global" and node["version"] > best.get(node["agent_id"], {}).get("version", 0):
            best[node["agent_id"]] = node
    return best


def report(output_dir: str, wall_s: float) -> str:
    from flink_memory.llm.runtime import read_stats
    from flink_memory.store.core import live_view

    outputs = read_outputs(output_dir)
    nodes = outputs["summaries"]
    kinds = {k: sum(1 for n in nodes if n["kind"] == k) for k in ("batch", "merge", "global")}
    live = live_view(nodes).values()  # a revised batch and the one it replaced hold the same units once
    units = sum(n.item_count for n in live if n.kind == "batch")
    stats = read_stats(output_dir)
    globals_ = latest_globals(nodes)
    by_kind = ", ".join(f"{k} {int(stats[f'calls_{k}'])}" for k in KINDS if stats.get(f"calls_{k}"))
    lines = [
        "flink-memory run finished",
        f"  memory units summarized : {units} ({len(globals_)} agents)",
        f"  summary nodes           : {kinds['batch']} batch, {kinds['merge']} merge, {kinds['global']} global",
        f"  manifests / dead letters: {len(outputs['manifests'])} / {len(outputs['dead-letters'])}",
        f"  LLM calls               : {int(stats.get('calls', 0))} ({by_kind or 'none'}; "
        f"{int(stats.get('journal_hits', 0))} answered from the journal, {int(stats.get('failures', 0))} failed, "
        f"{int(stats.get('retries', 0))} retried)",
        f"  tokens                  : {int(stats.get('prompt_tokens', 0))} prompt, "
        f"{int(stats.get('completion_tokens', 0))} completion",
        f"  wall time               : {wall_s:.1f} s",
        f"  output                  : {Path(output_dir).resolve()}/{{summaries,manifests,dead-letters}}",
    ]
    if globals_:
        agent = sorted(globals_)[0]
        node = globals_[agent]
        lines.append(f"  global summary of {agent} (v{node['version']}, {node['item_count']} units):")
        lines.append("    " + node["text"].strip().replace("\n", "\n    "))
    return "\n".join(lines)


def start_local_model(config: Config) -> EmbeddedServer | None:
    """For a local run with the embedded provider: one model server for every worker, set as the endpoint."""
    if config.llm.provider != "embedded" or config.llm.base_url:
        return None
    from flink_memory.llm.embedded import EmbeddedServer

    server = EmbeddedServer(config.llm.embedded_model_path, context_window=config.llm.context_window,
                            threads=config.llm.embedded_threads, parallel=config.llm.embedded_parallel)
    config.llm.base_url = server.base_url
    return server


def _quiet_shutdown(hook: Any = threading.excepthook) -> None:
    """Hide PyFlink's process-mode shutdown noise: the Beam data-plane thread of the local Python worker
    reports its gRPC stream cancelled ("Multiplexer hanging up") when the job ends. Other errors still show."""

    def excepthook(args: Any) -> None:
        if "Multiplexer hanging up" in str(args.exc_value) or "StatusCode.CANCELLED" in str(args.exc_value):
            return
        hook(args)

    threading.excepthook = excepthook


def run_job(args: argparse.Namespace) -> int:
    from flink_memory.flink.pipeline import build_job

    _quiet_shutdown()
    config = job_config(args)
    if config.llm.api_key_file:  # local workers read the same file: refuse now, not after every restart
        resolve_api_key(config.llm)
    server = start_local_model(config)
    if server is not None:
        print(f"[flink-memory] embedded model {server.model_path.name} on {server.base_url}", file=sys.stderr)
    Path(args.output).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = build_job(config, args.input, args.output, follow=args.follow, restore=args.restore, rest_port=port)
    started = time.monotonic()
    try:
        client = env.execute_async("flink-memory")
    except Exception as exc:
        if args.restore and "Cannot map checkpoint/savepoint state" in str(exc):
            print("flink-memory: the checkpoint holds state this job cannot claim. A checkpoint restores only in "
                  "the execution mode that wrote it (release 0.1.0 wrote process mode): rerun with --set "
                  f"job.execution_mode=process (or thread). Flink said: {str(exc).splitlines()[0][:300]}",
                  file=sys.stderr)
            return 3
        raise
    job_id = str(client.get_job_id())
    print(f"[flink-memory] job {job_id} running (web UI http://127.0.0.1:{port})", file=sys.stderr)
    progress = Progress(port, job_id, total=None if args.follow else count_lines(args.input)).start()
    try:
        client.get_job_execution_result().result()
    finally:
        progress.stop()
    print(report(args.output, time.monotonic() - started))
    store = config.store.location(args.output)
    if store:
        print(f"  live memory             : {store} (read it: flink-memory show|recall AGENT --store {store})")
    return 0


def serve_llm(args: argparse.Namespace) -> int:
    from flink_memory.llm.embedded import EmbeddedServer

    llm = load_config(args.config, args.overrides).llm  # (a flag given wins over the configuration)
    server = EmbeddedServer(
        args.model or llm.embedded_model_path, host=args.host, port=args.port,
        context_window=args.context_window or llm.context_window, threads=args.threads or llm.embedded_threads,
        parallel=args.parallel or llm.embedded_parallel)
    print(f"serving {server.model_path.name} at {server.base_url}/v1 (OpenAI-compatible); Ctrl-C stops",
          flush=True)
    stop = threading.Event()
    try:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    server.close()
    return 0


# Exit codes of `show` and `recall` (0: printed); 2 is argparse's for a wrong command line.
NO_MATCH, STORE_UNAVAILABLE, NO_MEMORY = 1, 3, 4


def _fail(code: int, message: str) -> int:
    print(f"flink-memory: {message}", file=sys.stderr)
    return code


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def read_memory(args: argparse.Namespace) -> int:
    """`show` and `recall`: read the live-memory store; a missing store or agent is a message, not a traceback."""
    from flink_memory.store import StoreError, open_store
    from flink_memory.store.core import describe, recall_table, tree_lines, walk_tree

    try:
        store = open_store(args.store)
    except StoreError as exc:
        return _fail(STORE_UNAVAILABLE, str(exc))
    with store:
        if args.agent not in store.agents():
            return _fail(NO_MEMORY, f"agent {args.agent!r} has no memory in {store.location}")
        current = store.current(args.agent)
        forgotten = None
        if current is not None and current.item_count == 0:
            forgotten = f"agent {args.agent!r} has an empty memory ({current.node_id}: forgotten)"
        if args.command == "recall":  # (after a forget, new input may be in batch nodes before the next global)
            hits = store.recall(args.agent, args.query, k=args.k)
            if not hits and forgotten:
                return _fail(NO_MEMORY, forgotten)
            if not hits:
                return _fail(NO_MATCH, f"nothing in the memory of {args.agent!r} matches {args.query!r}")
            print("\n".join(h.model_dump_json() for h in hits) if args.json else "\n".join(recall_table(hits)))
            return 0
        if current is None:
            return _fail(NO_MEMORY, f"agent {args.agent!r} has no global summary yet "
                                    f"({len(store.nodes(args.agent))} live nodes; try recall)")
        if forgotten:
            return _fail(NO_MEMORY, forgotten)
        tree = walk_tree(current, lambda n: store.children(args.agent, n.node_id)) if args.tree else [(0, current, 0)]
        if args.json:
            print("\n".join(node.model_dump_json() for _, node, _ in tree))
        elif args.tree:
            print("\n".join(tree_lines(tree)))
        else:
            print(f"{args.agent}: {describe(current)}")
            print(current.text)
    return 0


def show_config(args: argparse.Namespace) -> int:
    from flink_memory.chunking.planner import chunking_fingerprint
    from flink_memory.summarize.prompts import summarization_fingerprint

    config = load_config(args.config, args.overrides)
    budgets.check(config)  # (what `run` would refuse, refused here too)
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    print(f"chunking fingerprint      {chunking_fingerprint(config)}")
    print(f"summarization fingerprint {summarization_fingerprint(config)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("FLINK_MEMORY_LOG", "WARNING"))
    parser = argparse.ArgumentParser(prog="flink-memory", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the job on a local MiniCluster")
    add_job_arguments(run)
    run.set_defaults(handler=run_job)
    serve = commands.add_parser("serve-llm", help="serve the embedded model over the OpenAI API (by default "
                                "with the configuration's llm.context_window and llm.embedded_* settings)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 inside a container)")
    serve.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    serve.add_argument("--model", help="a GGUF file (default: llm.embedded_model_path, else the bundled SmolLM2)")
    serve.add_argument("--context-window", type=_positive, help="default: llm.context_window")
    serve.add_argument("--threads", type=_positive, help="default: llm.embedded_threads")
    serve.add_argument("--parallel", type=_positive, help="default: llm.embedded_parallel")
    serve.add_argument("--config")
    serve.add_argument("--set", dest="overrides", action="append", default=[])
    serve.set_defaults(handler=serve_llm)
    show_memory = commands.add_parser("show", help="print an agent's current memory (its live global summary)")
    show_memory.add_argument("agent")
    show_memory.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    show_memory.add_argument("--json", action="store_true", help="the node as a summaries/ JSON line")
    show_memory.add_argument("--tree", action="store_true", help="the live tree below it (with --json: one line each)")
    show_memory.set_defaults(handler=read_memory)
    recall = commands.add_parser("recall", help="the agent's live summary nodes that best match a question")
    recall.add_argument("agent")
    recall.add_argument("query", help="a question or keywords, in plain language")
    recall.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    recall.add_argument("--k", type=_positive, default=5, help="how many nodes (default 5)")
    recall.add_argument("--json", action="store_true",
                        help="JSON lines: node_id, kind, level, text, score, first_ts, last_ts")
    recall.set_defaults(handler=read_memory)
    show = commands.add_parser("config", help="print the effective configuration and its fingerprints")
    show.add_argument("--config")
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.set_defaults(handler=show_config)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"flink-memory: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
