"""Helpers of the Flink Agents tests: a store of two agents whose facts look alike (a recall that crossed agents
would find the other's), and the local runner of flink-agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flink_memory.embeddings.static import StaticE5
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store import open_store

FACTS = {
    "alice": {"a1": "Alice's dog is a beagle named Rex.", "a2": "Alice pays 300 EUR a month for the flat in Lyon."},
    "bob": {"b1": "Bob's dog is a poodle named Max.", "b2": "Bob pays 900 EUR a month for the flat in Oslo."},
}


def write_store(path: Path) -> str:
    """Both agents' units (with vectors: recall is hybrid) and a batch node over each agent's units."""
    with open_store(str(path), create=True, embedder=StaticE5()) as store:
        for agent, facts in FACTS.items():
            store.upsert_units([MemoryUnit(agent_id=agent, unit_id=u, source_id=u, text=t, ts="2026-01-01T00:00:00Z")
                                for u, t in facts.items()])
            store.upsert([SummaryNode(agent_id=agent, node_id=f"{agent}-b1", kind="batch", level=1,
                                      children=list(facts), text=" ".join(facts.values()), item_count=len(facts),
                                      model="m")])
    return str(path)


def run_local(agent: Any, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent on flink-agents' local runner (no jars, no Flink): each turn keyed by its agent."""
    from flink_agents.api.execution_environment import AgentsExecutionEnvironment

    env = AgentsExecutionEnvironment.get_execution_environment()
    outputs = env.from_list([{"key": t["agent_id"], "value": t} for t in turns]).apply(agent).to_list()
    env.execute()
    return [value for output in outputs for value in output.values()]


def service_python() -> str:
    """The interpreter of an environment with the `service` extra (mcp 2.x), which flink-agents' pins keep out
    of this one: $FLINK_MEMORY_SERVICE_PYTHON, else the repository's .venv (`make test` makes both)."""
    import os

    named = os.environ.get("FLINK_MEMORY_SERVICE_PYTHON")
    default = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"
    python = Path(named) if named else default
    if not python.exists():
        raise RuntimeError(f"no service environment at {python}: set FLINK_MEMORY_SERVICE_PYTHON to the python "
                           "of a venv with flink-memory[service] (make test makes .venv)")
    return str(python)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    """`flink-memory serve` in the service environment, as a process; its output in `log`."""

    def __init__(self, store: str, keys: Path, inbox: Path, log: Path) -> None:
        import subprocess
        import time
        import urllib.request

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen([service_python(), "-m", "flink_memory.cli", "serve", "--store", store,
                                             "--keys", str(keys), "--input", str(inbox), "--port", str(self.port)],
                                            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/v1/health", timeout=2):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"the service did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.2)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except Exception:  # noqa: BLE001
            self.process.kill()
            self.process.wait()


def pickled_values(plan_json: str) -> list[bytes]:
    """The cloudpickled values in an agent plan (base64 strings, e.g. an MCP server's `auth`), decoded."""
    import base64
    import json

    import cloudpickle

    def strings(value: Any):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    found = []
    for text in strings(json.loads(plan_json)):
        try:
            data = base64.b64decode(text, validate=True)
            if len(text) > 40 and cloudpickle.loads(data) is not None:
                found.append(data)
        except Exception:  # noqa: BLE001 - (not a pickle)
            continue
    return found


def python_path() -> str:
    """The TaskManager's Python (thread mode) imports the tests' agent classes, and with them the test helpers:
    site-packages, the checkout, tests/ and this directory."""
    import os
    import site

    here = Path(__file__).resolve().parent
    return os.pathsep.join([*(p for p in site.getsitepackages() if os.path.isdir(p)), str(here.parents[1]),
                            str(here.parent), str(here)])
