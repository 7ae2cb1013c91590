"""The batcher's keyed state: its names, the objects its core works with, and the stored layout of each.

Per agent: the open batch's buffer (small: counts and dates) with its units in a map by sequence number, where
each unit is (a map by unit id), the scale its batches are packed at (`BatchScale`), the batches being
summarized, the sent batches whose units are still editable, and the counters (`BatcherMeta`). The `*V2`
models are the checkpoint layout (version 2: their names and JSON fields are in every checkpoint); the domain
types beside them may change freely, each conversion being field by field
(`flink_memory.state_layout.StateModel`). Units are `records.MemoryUnit`, an output contract of its own,
stored as it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import MemoryUnit
from flink_memory.stages.reduce_state import ReduceJobV2
from flink_memory.state import Entries, StateSchema, Value
from flink_memory.state_layout import StateModel
from flink_memory.summarize.batching import BatchBuffer
from flink_memory.summarize.reduce import ReduceJob

BUFFER: Value[BatchBuffer] = Value("batcher_buffer")
META: Value[BatcherMeta] = Value("batcher_meta")
SCALE: Value[BatchScale] = Value("batcher_scale")
UNITS: Entries[StoredUnit] = Entries("batcher_units")
BATCHES: Entries[PendingBatch] = Entries("batcher_batches")
HOMES: Entries[UnitHome] = Entries("batcher_homes")
DONE: Entries[DoneBatch] = Entries("batcher_done")


class BatcherMeta(BaseModel):
    next_batch: int = 1  # number of the next batch (its node id: NodeId.batch)
    next_emit: int = 1  # batches leave in order: the next one to emit
    ended: bool = False  # the input ended: close what is open, do not wait for timeouts
    resummarizing: list[int] = Field(default_factory=list)  # sent batches being summarized again
    next_sweep_ms: int | None = None
    log_seq: int = 0  # entries of the agent's batcher log (unit rows and batch nodes) written so far
    history: str = ""  # the history and branch the log was last written in (flink_memory.memory_log.Lineage)
    branch: str = ""


class BatchScale(BaseModel):
    """The scale the agent's batches are packed at, from its own first batch report (None: not known yet).

    The first batch is opened at the estimate's upper bound; the units after it wait for its report
    (`awaiting`: that batch's number), then every later batch is packed at what it taught. Learned from the
    agent's own requests, whose reports a rerun reads back from the journal, so each boundary is decided
    from the input alone: the same in every run, whatever the latency or the number of subtasks."""

    scale: float | None = None
    awaiting: int | None = None


class PendingBatch(BaseModel):
    seq: int
    units: list[MemoryUnit]
    first_ts: str | None = None
    last_ts: str | None = None
    job: ReduceJob
    text: str | None = None  # set once summarized; the node leaves when the batches before it have
    newest_ms: int | None = None  # when its newest unit arrived (None: look it up in HOMES)
    # changes it took before its node left: it leaves as that revision, as if it had left first and been
    # summarized again for each (node ids then depend on the input's order only, never on when calls end,
    # so a replay after a failure writes the ids the first attempt wrote)
    revision: int = 0


class DoneBatch(BaseModel):
    """A sent batch while its units are editable: what a revision summarizes again."""

    seq: int
    units: list[MemoryUnit]
    live: str  # the node id that currently stands for this batch
    revision: int = 0
    newest_ms: int  # when its newest unit arrived: it is sealed memory.editable_for after
    job: ReduceJob | None = None  # a revision being made
    target: int = 0  # the revision it is being made into: one more for every change that reached it


class UnitHome(BaseModel):
    """Where a unit is: buffered (batch None, at seq) or in batch `batch` (pending or emitted)."""

    batch: int | None = None
    seq: int = 0
    arrived_ms: int = 0


class StoredUnit(BaseModel):
    unit: MemoryUnit
    arrived_ms: int | None = None  # None: not known here (see its UnitHome)


# --- the stored layout --------------------------------------------------------------------------------------


class BatchBufferV2(StateModel):
    stores: ClassVar = BatchBuffer

    first: int = 0
    count: int = 0
    tokens: int = 0
    opened_at_ms: int | None = None
    last: dict[str, Any] | None = None
    scale: float | None = None


class BatcherMetaV2(StateModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)
    stores: ClassVar = BatcherMeta
    added: ClassVar = frozenset({"history", "branch"})  # (flink_memory.memory_log.Lineage)

    next_batch: int = 1
    next_emit: int = 1
    ended: bool = False
    resummarizing: list[int] = Field(default_factory=list, alias="revising")
    next_sweep_ms: int | None = None
    log_seq: int = 0
    history: str = ""
    branch: str = ""


class BatchScaleV2(StateModel):
    stores: ClassVar = BatchScale

    scale: float | None = None
    awaiting: int | None = None


class PendingBatchV2(StateModel):
    stores: ClassVar = PendingBatch

    seq: int
    units: list[MemoryUnit]
    first_ts: str | None = None
    last_ts: str | None = None
    job: ReduceJobV2
    text: str | None = None
    newest_ms: int | None = None
    revision: int = 0


class DoneBatchV2(StateModel):
    stores: ClassVar = DoneBatch

    seq: int
    units: list[MemoryUnit]
    live: str
    revision: int = 0
    newest_ms: int
    job: ReduceJobV2 | None = None
    target: int = 0


class UnitHomeV2(StateModel):
    stores: ClassVar = UnitHome

    batch: int | None = None
    seq: int = 0
    arrived_ms: int = 0


class StoredUnitV2(StateModel):
    stores: ClassVar = StoredUnit

    unit: MemoryUnit
    arrived_ms: int | None = None


SCHEMA = StateSchema(values={BUFFER: BatchBufferV2, META: BatcherMetaV2, SCALE: BatchScaleV2},
                     maps={UNITS: StoredUnitV2, BATCHES: PendingBatchV2, HOMES: UnitHomeV2,
                           DONE: DoneBatchV2})
