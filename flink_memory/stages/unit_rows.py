"""What the store receives: the agent's memory log, applied once committed, and its unit rows shown at once.

Each agent has two logs, numbered from 1 with no gap in their writers' checkpointed state: the batcher's (its
unit-row messages, `UnitRows`, and the batch nodes it emits, in the order it decided them) and the merger's
(the merges and globals it writes). Both are side outputs written by an exactly-once file sink to
`<output>/memory/` and applied to the store from committed files only (flink_memory.store.applier). A covering
batch node can never overtake the update of one of its units: they are one ordered log. The two logs need no
order between them: liveness by `replaces` does not depend on arrival order, and merges cover no unit.

A unit is searchable as soon as the batcher accepts it: the job's provisional writer shows the batcher log's
unit rows at once (`MemoryStore.write_provisional`), each until the commit that reaches its `seq` confirms or
disowns it. A retracted unit (update, deletion), a unit dead-lettered by an eviction and every unit of a
forgotten agent leave the store the same way. A unit sealed by `memory.editable_for` simply stays.
"""

from __future__ import annotations

import json
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import MemoryUnit, SummaryNode


class UnitStore(Protocol):
    """What `apply` needs of a store (tests/stagekit.py's in-memory table has it)."""

    def upsert_units(self, units: list[MemoryUnit]) -> int: ...

    def delete_units(self, agent_id: str, unit_ids: list[str]) -> None: ...

    def forget_units(self, agent_id: str) -> None: ...


class UnitRows(BaseModel):
    """Unit rows of one agent to write: first every unit row goes (`forget`), then `delete`, then `upsert`.

    `seq` is the message's place in the agent's batcher log: a provisional row is confirmed or removed when the
    commit of that log reaches it."""

    model_config = ConfigDict(extra="forbid")

    rows: Literal["units"] = "units"  # (kept: the memory logs written so far carry it)
    agent_id: str
    seq: int = 0
    forget: bool = False
    delete: list[str] = Field(default_factory=list)
    upsert: list[MemoryUnit] = Field(default_factory=list)

    def apply(self, store: UnitStore) -> None:
        if self.forget:
            store.forget_units(self.agent_id)
        if self.delete:
            store.delete_units(self.agent_id, self.delete)
        if self.upsert:
            store.upsert_units(self.upsert)


Writer = Literal["batcher", "merger"]


class LogEntry(BaseModel):
    """One line of the memory log (`<output>/memory/`): the `seq`-th entry of the agent's log `by` one writer,
    a node or unit rows. Whichever files and subtasks hold a log, its committed entries are 1..n, so an
    applier applies each once, in order, by comparing `seq` with the position it stored."""

    model_config = ConfigDict(extra="forbid")

    by: Writer
    agent_id: str
    seq: int
    node: SummaryNode | None = None
    units: UnitRows | None = None


def log_line(by: Writer, agent_id: str, seq: int, field: Literal["node", "units"], line: str) -> str:
    """A LogEntry's JSON around a node's or UnitRows' JSON, without parsing it again."""
    return f'{{"by":"{by}","agent_id":{json.dumps(agent_id, ensure_ascii=False)},"seq":{seq},"{field}":{line}}}'


def accepted(unit: MemoryUnit) -> UnitRows:
    return UnitRows(agent_id=unit.agent_id, upsert=[unit])


def dropped(agent_id: str, unit_ids: list[str]) -> list[UnitRows]:
    """The message that removes these units ([] when there are none)."""
    return [UnitRows(agent_id=agent_id, delete=unit_ids)] if unit_ids else []


def forgotten(agent_id: str) -> UnitRows:
    return UnitRows(agent_id=agent_id, forget=True)
