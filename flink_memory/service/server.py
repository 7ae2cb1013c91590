"""The `flink-memory serve` process: the API and MCP over HTTP (uvicorn), or the MCP tools over stdio.

Without a keys file the server answers everyone, so it refuses to listen anywhere but loopback. Slow clients
are cut off: a connection that has not sent a complete request head within HEAD_TIMEOUT_S is closed, a body
must arrive within BODY_TIMEOUT_S (408, flink_memory.service.guard), idle keep-alive connections close after
KEEP_ALIVE_S, and at most MAX_CONNECTIONS are served at once (503 beyond).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from flink_memory.service.http import create_app
from flink_memory.service.keys import KeyRing
from flink_memory.service.memory import MemoryService, OneAgent
from flink_memory.service.tools import build_mcp
from flink_memory.service.writer import open_writer
from flink_memory.store.diversity import DIVERSITY

HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 512


class ServeError(ValueError):
    """A server that must not start (the message says why)."""


@dataclass
class ServeOptions:
    store: str
    host: str = "127.0.0.1"
    port: int = 8765
    keys: str | None = None
    input: str | None = None
    read_only: bool = False
    agent: str | None = None  # stdio: the one agent the tools serve
    threads: int | None = None  # reads at once (store connections); None: the cores + 1
    diversity: float = DIVERSITY  # recall's default weight of distinct results (recall.diversity)
    workers: int = 1  # HTTP: processes accepting on one socket
    applier_warn_after_s: float = 120.0  # health is degraded once a commit waits this long (store.*)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TimedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that sends no complete request head in time (uvicorn
    itself times out only idle keep-alive connections, not a client that trickles its headers)."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        waiting_after = self.cycle

        def expire() -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

        self.loop.call_later(self.head_timeout_s, expire)


def one_blas_thread() -> None:
    """Numpy's BLAS on one thread in this process, unless set otherwise; call it before numpy loads. The
    server runs recalls side by side, one per core already; a BLAS thread pool on top of them spins on a
    core for a while after each vector product (a hybrid recall of 100 000 vectors: 152 ms of CPU with
    two BLAS threads, 85 ms with one)."""
    for setting in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(setting, "1")


def build_service(options: ServeOptions, embedder: Any = None) -> tuple[MemoryService, KeyRing | None]:
    if options.keys is None and options.host and not is_loopback(options.host):
        raise ServeError(f"--host {options.host}: without --keys the server answers every caller, so it listens "
                         "on loopback only (127.0.0.1, ::1); make keys with `flink-memory keys add`")
    keyring = KeyRing(options.keys) if options.keys else None
    writer = None if options.read_only else open_writer(options.input)
    return (MemoryService(options.store, writer, embedder=embedder, read_only=options.read_only,
                          threads=options.threads, diversity=options.diversity,
                          applier_warn_after_s=options.applier_warn_after_s), keyring)


def http_app(service: MemoryService, keyring: KeyRing | None, host: str, body_timeout_s: float = BODY_TIMEOUT_S
             ) -> Any:
    """The API and MCP (stateless streamable HTTP: every request carries its key) behind the Guard."""
    mcp = build_mcp(service)
    mcp_app = mcp.streamable_http_app(stateless_http=True, json_response=True, host=host)
    return create_app(service, keyring, mcp_app=mcp_app, body_timeout_s=body_timeout_s)


def uvicorn_config(app: Any, host: str, port: int, sock: socket.socket | None = None) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, http=TimedH11Protocol, lifespan="on", access_log=False,
                          log_level="warning", timeout_keep_alive=KEEP_ALIVE_S, limit_concurrency=MAX_CONNECTIONS,
                          h11_max_incomplete_event_size=64 * 1024, server_header=False)


def serve_http(options: ServeOptions, embedder: Any = None) -> None:
    """Serve until interrupted. With `workers` above 1 the listening socket is bound here and the other
    workers are forked before anything opens the store: each process has its own connections and caches, and
    the kernel hands each connection to one of them. A worker stops when this process does."""
    log = logging.getLogger("flink_memory.service")
    sock = None
    children: list[int] = []
    if options.workers > 1:
        # (IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections of such a socket; without it an
        # answer in two writes waits for the client's delayed ACK, about 40 ms)
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((options.host, options.port))
        sock.listen(2048)
        sock.set_inheritable(True)
        parent = os.getpid()
        for _ in range(options.workers - 1):
            pid = os.fork()
            if pid == 0:  # a worker: serves on the shared socket while its parent lives
                _serve_on(options, embedder, sock, parent)
                os._exit(0)
            children.append(pid)
    log.info("serving on %s:%s (%d worker%s)", options.host, sock.getsockname()[1] if sock else options.port,
             options.workers, "s" if options.workers > 1 else "")
    try:
        _serve_on(options, embedder, sock, None)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _serve_on(options: ServeOptions, embedder: Any, sock: socket.socket | None, parent: int | None) -> None:
    service, keyring = build_service(options, embedder)
    config = uvicorn_config(http_app(service, keyring, options.host), options.host, options.port)
    server = uvicorn.Server(config)
    if parent is not None:  # (a worker whose parent died, even by SIGKILL, stops too)
        def watch() -> None:
            while os.getppid() == parent and not server.should_exit:
                time.sleep(1.0)
            server.should_exit = True

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    server.run(sockets=[sock] if sock is not None else None)


def serve_stdio(options: ServeOptions, embedder: Any = None) -> None:
    """The MCP tools over stdin/stdout, for a local assistant that starts this process."""
    service, _ = build_service(ServeOptions(store=options.store, input=options.input, read_only=options.read_only),
                               embedder)
    grant = OneAgent(options.agent) if options.agent else None
    try:
        build_mcp(service, stdio_grant=grant).run("stdio")
    finally:
        service.close()
