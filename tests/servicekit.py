"""A served memory for the service tests: a store written directly (no Flink), a server on a free loopback
port in a thread, and a small HTTP caller (urllib: real HTTP, no client library in between)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.service.server import ServeOptions, build_service, http_app, uvicorn_config
from flink_memory.store import open_store

FACTS = {"alice": ["Alice paid 300 EUR for the boat.", "Alice's dog is a beagle named Rex."],
         "bob": ["Bob keeps the spare key under the blue flowerpot."]}


def write_store(path: Path) -> str:
    """Two agents, each with units, a batch node and a global node."""
    with open_store(str(path), create=True) as store:
        for agent, facts in FACTS.items():
            units = [f"{agent}-{i}" for i in range(len(facts))]
            store.upsert_units([MemoryUnit(agent_id=agent, unit_id=u, source_id=u, text=t, ts="2026-01-01T00:00:00Z")
                                for u, t in zip(units, facts)])
            store.upsert([
                SummaryNode(agent_id=agent, node_id=f"{agent}-b1", kind="batch", level=1, children=units,
                            text=" ".join(facts), item_count=len(facts), model="m"),
                SummaryNode(agent_id=agent, node_id=f"{agent}-g1", kind="global", level=2, version=1,
                            children=[f"{agent}-b1"], text=f"Summary of {agent}: " + " ".join(facts),
                            item_count=len(facts), model="m")])
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(options: ServeOptions, *, embedder: Any = None, body_timeout_s: float = 10.0):
    """The server of `options` on a free loopback port; yields its base URL."""
    service, keyring = build_service(options, embedder)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(http_app(service, keyring, "127.0.0.1", body_timeout_s), "127.0.0.1",
                                           port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def call(url: str, method: str = "GET", body: Any = None, key: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    sent = {"content-type": "application/json", **(headers or {})}
    if key:
        sent["authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
