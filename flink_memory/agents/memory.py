"""An agent's memory for its actions, in plain Python: recall from the store the memory job writes, and
remember by writing an input record for the running job (its followed directory or its Kafka topic), the
service's path (flink_memory.service): the job stays the only writer of memory."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flink_memory.agents.core import (
    AGENT_FIELD,
    RecordRefused,
    check_agent_id,
    check_limit,
    check_question,
    memory_record,
)
from flink_memory.records import SummaryNode
from flink_memory.service.memory import (
    MemoryService,
    NotCreated,
    NotFound,
    OneAgent,
    Rejected,
    ServiceError,
    TooLarge,
)
from flink_memory.service.models import Accepted, Mode, RecallRequest
from flink_memory.service.writer import open_writer
from flink_memory.store import Recalled

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder


class MemoryUnavailable(RuntimeError):
    """The store or the job's input cannot be reached now (the message says why)."""


def load_embedder(config: str | None = None, overrides: list[str] | None = None) -> Embedder | None:
    """The configured embedding model (embeddings.*), the one the job embeds the store with."""
    from flink_memory.config import load_config
    from flink_memory.embeddings import embedder_for

    return embedder_for(load_config(config, overrides or []).embeddings)


class AgentMemory:
    """Recall and remember for one agent per call: `store` is the job's store (SQLite path or postgresql://),
    `input` the job's input (a followed directory or kafka://...; None: read-only). `embedder`: the model
    questions are embedded with; None: the configured one (load_embedder), as the job embeds the store, unless
    `mode` is keyword."""

    def __init__(self, store: str, input: str | None = None, *, embedder: Embedder | None = None,
                 mode: Mode = "hybrid") -> None:
        if embedder is None and mode != "keyword":
            embedder = load_embedder()
        self.service = MemoryService(store, open_writer(input), embedder=embedder, read_only=input is None)
        self.mode = mode

    def recall(self, agent_id: str, question: str, k: int = 5) -> list[Recalled]:
        """The agent's live units and nodes that best match the question; [] while it has no memory."""
        grant = OneAgent(check_agent_id(agent_id, "recall"))
        request = RecallRequest(question=check_question(question), k=check_limit(k), mode=self.mode)
        try:
            return self.service.recall(grant, agent_id, request).hits
        except (NotFound, NotCreated):  # (no memory of this agent, or of any agent yet)
            return []
        except ServiceError as exc:
            raise MemoryUnavailable(str(exc)) from None

    def remember(self, agent_id: str, text: str | None = None, *, id: str | None = None, ts: str | None = None,
                 metadata: dict[str, Any] | None = None, messages: list[dict[str, Any]] | None = None) -> Accepted:
        """A new memory of the agent (with an id it used before: an update) as an input record of the job;
        a record the job would dead-letter is refused with the job's reason (RecordRefused)."""
        body = json.loads(memory_record(agent_id, text, id=id, ts=ts, metadata=metadata, messages=messages))
        del body[AGENT_FIELD]
        return self._write(self.service.remember, agent_id, body)

    def delete(self, agent_id: str, record_id: str) -> Accepted:
        """Retract one record of the agent (its units leave the store and the summaries)."""
        return self._write(self.service.delete, agent_id, record_id)

    def forget(self, agent_id: str) -> Accepted:
        """Drop everything of the agent (a `forget` record: its units and summaries leave the store)."""
        check_agent_id(agent_id, "forget")
        try:
            return self.service.forget(OneAgent(agent_id), agent_id)
        except ServiceError as exc:
            raise MemoryUnavailable(str(exc)) from None

    def summary(self, agent_id: str) -> SummaryNode | None:
        """The agent's current global summary node (the root of its tree); None before its first one."""
        check_agent_id(agent_id, "summary")
        try:
            return self.service.memory(OneAgent(agent_id), agent_id).memory
        except (NotFound, NotCreated):
            return None
        except ServiceError as exc:
            raise MemoryUnavailable(str(exc)) from None

    def _write(self, call: Any, agent_id: str, argument: Any) -> Accepted:
        check_agent_id(agent_id, "remember")
        try:
            return call(OneAgent(agent_id), agent_id, argument)
        except (Rejected, TooLarge) as exc:
            raise RecordRefused(str(exc)) from None
        except ServiceError as exc:  # read-only (no input), or the input cannot take it now
            raise MemoryUnavailable(str(exc)) from None

    def units(self, agent_id: str, ids: list[str] | None = None) -> list[tuple[str, str]]:
        """The agent's live memory units as (id, text), those of `ids` only when given."""
        check_agent_id(agent_id, "units")
        wanted = set(ids) if ids is not None else None
        try:
            with self.service.store() as store:
                units = store.units(agent_id)
        except NotCreated:
            return []
        except ServiceError as exc:
            raise MemoryUnavailable(str(exc)) from None
        return [(unit.unit_id, unit.text) for unit, _ in units if wanted is None or unit.unit_id in wanted]

    def close(self) -> None:
        self.service.close()
