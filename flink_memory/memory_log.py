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

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import MemoryUnit, SummaryNode

BRANCH_ID = r"^[0-9a-z]*$"  # (history and branch ids are time-ordered: flink_memory.history.new_id)


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
    history: str = Field("", pattern=BRANCH_ID)  # the history and branch of the batcher log that holds it
    branch: str = Field("", pattern=BRANCH_ID)
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


class Lineage(BaseModel):
    """Which history a job writes: `history` is minted when a job starts without a restore and kept by its
    restores; `branch` is minted at every submission (time-ordered: a later submission's sorts after), so a
    job restored from any savepoint writes a branch of its own. Failover restarts keep the branch: what a
    failed attempt wrote after its last checkpoint was never committed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    history: str = Field("", pattern=BRANCH_ID)  # "" (and branch ""): a log written before histories
    branch: str = Field("", pattern=BRANCH_ID)


class Base(BaseModel):
    """Where a writer's log of an agent stood when a branch took it over: the branch and seq its state held
    ("" and 0: nothing; the log starts with this branch)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    branch: str = Field("", pattern=BRANCH_ID)
    seq: int = 0


class Snapshot(BaseModel):
    """What a writer holds of an agent when its branch takes the log over: the batcher its units (with the batch
    node covering each, None while unbatched), the merger the nodes it holds and its current global. With it the
    branch's log needs nothing written before it."""

    model_config = ConfigDict(extra="forbid")

    units: list[tuple[MemoryUnit, str | None]] = Field(default_factory=list)
    nodes: list[SummaryNode] = Field(default_factory=list)


_BODY = ("base", "snapshot", "node", "units")  # (what one entry holds: LogEntry.line)


class LogEntry(BaseModel):
    """One line of the memory log (`<output>/memory/`): the `seq`-th entry of the agent's log `by` one writer
    in one branch of one history, a node, unit rows, or the branch's first entry (`base`: where the log stood
    before it, and the writer's `snapshot`). Whichever files and subtasks hold a log, the committed entries
    of a branch follow its base with no gap, so an applier applies each once, in order, by comparing
    (branch, seq) with the position it stored."""

    model_config = ConfigDict(extra="forbid")

    by: Writer
    agent_id: str
    seq: int
    history: str = Field("", pattern=BRANCH_ID)
    branch: str = Field("", pattern=BRANCH_ID)
    base: Base | None = None
    snapshot: Snapshot | None = None
    node: SummaryNode | None = None
    units: UnitRows | None = None

    def line(self) -> str:
        """The entry as one line of the log: a node's or unit rows' entry leaves out its empty fields, a branch's
        first entry writes them all (the logs written so far are so, byte for byte)."""
        if self.base is not None:
            return self.model_dump_json()
        return self.model_dump_json(exclude={name for name in _BODY if getattr(self, name) is None})


NO_LINEAGE = Lineage()  # (a log written before histories)


def log_entry(by: Writer, agent_id: str, seq: int, lineage: Lineage = NO_LINEAGE, *, node: SummaryNode | None = None,
              units: UnitRows | None = None, base: Base | None = None, snapshot: Snapshot | None = None) -> LogEntry:
    """The `seq`-th entry of the agent's log `by` one writer, in `lineage`: a node, unit rows, or (with `base`
    and `snapshot`) the first entry of a branch."""
    return LogEntry(by=by, agent_id=agent_id, seq=seq, history=lineage.history, branch=lineage.branch, base=base,
                    snapshot=snapshot, node=node, units=units)


def accepted(unit: MemoryUnit) -> UnitRows:
    return UnitRows(agent_id=unit.agent_id, upsert=[unit])


def dropped(agent_id: str, unit_ids: list[str]) -> list[UnitRows]:
    """The message that removes these units ([] when there are none)."""
    return [UnitRows(agent_id=agent_id, delete=unit_ids)] if unit_ids else []


def forgotten(agent_id: str) -> UnitRows:
    return UnitRows(agent_id=agent_id, forget=True)
