"""flink_memory.client (sync and async) and the sample agent loop (samples/agent_loop.py) against a served
memory, over HTTP and MCP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servicekit import serving, write_store
from test_service_keys import new_key

from flink_memory.client import AsyncMemoryClient, MemoryClient, MemoryServiceError
from flink_memory.records import DeadLetter, parse_line
from flink_memory.service.server import ServeOptions

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def served(tmp_path, capsys):
    store = write_store(tmp_path / "memory.sqlite")
    inbox = tmp_path / "input"
    inbox.mkdir()
    keys = tmp_path / "keys.json"
    key = new_key(capsys, keys, "alice")
    with serving(ServeOptions(store=store, input=str(inbox), keys=str(keys))) as url:
        yield url, key, inbox


def test_the_sync_client(served):
    url, key, inbox = served
    memory = MemoryClient(url, key=key, agent_id="alice")
    assert memory.health().status == "ok"
    assert memory.memory().memory.node_id == "alice-g1"
    assert [e.node.node_id for e in memory.memory(tree=True).tree] == ["alice-g1", "alice-b1"]
    assert memory.recall("What did Alice pay for the boat?")[0].text.startswith("Alice")
    assert memory.remember("Alice moved to Lisbon.", id="move-1", metadata={"by": "test"}).id == "move-1"
    assert memory.remember(messages=[{"role": "user", "content": "hi"}]).kind == "conversation"
    assert memory.delete("move-1").kind == "deletion"
    assert memory.forget().kind == "forget"
    with pytest.raises(MemoryServiceError) as refused:
        memory.recall("boat", agent_id="bob")
    assert refused.value.status == 404
    with pytest.raises(MemoryServiceError) as dead:
        memory.remember("x", ts="yesterday")
    assert dead.value.status == 422 and "RFC 3339" in dead.value.detail
    with pytest.raises(MemoryServiceError) as unauthorized:
        MemoryClient(url, agent_id="alice").memory()
    assert unauthorized.value.status == 401
    assert len(list(inbox.iterdir())) == 4


def test_the_async_client(served):
    url, key, _ = served

    async def run() -> None:
        memory = AsyncMemoryClient(url, key=key, agent_id="alice")
        hits, accepted = await asyncio.gather(memory.recall("boat"), memory.remember("Alice likes tea."))
        assert hits and accepted.kind == "item"
        assert (await memory.memory()).agent_id == "alice"

    asyncio.run(run())


@pytest.mark.parametrize("over", ["http", "mcp"])
def test_the_sample_agent_loop(served, over):
    url, key, inbox = served
    done = subprocess.run([sys.executable, str(ROOT / "samples" / "agent_loop.py"), "--url", url, "--agent", "alice",
                           *(["--mcp"] if over == "mcp" else [])], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FLINK_MEMORY_KEY": key, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "Alice paid 300 EUR for the boat." in done.stdout and done.stdout.count("remembered as") == 3
    lines = [p.read_text() for p in inbox.iterdir()]
    assert len(lines) == 3 and not any(isinstance(parse_line(line), DeadLetter) for line in lines)
    assert {json.loads(line)["agent_id"] for line in lines} == {"alice"}
