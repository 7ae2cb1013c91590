"""What the store receives, in two channels: unit rows at once, and the memory log once committed.

A unit is searchable as soon as the batcher accepts it, not when its checkpoint commits: the batcher sends a
`UnitRows` message beside its main output (a stage's store rows, `Effects.rows`), which the job's
provisional writer applies at once (`MemoryStore.write_provisional`). The same message also goes down the
main path to the merger, which numbers it, with every node it writes, into the agent's memory log
(`LogEntry`, `Effects.committed`): one ordered stream per agent, written by an exactly-once file sink and
applied to the store from committed files only (flink_memory.store.applier). The log is what the store
follows; a provisional row lives until the commit that confirms or disowns it (`UnitRows.seq`).

A retracted unit (update, deletion), a unit dead-lettered by an eviction and every unit of a forgotten
agent leave the store the same way, so a deleted unit's text is in no row even before its batch node is
replaced. A unit sealed by `memory.editable_for` simply stays: nothing is sent.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import MemoryUnit, SummaryNode


class UnitStore(Protocol):
    """What `apply` needs of a store (tests/stagekit.py's in-memory table has it)."""

    def upsert_units(self, units: list[MemoryUnit]) -> int: ...

    def delete_units(self, agent_id: str, unit_ids: list[str]) -> None: ...

    def forget_units(self, agent_id: str) -> None: ...


class UnitRows(BaseModel):
    """Unit rows of one agent to write: first every unit row goes (`forget`), then `delete`, then `upsert`.

    `seq` numbers the agent's messages as the batcher sent them (kept in its state, so a replay numbers them
    again the same way): a provisional row is confirmed or removed when the log's commit reaches its `seq`."""

    model_config = ConfigDict(extra="forbid")

    rows: Literal["units"] = "units"  # (first in the JSON: how a reader tells these from summary nodes)
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


class LogEntry(BaseModel):
    """One line of the memory log (`<output>/memory/`): the agent's `seq`-th store change, a node or unit rows.

    The merger numbers each agent's entries from 1 with no gap, in its checkpointed state: the committed log
    of an agent is 1..n, whichever files and subtasks hold it, so an applier applies each entry once, in
    order, by comparing `seq` with the position it stored."""

    model_config = ConfigDict(extra="forbid")

    agent_id: str
    seq: int
    node: SummaryNode | None = None
    units: UnitRows | None = None


PREFIX = '{"rows":"units"'


def unit_rows_of(value: str | bytes | dict[str, Any]) -> UnitRows | None:
    """The UnitRows a store-bound element is, or None (a summary node)."""
    if isinstance(value, dict):
        return UnitRows.model_validate(value) if value.get("rows") == "units" else None
    text = value.decode() if isinstance(value, bytes) else value
    return UnitRows.model_validate_json(text) if text.startswith(PREFIX) else None


def accepted(unit: MemoryUnit) -> UnitRows:
    return UnitRows(agent_id=unit.agent_id, upsert=[unit])


def dropped(agent_id: str, unit_ids: list[str]) -> list[UnitRows]:
    """The message that removes these units ([] when there are none)."""
    return [UnitRows(agent_id=agent_id, delete=unit_ids)] if unit_ids else []


def forgotten(agent_id: str) -> UnitRows:
    return UnitRows(agent_id=agent_id, forget=True)
