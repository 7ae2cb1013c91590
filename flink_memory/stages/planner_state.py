"""The planner's keyed state: its names, the objects its core works with, and the stored layout of each.

Per agent: the queue of records in input order (a head and a map by sequence number), every accepted record
by id (what an update or a deletion must retract), the verified manifests of plans that cost a call (by
input digest), and the clock of the next sweep. The `*V2` models are the checkpoint layout (version 2:
their names and JSON fields are in every checkpoint); the domain types beside them may change freely, each
conversion being field by field (`flink_memory.state_layout.StateModel`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from flink_memory.chunking.plans import PlanJob
from flink_memory.state import Entries, StateSchema, Value
from flink_memory.state_layout import StateModel

HEAD: Value[QueueHead] = Value("planner_head")
CLOCK: Value[PlannerClock] = Value("planner_clock")
QUEUE: Entries[QueuedRecord] = Entries("planner_queue")
SOURCES: Entries[SourceEntry] = Entries("sources")
PLANS: Entries[PlanEntry] = Entries("plans")


class QueueHead(BaseModel):
    first: int = 0  # sequence number of the record being handled
    next: int = 0  # sequence number the next record gets


class SourceEntry(BaseModel):
    """An accepted record: what an update or a deletion of it must retract."""

    digest: str
    units: list[str] = Field(default_factory=list)
    accepted_ms: int = 0  # 0: not known (its age counts from the next sweep)
    sealed: bool = False


class QueuedRecord(BaseModel):
    payload: str  # the record's JSON, as parsed
    checked: bool = False  # stored plan and duplicate checks done
    job: PlanJob | None = None
    job_digest: str | None = None  # seals the plan in progress to this input and policy, like a manifest
    previous: SourceEntry | None = None  # the accepted version this record updates


class PlanEntry(BaseModel):
    manifest: str  # the verified manifest JSON of a plan that cost a call
    stored_ms: int = 0  # 0: not known (its age counts from the next sweep)


class PlannerClock(BaseModel):
    next_sweep_ms: int | None = None


# --- the stored layout --------------------------------------------------------------------------------------


class QueueHeadV2(StateModel):
    stores: ClassVar = QueueHead

    first: int = 0
    next: int = 0


class SourceEntryV2(StateModel):
    stores: ClassVar = SourceEntry

    digest: str
    units: list[str] = Field(default_factory=list)
    accepted_ms: int = 0
    sealed: bool = False


class PlanJobV2(StateModel):
    stores: ClassVar = PlanJob

    cursor: int = 0
    accepted: list[int] = Field(default_factory=list)
    calls: int = 0
    attempts: int = 0
    retry_at_ms: int = 0
    scale: float | None = None
    rejections: int = 0


class QueuedRecordV2(StateModel):
    stores: ClassVar = QueuedRecord

    payload: str
    checked: bool = False
    job: PlanJobV2 | None = None
    job_digest: str | None = None
    previous: SourceEntryV2 | None = None


class PlanEntryV2(StateModel):
    stores: ClassVar = PlanEntry

    manifest: str
    stored_ms: int = 0


class PlannerClockV2(StateModel):
    stores: ClassVar = PlannerClock

    next_sweep_ms: int | None = None


SCHEMA = StateSchema(values={HEAD: QueueHeadV2, CLOCK: PlannerClockV2},
                     maps={QUEUE: QueuedRecordV2, SOURCES: SourceEntryV2, PLANS: PlanEntryV2})

SEALED_PROGRESS = {"cursor", "accepted", "scale", "rejections"}  # what seals a plan in progress (stored names)


def plan_progress(job: PlanJob) -> dict[str, Any]:
    """The progress a plan in progress is sealed by, under its stored names (the seal is kept in state)."""
    return PlanJobV2.of(job).model_dump(mode="json", include=SEALED_PROGRESS)
