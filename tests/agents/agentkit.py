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
