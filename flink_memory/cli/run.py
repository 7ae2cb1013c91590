"""`flink-memory run` (the job on a local MiniCluster, with its progress line and report) and `flink-memory
serve-llm` (the embedded model over the OpenAI API). PyFlink, the LLM client and the model server are imported
inside the commands, so the other commands start without them."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flink_memory.cli.args import job_config
from flink_memory.cli.progress import ProgressLine, count_lines
from flink_memory.cli.report import ask, featured_agent, report, vectors_line
from flink_memory.config import load_config
from flink_memory.history import read_descriptor
from flink_memory.outputs import read_outputs

CANCEL_WAIT_S = 60.0  # how long a stop waits for the cancelled job's tasks to end


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PORT_TRIES = 5


def start_on_free_port(start: Any, tries: int = PORT_TRIES) -> tuple[Any, int]:
    """`start(port)` with a port that was free a moment ago; another process may take it before Flink binds it
    (Flink's REST endpoint then fails with a BindException): try another, up to `tries` times."""
    for attempt in range(tries):
        port = _free_port()
        try:
            return start(port), port
        except Exception as exc:
            if attempt + 1 == tries or not ("BindException" in str(exc) or "rest endpoint" in str(exc)):
                raise
            print(f"[flink-memory] port {port} was taken before Flink bound it; trying another", file=sys.stderr)
    raise AssertionError("unreachable")


def _quiet_shutdown(hook: Any = threading.excepthook) -> None:
    """Hide PyFlink's process-mode shutdown noise: the Beam data-plane thread of the local Python worker
    reports its gRPC stream cancelled ("Multiplexer hanging up") when the job ends. Other errors still show."""

    def excepthook(args: Any) -> None:
        if "Multiplexer hanging up" in str(args.exc_value) or "StatusCode.CANCELLED" in str(args.exc_value):
            return
        hook(args)

    threading.excepthook = excepthook


def wait_or_cancel(client: Any, poll_s: float = 0.2) -> bool:
    """Wait for the job to end; on SIGINT or SIGTERM cancel it and wait for the cancellation instead (a
    followed directory or a Kafka topic never ends: this is how such a run stops cleanly). True: cancelled.
    A second signal while cancelling has its default effect (the process ends at once)."""
    requested = threading.Event()
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda *_: requested.set()) for s in handled}
    try:
        result = client.get_job_execution_result()
        while not result.done():
            if requested.wait(poll_s):
                for s, handler in previous.items():
                    signal.signal(s, handler)
                print("[flink-memory] stopping: cancelling the job", file=sys.stderr)
                client.cancel().result()
                deadline = time.monotonic() + CANCEL_WAIT_S
                while not result.done() and time.monotonic() < deadline:  # its tasks have ended
                    time.sleep(poll_s)
                return True
        result.result()  # raises if the job failed
        return False
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Applier:
    """The store applier on a thread beside a local job (flink_memory.store.applier): the store follows what
    the job commits, and `stop` applies the last commits once the job has ended."""

    def __init__(self, store_url: str, output: str, config: Any) -> None:
        from flink_memory.embeddings import embedder_for
        from flink_memory.store import open_store
        from flink_memory.store.applier import LogApplier
        from flink_memory.store.log_location import LogLocation

        embedder = embedder_for(config.embeddings) if config.embeddings.provider != "none" else None
        self.store = open_store(store_url, create=True, embedder=embedder)
        self.applier = LogApplier(self.store, LogLocation(output), keep_applied_s=config.store.log_keep_applied_s,
                                  retention_s=config.store.log_retention_s)
        self.warn_after_s = config.store.applier_warn_after_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="flink-memory-applier", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            self.applier.follow(self._stop)
        except BaseException as exc:  # noqa: BLE001 - reported by stop(), after the job
            self.error = exc

    def note(self) -> str | None:
        """The progress line's word on the store's lag (once a commit has waited store.applier_warn_after_s)."""
        from flink_memory.store.lag import lag_note

        return lag_note(self.applier.lag, time.time(), self.warn_after_s)

    def stop(self) -> BaseException | None:
        """Apply the last commits and stop; what failed (the committed output is whole either way)."""
        self._stop.set()
        self._thread.join()
        self.store.close()
        return self.error


def end_local_jvm(grace_s: float = 10.0) -> float:
    """End this process's PyFlink JVM (the gateway that runs local jobs: a child of this process) and return
    how long that took. What lives in it ends with it: a cancelled job's Python workers keep their HTTP
    connections to an in-process model server (xllamacpp), whose destructor would wait for them for ever.
    SIGTERM first (Flink's shutdown hooks), SIGKILL after `grace_s`. Call it once the job's work is committed."""
    import os

    from pyflink.java_gateway import get_gateway

    started = time.monotonic()
    gateway = get_gateway()
    pid = int(gateway.jvm.java.lang.ProcessHandle.current().pid())
    gateway.shutdown()  # (no more calls: the Python objects of Java ones are not released one by one)
    os.kill(pid, signal.SIGTERM)
    deadline = started + grace_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return time.monotonic() - started
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return time.monotonic() - started


def run_job(args: argparse.Namespace) -> int:
    """`run`: the job on a local MiniCluster until its input ends (or for ever with --follow), then the report."""
    from flink_memory.flink.pipeline import build_job
    from flink_memory.llm.chat_client import resolve_api_key
    from flink_memory.llm.llamacpp import start_local_model

    _quiet_shutdown()
    config = job_config(args)
    if config.llm.api_key_file:  # local workers read the same file: refuse now, not after every restart
        resolve_api_key(config.llm)
    server = start_local_model(config)
    if server is not None:
        print(f"[flink-memory] embedded model {server.model_path.name} on {server.base_url}", file=sys.stderr)
    Path(args.output).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def start(port: int) -> Any:
        env = build_job(config, args.input, args.output, follow=args.follow, restore=args.restore, rest_port=port)
        return env.execute_async("flink-memory")

    try:
        client, port = start_on_free_port(start)
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
    store = config.store.location(args.output)
    applier = Applier(store, args.output, config) if store else None
    progress = ProgressLine(port, job_id, total=None if args.follow else count_lines(args.input),
                            concurrency=config.llm.max_concurrency, every_s=args.progress_every,
                            note=applier.note if applier is not None else None).start()
    failed = None
    try:
        stopped = wait_or_cancel(client)
    finally:
        progress.stop()
        if applier is not None and (failed := applier.stop()) is not None:
            print(f"flink-memory: the store did not take the last commits ({failed}); the committed output is "
                  f"whole: apply it with `flink-memory apply --output {args.output}`", file=sys.stderr)
    if stopped:
        print("[flink-memory] stopped: the job was cancelled (restore its last checkpoint with --restore)",
              file=sys.stderr)
    print(report(args.output, time.monotonic() - started))
    if store:
        print(f"  live memory             : {store} (read it: flink-memory show|recall AGENT --store {store})")
        if config.embeddings.provider != "none":
            print(vectors_line(store))
        agent = featured_agent(read_outputs(args.output)["summaries"]) if args.ask else None
        if agent is not None:
            print("\n".join(ask(store, agent, args.ask, config.embeddings)))
    return 1 if failed is not None else 0


def apply_log(args: argparse.Namespace) -> int:
    """`apply`: write the store from the memory log a job committed under --output (once, or --follow). A
    location that cannot be read (an unknown scheme, a missing bucket, refused credentials) ends it at once
    with the reason; so does a single apply where no log is."""
    from flink_memory.embeddings import embedder_for
    from flink_memory.store import open_store
    from flink_memory.store.applier import LogApplier
    from flink_memory.store.log_location import LocationError, LogLocation

    config = load_config(args.config, args.overrides)
    try:
        location = LogLocation(args.output)
        found = location.check()
        descriptor = read_descriptor(args.output)
    except LocationError as exc:
        print(f"flink-memory: {exc}", file=sys.stderr)
        return 2
    if descriptor is None:  # (a job of a release before flink-memory.json: the flags say it all)
        url = args.store or config.store.location(args.output)
    else:
        url, config = follow_descriptor(descriptor, args, config)
    if url is None:
        print("flink-memory: the store is off (store.enabled: false)", file=sys.stderr)
        return 2
    if not found and not args.follow:
        print(f"flink-memory: no memory log at {location.uri}: has a job written to --output {args.output}? "
              "(--follow waits for it)", file=sys.stderr)
        return 2
    embedder = embedder_for(config.embeddings) if config.embeddings.provider != "none" else None
    with open_store(url, create=True, embedder=embedder) as store:
        applier = LogApplier(store, location, keep_applied_s=config.store.log_keep_applied_s,
                             retention_s=config.store.log_retention_s)
        if not args.follow:
            print(f"applied {applier.poll()} log entries to {store.location}")
            return 0
        stop = threading.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: stop.set())
        print(f"[flink-memory] applying {location.uri} to {store.location} until stopped"
              + ("" if found else " (nothing there yet: waiting for the job)"), file=sys.stderr)
        applier.follow(stop, args.every)
    return 0


def follow_descriptor(descriptor: Any, args: argparse.Namespace, config: Any) -> tuple[str | None, Any]:
    """The store and the embeddings the job at --output writes (its flink-memory.json): a --store, --config or
    --set that names another is an error, never a second store. A password left out of the descriptor comes
    from --store, store.url, or PostgreSQL's own PGPASSWORD / ~/.pgpass."""
    from flink_memory.databases import redact_url
    from flink_memory.history import LOG_FORMAT, HistoryError, embeddings_name

    where = f"{args.output.rstrip('/')}/flink-memory.json"
    if descriptor.log_format > LOG_FORMAT:
        raise HistoryError(f"{where}: log format {descriptor.log_format} is newer than this release reads "
                           f"({LOG_FORMAT}): upgrade flink-memory")
    if descriptor.store is None:
        return None, config
    given = args.store or config.store.url
    if given is not None and not _same_store(given, descriptor.store):
        raise HistoryError(f"the job at {args.output} writes its memory to {descriptor.store}, not "
                           f"{redact_url(given)}: apply its output to its own store (leave out --store)")
    url = given if given is not None else descriptor.store.replace(":***@", "@")
    named = embeddings_name(config.embeddings.provider, config.embeddings.model)
    if (args.config or any(o.startswith("embeddings.") for o in args.overrides)) and named != descriptor.embeddings:
        raise HistoryError(f"the job at {args.output} embeds with {descriptor.embeddings}, not {named}: leave out "
                           "the embeddings settings (they come from its flink-memory.json)")
    provider, _, model = descriptor.embeddings.partition(":")
    embeddings = config.embeddings.model_copy(update={"provider": provider,
                                                      "model": None if model in ("", "default") else model})
    return url, config.model_copy(update={"embeddings": embeddings})


def _same_store(given: str, recorded: str) -> bool:
    from flink_memory.databases import is_postgres, redact_url, sqlite_path

    if is_postgres(given):
        return redact_url(given) == recorded or given == recorded.replace(":***@", "@")
    return str(sqlite_path(given).resolve()) == recorded


def serve_llm(args: argparse.Namespace) -> int:
    """`serve-llm`: the embedded model on --host:--port until Ctrl-C or SIGTERM."""
    from flink_memory.llm.llamacpp import EmbeddedServer

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
