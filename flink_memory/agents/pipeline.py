"""One DataStream job, both sides: a Flink Agents agent applied to a keyed stream of turns
(`AgentsExecutionEnvironment.from_datastream(...).apply(agent).to_datastream()`), and the memory records it
decides on handed, keyed by agent, to flink-memory's operators in the same job (add_memory_operators), whose
store the agent recalls from. Needs the flink-agents jars (docs/flink-agents.md#the-jars)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from flink_agents.api.agents.agent import Agent
from flink_agents.api.execution_environment import AgentsExecutionEnvironment
from pyflink.common import Types
from pyflink.datastream import DataStream, StreamExecutionEnvironment

from flink_memory.agents.example import memory_records
from flink_memory.config import Config
from flink_memory.flink.pipeline import MemoryStreams, add_file_sinks, add_memory_operators
from flink_memory.flink.store_sink import add_store_sink

TURNS_UID = "flink-memory-agent-turns"
OUTCOMES_UID = "flink-memory-agent-outcomes"
RECORDS_UID = "flink-memory-agent-records"


class AgentMemoryStreams(NamedTuple):
    outcomes: DataStream  # what the agent did with each turn, as JSON strings
    memory: MemoryStreams  # flink-memory's outputs (summaries, manifests, dead letters, memory log)


def turn_value(turn: Any) -> Any:
    """A turn as a Python value: a JSON line becomes its object (what is not JSON stays the text, and the agent
    answers it as invalid). Flink Agents takes Python objects (pickled), not Java strings."""
    if isinstance(turn, (str, bytes)):
        try:
            return json.loads(turn)
        except ValueError:
            return turn
    return turn


def turn_agent(turn: Any) -> str:
    """The key of a turn (a JSON string or a dict): its agent_id; a turn without one is keyed "" (the agent
    answers it as invalid rather than failing the job)."""
    try:
        data = json.loads(turn) if isinstance(turn, (str, bytes)) else turn
        agent = data.get("agent_id") if isinstance(data, dict) else None
    except ValueError:
        agent = None
    return agent if isinstance(agent, str) else ""


def add_agent_memory(env: StreamExecutionEnvironment, turns: DataStream, agent: Agent, config: Config,
                     output_dir: str, *, store_url: str | None = None) -> AgentMemoryStreams:
    """The agent over `turns`, keyed by agent; its memory records into flink-memory's operators (unbounded:
    Flink Agents runs on unbounded sources), the files of `output_dir` and the store (`store_url`, default
    config.store.location(output_dir))."""
    agents_env = AgentsExecutionEnvironment.get_execution_environment(env=env)
    values = turns.map(turn_value).name("agent-turns").uid(TURNS_UID)  # (no output type: Python objects)
    outputs = agents_env.from_datastream(values, key_selector=turn_agent).apply(agent).to_datastream()
    records = outputs.flat_map(memory_records).name("agent-memory-records").uid(RECORDS_UID)
    streams = add_memory_operators(records, config, output_dir, bounded=False)
    add_file_sinks(streams, output_dir)
    url = store_url or config.store.location(output_dir)
    if url:
        add_store_sink(streams, url, config.embeddings)
    outcomes = outputs.map(lambda o: json.dumps(o, ensure_ascii=False, default=str), output_type=Types.STRING())
    return AgentMemoryStreams(outcomes.name("agent-outcomes").uid(OUTCOMES_UID), streams)
