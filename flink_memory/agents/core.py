"""The decisions of the Flink Agents integration, in plain Python (no flink_agents or PyFlink import): which
one agent a call is about, what an agent's memory record is, and what a recall hit becomes for an agent.

An agent sees only its own memory (invariant 9): every read and write names exactly one agent, the event's key
or an explicit agent id, and a call that names none, or two that differ, is refused rather than widened.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.digests import digest
from flink_memory.records import DeadLetter, parse_line
from flink_memory.service.models import MAX_K, MAX_QUESTION
from flink_memory.store import Recalled

AGENT_FIELD = "agent_id"


class AgentScopeError(ValueError):
    """A call that does not name exactly one agent, or names it badly."""


class RecordRefused(ValueError):
    """A memory record the job would dead-letter; the message is the job's reason."""


def check_agent_id(agent_id: Any, where: str) -> str:
    """`agent_id` as the job accepts it (a non-empty string), else AgentScopeError naming `where`."""
    if not isinstance(agent_id, str) or not agent_id.strip():
        raise AgentScopeError(f"{where}: agent_id must be a non-empty string, got {agent_id!r}")
    return agent_id


def filter_value(condition: Any) -> Any:
    """The agent a filter condition names: `"alice"` or `{"$eq": "alice"}` (Flink Agents' filter DSL); any
    other operator ($in, $ne, ...) could span agents and is refused."""
    if isinstance(condition, dict):
        if set(condition) != {"$eq"}:
            raise AgentScopeError(f"filters: agent_id takes a value or {{'$eq': value}}, got {condition!r}")
        return condition["$eq"]
    return condition


def scope(bound: str | None, *, filters: dict[str, Any] | None = None, given: str | None = None,
          collection: str | None = None, write: bool = False) -> str:
    """The one agent a call is about: the store's bound agent, `filters={"agent_id": A}` or
    `{"agent_id": {"$eq": A}}` (Flink Agents' filter DSL) or an explicit `agent_id`; all that are given must
    agree (`write`: the call adds or deletes memory, and its error says so). No agent at all is an error: recall
    over every agent's memory is never what an agent asked for."""
    if collection is not None:
        raise AgentScopeError(f"collection {collection!r}: flink-memory has no collections; name the agent with "
                              f"filters={{'agent_id': ...}} or agent_id=")
    named: dict[str, str] = {}
    if bound is not None:
        named["the vector store's agent_id"] = check_agent_id(bound, "the vector store")
    if filters:
        other = sorted(set(filters) - {AGENT_FIELD})
        if other:
            raise AgentScopeError(f"filters {other}: flink-memory filters by agent_id only")
        named["filters"] = check_agent_id(filter_value(filters[AGENT_FIELD]), "filters")
    if given is not None:
        named["agent_id="] = check_agent_id(given, "agent_id=")
    if not named and write:
        raise AgentScopeError("no agent named for the write: pass agent_id=AGENT (the event's key) or bind the "
                              "vector store to one agent with agent_id=; every memory belongs to one agent")
    if not named:
        raise AgentScopeError("no agent named: pass filters={'agent_id': AGENT} (the event's key) or bind the "
                              "vector store to one agent with agent_id=; recall never spans agents")
    agents = set(named.values())
    if len(agents) > 1:
        raise AgentScopeError("two agents named: " + ", ".join(f"{k} {v!r}" for k, v in named.items()))
    return agents.pop()


def check_limit(limit: Any) -> int:
    """k of a recall: the service's bounds (a recall is for a prompt, not a dump of the memory)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_K:
        raise ValueError(f"limit must be an integer from 1 to {MAX_K}, got {limit!r}")
    return limit


def check_question(question: Any) -> str:
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the question must be a non-empty string, got {question!r}")
    if len(question) > MAX_QUESTION:
        raise ValueError(f"the question is {len(question)} characters, over {MAX_QUESTION}")
    return question


def content_id(agent_id: str, text: str | None, messages: list[dict[str, Any]] | None = None) -> str:
    """An id from the memory's content: an action replayed after a failure writes the same record again, a
    re-delivery the job ignores, not a second memory."""
    return "mem-" + digest([agent_id, text, messages])[:24]


def memory_record(agent_id: str, text: str | None = None, *, id: str | None = None, ts: str | None = None,
                  metadata: dict[str, Any] | None = None, messages: list[dict[str, Any]] | None = None) -> str:
    """One input record of the memory job (docs/input.md) as its JSON line: a memory item (`text`) or a
    conversation (`messages`), validated as the job validates its input, so what the job would dead-letter is
    refused here with the job's reason. Without `id`, one from the content (content_id); the same id with
other content is an update."""
    check_agent_id(agent_id, "memory_record")
    record_id = id if id is not None else content_id(agent_id, text, messages)
    record: dict[str, Any] = {AGENT_FIELD: agent_id, "id": record_id}
    if ts is not None:
        record["ts"] = ts
    if metadata is not None:
        record["metadata"] = metadata
    if text is not None:
        record["text"] = text
    if messages is not None:
        record["messages"] = messages
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    parsed = parse_line(line)
    if isinstance(parsed, DeadLetter):
        raise RecordRefused(parsed.reason)
    return line


class HitDocument(BaseModel):
    """The fields of a Flink Agents `Document` for one recall hit: its text, id, score and what it is."""

    model_config = ConfigDict(frozen=True)

    id: str
    content: str
    score: float
    metadata: dict[str, Any] = Field(default_factory=dict)


def hit_document(agent_id: str, hit: Recalled) -> HitDocument:
    """A recall hit as a document: kind (unit, batch, merge, global), level and time range in metadata."""
    metadata: dict[str, Any] = {AGENT_FIELD: agent_id, "kind": hit.kind, "level": hit.level}
    for name in ("first_ts", "last_ts", "covered_by"):
        value = getattr(hit, name)
        if value is not None:
            metadata[name] = value
    if hit.provisional:
        metadata["provisional"] = True
    return HitDocument(id=hit.node_id, content=hit.text, score=hit.score, metadata=metadata)
