"""The MCP tools through the official SDK's client: over streamable HTTP at /mcp (with a key) and over stdio
(`flink-memory serve --stdio`): recall, show_memory, remember, forget_memory, each agent only its own."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from servicekit import serving, write_store
from test_service_keys import new_key

from flink_memory.records import DeadLetter, parse_line
from flink_memory.service.server import ServeOptions

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"recall", "show_memory", "remember", "forget_memory"}


def written(inbox: Path) -> list[dict]:
    out = []
    for path in sorted(inbox.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        parsed = parse_line(path.read_text())
        assert not isinstance(parsed, DeadLetter), parsed.reason
        out.append(json.loads(path.read_text()))
    return out


async def exercise(client: Client, agent: str | None) -> dict[str, object]:
    """Every tool once; `agent`: the agent_id to pass (None: the caller's default agent)."""
    named = {"agent_id": agent} if agent else {}
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    out: dict[str, object] = {}
    for name, arguments in [("recall", {"question": "What did Alice pay for the boat?", "k": 3}),
                            ("show_memory", {}),
                            ("remember", {"text": "Alice moved to Lisbon.", "id": "move-1"}),
                            ("forget_memory", {"id": "alice-0"}),
                            ("forget_memory", {})]:
        result = await client.call_tool(name, {**arguments, **named})
        assert not result.is_error, result.content
        out[f"{name}{len(out)}"] = result.structured_content
    return out


def check(answers: dict[str, object], inbox: Path) -> None:
    recall, memory, remember, delete, forget = answers.values()
    assert any(h["text"] == "Alice paid 300 EUR for the boat." for h in recall["hits"])
    assert memory["memory"]["node_id"] == "alice-g1"
    assert remember["id"] == "move-1" and remember["kind"] == "item"
    assert delete["kind"] == "deletion" and forget["kind"] == "forget"
    assert written(inbox) == [{"agent_id": "alice", "text": "Alice moved to Lisbon.", "id": "move-1"},
                              {"agent_id": "alice", "id": "alice-0", "deleted": True},
                              {"agent_id": "alice", "forget": True}]


@pytest.fixture
def setup(tmp_path):
    inbox = tmp_path / "input"
    inbox.mkdir()
    return write_store(tmp_path / "memory.sqlite"), inbox


def keyed_client(url: str, key: str | None) -> Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30)))


def test_the_tools_over_streamable_http_for_the_keys_agent(setup, tmp_path, capsys):
    store, inbox = setup
    keys = tmp_path / "keys.json"
    alice = new_key(capsys, keys, "alice")

    async def session(url: str) -> None:
        async with keyed_client(url, alice) as client:
            check(await exercise(client, None), inbox)  # the key names one agent: the tools' default
            for agent in ("bob", "ghost"):  # another agent, existing or not: not the key's, whichever it is
                for name, arguments in [("recall", {"question": "key"}), ("show_memory", {}),
                                        ("remember", {"text": "x"}), ("forget_memory", {})]:
                    result = await client.call_tool(name, {**arguments, "agent_id": agent})
                    assert result.is_error
                    assert result.content[0].text.endswith(f"agent '{agent}' is not among this key's agents")
            bad = await client.call_tool("recall", {"question": "x" * 2001})
            assert bad.is_error
            dead = await client.call_tool("remember", {"text": "x", "ts": "yesterday"})
            assert dead.is_error and "RFC 3339" in dead.content[0].text
        with pytest.raises(Exception):  # noqa: B017 (no key: the Guard answers 401 before MCP)
            async with keyed_client(url, None) as client:
                await client.list_tools()

    with serving(ServeOptions(store=store, input=str(inbox), keys=str(keys))) as url:
        asyncio.run(session(url))
    assert len(written(inbox)) == 3


def test_the_tools_over_stdio(setup):
    store, inbox = setup
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "flink_memory.cli", "serve", "--stdio", "--store", store, "--input", str(inbox), "--agent",
              "alice", "--set", "embeddings.provider=none"],
        env={**os.environ, "PYTHONPATH": str(ROOT)})

    async def session() -> None:
        async with Client(params) as client:
            check(await exercise(client, None), inbox)
            result = await client.call_tool("show_memory", {"agent_id": "bob"})
            assert result.is_error and "agent 'bob' is not among this session's agents" in result.content[0].text

    asyncio.run(session())
