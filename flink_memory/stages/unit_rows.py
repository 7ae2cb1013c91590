"""Memory units as store rows, sent by the batcher the moment it accepts, retracts or drops them.

A unit is searchable as soon as the batcher accepts it, not when its batch is summarized: the batcher
sends a `UnitRows` message beside its main output (a stage's store rows, `Effects.rows`), and the store
sink applies it (`apply`). A retracted unit (update, deletion), a unit dead-lettered by an eviction and
every unit of a forgotten agent leave the store the same way, so a deleted unit's text is in no row even
before its batch node is replaced. A unit sealed by `memory.editable_for` simply stays: nothing is sent.

Messages of one agent leave one batcher subtask in order, and the shell forwards them to the sink in order
(same parallelism), so a deletion is applied before the upsert of the update that follows it.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import MemoryUnit


class UnitStore(Protocol):
    """What `apply` needs of a store (flink_memory.store.MemoryStore has it)."""

    def upsert_units(self, units: list[MemoryUnit]) -> int: ...

    def delete_units(self, agent_id: str, unit_ids: list[str]) -> None: ...

    def forget_units(self, agent_id: str) -> None: ...


class UnitRows(BaseModel):
    """Unit rows of one agent to write: first every unit row goes (`forget`), then `delete`, then `upsert`."""

    model_config = ConfigDict(extra="forbid")

    rows: Literal["units"] = "units"  # (first in the JSON: how a reader tells these from summary nodes)
    agent_id: str
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


PREFIX = '{"rows":"units"'


def unit_rows_of(value: str | bytes | dict[str, Any]) -> UnitRows | None:
    """The UnitRows a store-bound element is, or None (a summary node)."""
    if isinstance(value, dict):
        return UnitRows.model_validate(value) if value.get("rows") == "units" else None
    text = value.decode() if isinstance(value, bytes) else value
    return UnitRows.model_validate_json(text) if text.startswith(PREFIX) else None


def accepted(unit: MemoryUnit) -> str:
    return UnitRows(agent_id=unit.agent_id, upsert=[unit]).model_dump_json()


def dropped(agent_id: str, unit_ids: list[str]) -> list[str]:
    """The message that removes these units ([] when there are none)."""
    return [UnitRows(agent_id=agent_id, delete=unit_ids).model_dump_json()] if unit_ids else []


def forgotten(agent_id: str) -> str:
    return UnitRows(agent_id=agent_id, forget=True).model_dump_json()
