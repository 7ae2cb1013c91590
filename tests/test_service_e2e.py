"""The memory service end to end with a running job: `flink-memory run` (unbounded: a followed directory or
a Kafka topic) writes the store, `flink-memory serve` reads it and writes the job's input. Through the HTTP
API and through the official MCP SDK's client (streamable HTTP at /mcp, and stdio: `serve --stdio`): a
remembered fact is found by recall once the job took it; deletions and a forget of the agent leave the old
text in no answer (recall, memory, memory tree, show_memory). The job is stopped as an operator would
(SIGTERM): it cancels and exits 0.

Embeddings are off (`embeddings.provider=none`, keyword recall): the embedded model would add its load time
to every run, and recall by meaning is tested elsewhere. Each test prints its write-to-recall latencies.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jobkit import cli_command, kill_group, spawn
from mcp import Client, StdioServerParameters
from scripted_server import ScriptedServer
from servicekit import call, serving
from test_service_keys import new_key
from test_service_mcp import ROOT, keyed_client

from flink_memory.service.server import ServeOptions

pytestmark = pytest.mark.slow

AGENT = "alice"
BOAT = "Alice bought the sailing boat Zorbatin for 4711 EUR."  # through HTTP, then deleted through HTTP
CAT = "Alice's cat Quixby sleeps on the piano."  # through MCP, then deleted through MCP
DENTIST = "Alice sees the dentist Dr Molnar every March."  # through HTTP; stays until the agent is forgotten
LOCKER = "Alice's locker code at the Fitzwell gym is 9182."  # through MCP over stdio; stays until the forget
# (deletions and a forget reach the store with the checkpoint after them: 2 s here, 10 s by default)
SETTINGS = ("embeddings.provider=none", "batching.max_items=50", "batching.flush_after_s=1",
            "summarization.global_refresh_s=1", "checkpointing.interval_s=2")
LATENCY_BOUND_S = 15.0  # "seconds" (docs/service.md): the directory is listed every 1 s, a topic read at once


@contextmanager
def running_job(input_path: str, output: Path, llm: ScriptedServer, *settings: str, follow: bool
                ) -> Iterator[subprocess.Popen]:
    """`flink-memory run` in its own process group; stopped with SIGTERM, which must cancel the job."""
    log = output.parent / "job.log"
    command = cli_command(input_path, output, llm, None, *SETTINGS, *settings,  # type: ignore[arg-type]
                          args=("--follow",) if follow else ())
    process = spawn(command, log)
    try:
        yield process
    except BaseException:
        kill_group(process)
        raise
    started = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    try:
        code = process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise AssertionError(f"the job did not stop within 90 s of SIGTERM:\n{log.read_text()[-3000:]}") from None
    print(f"job stopped {time.monotonic() - started:.1f} s after SIGTERM")
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "stopped: the job was cancelled" in text
    deadline = time.monotonic() + 30
    while group_alive(process.pid):  # the MiniCluster's JVM ends with the command (its gateway's stdin closes)
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError("the job's JVM outlived `flink-memory run` by 30 s")
        time.sleep(0.2)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 60.0) -> Any:
    """Poll `check` until it returns a true value; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout_s:.0f} s: {what}")
        await asyncio.sleep(0.1)


class Agent:
    """One agent's memory through three doors: HTTP (urllib, in a thread), the MCP SDK's client over
    streamable HTTP with the agent's key (`mcp`) and over stdio (`stdio`: `serve --stdio --agent`)."""

    def __init__(self, url: str, key: str, mcp: Any, stdio: Any) -> None:
        self.url, self.key, self.mcp, self.stdio = url, key, mcp, stdio

    async def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await asyncio.to_thread(call, f"{self.url}/v1/agents/{AGENT}{path}", method, body, self.key)

    @staticmethod
    async def tool(client: Any, name: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result.content
        return result.structured_content

    async def recall_http(self, question: str) -> list[dict[str, Any]]:
        status, answer = await self.http("POST", "/recall", {"question": question, "k": 10})
        assert status in (200, 404, 503), (status, answer)  # 404/503: no memory (or no store) yet
        return answer["hits"] if status == 200 else []

    @staticmethod
    async def recall_mcp(client: Any, question: str) -> list[dict[str, Any]]:
        result = await client.call_tool("recall", {"question": question, "k": 10})
        return [] if result.is_error else result.structured_content["hits"]

    async def answers(self, questions: list[str]) -> list[Any]:
        """Every read answer: recall through each door for each question, the memory and its tree (HTTP),
        show_memory (both MCP transports)."""
        out: list[Any] = []
        for question in questions:
            out += [await self.recall_http(question), await self.recall_mcp(self.mcp, question),
                    await self.recall_mcp(self.stdio, question)]
        out.append(await self.http("GET", "/memory"))
        out.append(await self.http("GET", "/memory?tree=true"))
        for client in (self.mcp, self.stdio):
            out.append((await client.call_tool("show_memory", {})).content)
        return out

    async def tree(self) -> dict[str, Any] | None:
        status, answer = await self.http("GET", "/memory?tree=true")
        return answer if status == 200 else None


def found(hits: list[dict[str, Any]], text: str) -> bool:
    return any(h["kind"] == "unit" and h["text"] == text for h in hits)


def mentions(answers: list[Any], *words: str) -> list[str]:
    dumped = json.dumps(answers, default=str)
    return [w for w in words if w in dumped]


def stdio_server(store: str, input_path: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "flink_memory.cli", "serve", "--stdio", "--store", store, "--input", input_path, "--agent",
              AGENT, "--set", "embeddings.provider=none"],
        env={**os.environ, "PYTHONPATH": str(ROOT)})


async def scenario(url: str, key: str, stdio: StdioServerParameters, forget_through: str, job_log: Path
                   ) -> dict[str, float]:
    """Remember through HTTP and both MCP transports, recall, delete through HTTP and MCP, forget through
    `forget_through` (http: DELETE /v1/agents/{id}; stdio: the forget_memory tool); the latencies."""
    latency: dict[str, float] = {}
    async with keyed_client(url, key) as mcp, Client(stdio) as local:
        agent = Agent(url, key, mcp, local)

        async def health() -> bool:
            return (await asyncio.to_thread(call, f"{url}/v1/health"))[1]["store"] == "ok"

        await until(health, "the job created the store", 120)

        async def job_running() -> bool:  # (the store is made as the job is built, before its JVM runs it)
            return "running (web UI" in job_log.read_text(errors="replace") if job_log.exists() else False

        await until(job_running, "the job runs", 120)

        posted = time.monotonic()
        status, accepted = await agent.http("POST", "/memories", {"id": "boat", "text": BOAT})
        assert (status, accepted["id"], accepted["kind"]) == (202, "boat", "item"), accepted

        async def boat_found() -> bool:
            return found(await agent.recall_http("Zorbatin boat"), BOAT)

        await until(boat_found, "recall (HTTP) finds the fact remembered through HTTP")
        latency["http"] = time.monotonic() - posted

        posted = time.monotonic()
        remembered = await agent.tool(mcp, "remember", text=CAT, id="cat")  # the key's agent: no agent_id
        assert (remembered["id"], remembered["kind"]) == ("cat", "item")

        async def cat_found() -> bool:
            return found(await agent.recall_mcp(mcp, "Quixby"), CAT)

        await until(cat_found, "recall (MCP, streamable HTTP) finds the fact remembered through it")
        latency["mcp"] = time.monotonic() - posted

        posted = time.monotonic()
        remembered = await agent.tool(local, "remember", text=LOCKER, id="locker")  # --agent: no agent_id
        assert (remembered["id"], remembered["kind"]) == ("locker", "item")

        async def locker_found() -> bool:
            return found(await agent.recall_mcp(local, "Fitzwell locker"), LOCKER)

        await until(locker_found, "recall (MCP, stdio) finds the fact remembered through it")
        latency["stdio"] = time.monotonic() - posted

        status, _ = await agent.http("POST", "/memories", {"id": "dentist", "text": DENTIST})
        assert status == 202

        async def summarized() -> bool:  # the global summary covers all four (units in summaries too)
            tree = await agent.tree()
            return bool(tree and tree["memory"] and tree["memory"]["item_count"] == 4
                        and "Molnar" in tree["memory"]["text"])

        await until(summarized, "the global summary covers the four facts")
        words = ["Zorbatin", "4711", "Quixby"]
        assert mentions(await agent.answers(["Zorbatin", "Quixby"]), *words) == words  # (the check sees them)

        posted = time.monotonic()
        status, deleted = await agent.http("DELETE", "/memories/boat")
        assert (status, deleted["kind"], deleted["id"]) == (202, "deletion", "boat")
        retracted = await agent.tool(mcp, "forget_memory", id="cat")
        assert (retracted["kind"], retracted["id"]) == ("deletion", "cat")

        async def deleted_everywhere() -> bool:
            tree = await agent.tree()
            if not (tree and tree["memory"] and tree["memory"]["item_count"] == 2):
                return False
            return not mentions(await agent.answers(["Zorbatin", "4711 boat", "Quixby piano"]), *words)

        await until(deleted_everywhere, "the deleted facts are in no answer")
        latency["delete"] = time.monotonic() - posted
        assert found(await agent.recall_http("Molnar"), DENTIST)  # the facts not deleted stay
        assert found(await agent.recall_mcp(mcp, "dentist"), DENTIST)
        assert found(await agent.recall_mcp(local, "9182"), LOCKER)

        posted = time.monotonic()
        if forget_through == "http":
            status, forgot = await agent.http("DELETE", "")
            assert (status, forgot["kind"]) == (202, "forget")
        else:
            forgot = await agent.tool(local, "forget_memory")
            assert forgot["kind"] == "forget"

        async def forgotten() -> bool:
            tree = await agent.tree()
            if tree is not None and tree["memory"] is not None and tree["memory"]["item_count"] != 0:
                return False
            return not mentions(await agent.answers(["Molnar dentist", "Fitzwell 9182", "Alice"]),
                                "Molnar", "dentist", "Fitzwell", "9182")

        await until(forgotten, "the forgotten agent's facts are in no answer")
        latency["forget"] = time.monotonic() - posted
    return latency


def report(latency: dict[str, float], source: str) -> None:
    print(f"{source}: write to recall-found: HTTP {latency['http']:.2f} s, MCP {latency['mcp']:.2f} s, MCP stdio "
          f"{latency['stdio']:.2f} s; deletions in no answer {latency['delete']:.2f} s; "
          f"forget {latency['forget']:.2f} s")
    assert max(latency["http"], latency["mcp"], latency["stdio"]) < LATENCY_BOUND_S, latency


def test_remember_recall_delete_forget_through_a_followed_directory(tmp_path, capsys):
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    key = new_key(capsys, tmp_path / "keys.json", AGENT)
    started = time.monotonic()
    with ScriptedServer() as llm, running_job(str(inbox), output, llm, follow=True), \
            serving(ServeOptions(store=str(output / "memory.sqlite"), input=str(inbox),
                                 keys=str(tmp_path / "keys.json"))) as url:
        latency = asyncio.run(scenario(url, key, stdio_server(str(output / "memory.sqlite"), str(inbox)), "http",
                                         tmp_path / "job.log"))
    with capsys.disabled():
        report(latency, f"followed directory (whole test {time.monotonic() - started:.0f} s)")
    assert not [p for p in inbox.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    assert len(list(inbox.iterdir())) == 7  # 4 facts, 2 deletions, 1 forget: one file each


def test_remember_recall_delete_forget_through_a_kafka_topic(tmp_path, capsys, kafka_broker):
    from kafka_broker import create_topic

    topic = f"service-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 1)
    source = f"kafka://{kafka_broker.bootstrap}/{topic}"
    output = tmp_path / "out"
    key = new_key(capsys, tmp_path / "keys.json", AGENT)
    started = time.monotonic()
    with ScriptedServer() as llm, running_job(source, output, llm, "source.kafka.starting_offsets=earliest",
                                              follow=False), \
            serving(ServeOptions(store=str(output / "memory.sqlite"), input=source,
                                 keys=str(tmp_path / "keys.json"))) as url:
        latency = asyncio.run(scenario(url, key, stdio_server(str(output / "memory.sqlite"), source), "stdio",
                                         tmp_path / "job.log"))
    with capsys.disabled():
        report(latency, f"Kafka topic (whole test {time.monotonic() - started:.0f} s)")
