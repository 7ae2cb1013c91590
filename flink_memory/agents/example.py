"""A Flink Agents agent that needs no LLM: its actions decide, by fixed rules, what of a user's turns to
remember and when to recall (the sample, jobs/agents_memory.py and the tests run it). The rules are plain
Python (`decide`); the agent class is the thin shell, in a module (Flink Agents cannot load agents from
`__main__`).

A turn is `{"agent_id", "id", "text", "ts"?}`. A question (it ends with "?") is answered from the agent's
memory; a statement of at least MIN_WORDS words that is not small talk is remembered; anything else is let go.
Remembered turns go to the memory job: through the job's input when the vector store has one (`input=`), else
as the agent's output, a record for `to_datastream()` to hand to flink-memory's operators in the same job.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.resource import ResourceDescriptor, ResourceType
from flink_agents.api.runner_context import RunnerContext
from pydantic import BaseModel, ConfigDict

from flink_memory.agents.actions import VECTOR_STORE, memory_store, recall, remember
from flink_memory.agents.core import memory_record
from flink_memory.agents.vector_store import FlinkMemoryVectorStore

MIN_WORDS = 4
SMALL_TALK = ("hi", "hello", "hey", "thanks", "thank you", "ok", "okay", "bye", "good morning", "good night")


class Turn(BaseModel):
    """One turn of a user talking to the agent."""

    model_config = ConfigDict(extra="forbid")

    agent_id: str
    id: str
    text: str
    ts: str | None = None


def decide(text: str) -> Literal["recall", "remember", "skip"]:
    """What the agent does with a turn: recall for a question, remember a fact, skip small talk."""
    words = text.strip().rstrip(".!").lower()
    if text.strip().endswith("?"):
        return "recall"
    if words.startswith(SMALL_TALK) and len(words.split()) < MIN_WORDS + 2 or len(words.split()) < MIN_WORDS:
        return "skip"
    return "remember"


def outcome(turn: Turn, decision: str, **fields: Any) -> dict[str, Any]:
    return {"agent_id": turn.agent_id, "turn": turn.id, "decision": decision, **fields}


def memory_vector_store(store: str, input: str | None = None, *, config: str | None = None,
                        settings: list[str] | None = None, mode: str = "hybrid") -> ResourceDescriptor:
    """The FlinkMemoryVectorStore resource the actions use (named VECTOR_STORE)."""
    return ResourceDescriptor(clazz=FlinkMemoryVectorStore.CLASS_PATH, store=store, input=input, config=config,
                              settings=list(settings or []), mode=mode)


def remember_or_recall(event: Event, ctx: RunnerContext) -> None:
    """The action: recall for a question, remember a fact, let small talk go; one output per turn acted on.
    (A function, so other agents declare it as their own action: Flink Agents refuses inherited actions.)"""
    value = InputEvent.from_event(event).input
    try:
        turn = Turn.model_validate(json.loads(value) if isinstance(value, (str, bytes)) else value)
    except ValueError as exc:  # (a bad turn is answered, never fatal: the job would restart on it forever)
        ctx.send_event(OutputEvent(output={"decision": "invalid", "reason": str(exc).splitlines()[0]}))
        return
    decision = decide(turn.text)
    if decision == "recall":
        hits = recall(ctx, turn.agent_id, turn.text, k=3)
        ctx.send_event(OutputEvent(output=outcome(turn, decision, question=turn.text, recalled=[
            {"id": d.id, "kind": d.metadata.get("kind"), "text": d.content} for d in hits])))
    elif decision == "remember":
        fields = {"id": turn.id, "ts": turn.ts, "metadata": {"source": "remembering-agent"}}
        if memory_store(ctx).input is not None:
            remember(ctx, turn.agent_id, turn.text, **fields)
            ctx.send_event(OutputEvent(output=outcome(turn, decision, written=True)))
        else:
            record = json.loads(memory_record(turn.agent_id, turn.text, **fields))
            ctx.send_event(OutputEvent(output=outcome(turn, decision, record=record)))


class RememberingAgent(Agent):
    """Remembers the facts a user states, recalls them when asked, through flink-memory."""

    def __init__(self, store: str, input: str | None = None, *, config: str | None = None,
                 settings: list[str] | None = None, mode: str = "hybrid") -> None:
        super().__init__()
        self.add_resource(VECTOR_STORE, ResourceType.VECTOR_STORE,
                          memory_vector_store(store, input, config=config, settings=settings, mode=mode))

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def on_turn(event: Event, ctx: RunnerContext) -> None:
        remember_or_recall(event, ctx)


def memory_records(output: Any) -> list[dict[str, Any]]:
    """The memory records among the agent's outputs (a flat_map for `to_datastream()`)."""
    if isinstance(output, dict) and isinstance(output.get("record"), dict):
        return [output["record"]]
    return []
