"""The merger's keyed state: its names, the objects its core works with, and the stored layout of each.

Per agent: the summary tree (`summarize.tree.SummaryTree`: the frontier's node ids per level and the id
counters), the nodes it holds (a map by node id: the frontier, and merged nodes while a batch below them is
editable), the merges and the global being made, when the next global and sweep are due, and the position
in its memory log. The `*V2` models are the checkpoint layout (version 2: their names and JSON fields are in
every checkpoint; a tree's slots and a job's children are parts of them, without a version of their own);
the domain types beside them may change freely, each conversion being field by field
(`flink_memory.state_layout.StateModel`). Nodes are `records.SummaryNode`, an output contract of its own, stored as
it is.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flink_memory.records import SummaryNode
from flink_memory.stages.reduce_state import ReduceJobV2
from flink_memory.state import Entries, StateSchema, Value
from flink_memory.state_layout import StateModel, StoredModel
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import ChildRef, Slot, SummaryTree, merge_entry

TREE: Value[SummaryTree] = Value("merger_tree")
SCHEDULE: Value[MergerSchedule] = Value("merger_clock")  # (a state's name is in every checkpoint: it stays as written)
GLOBAL: Value[ParentJob] = Value("merger_global")
LOG: Value[LogPosition] = Value("merger_log")
NODES: Entries[StoredNode] = Entries("merger_nodes")
MERGES: Entries[ParentJob] = Entries("merger_merges")


class MergerSchedule(BaseModel):
    """When the agent's next global and next sweep are due, and whether its input ended (global due now)."""

    first_node_ms: int | None = None  # when the agent's first node arrived (the first refresh counts from it)
    last_global_ms: int | None = None
    ended: bool = False
    next_sweep_ms: int | None = None


class LogPosition(BaseModel):
    """How many entries of the agent's merger log were written (the `seq` of the last one), in which history and
    branch (flink_memory.memory_log.Lineage), and the last global it wrote (what a new branch's snapshot carries)."""

    seq: int = 0
    history: str = ""
    branch: str = ""
    current: SummaryNode | None = None


class StoredNode(BaseModel):
    """A node the merger holds: in the frontier, or merged while a batch below its parent is editable."""

    node: SummaryNode
    parent: str | None = None  # the merge it went into; None while in the frontier
    newest_ms: int = 0  # when the newest batch below it arrived
    running_revision: str | None = None  # the id of this merge's revision being made
    held: bool = False  # a batch being summarized again: kept, with what it is merged with, until replaced


class ParentJob(BaseModel):
    """A merge or global summary being made; children are referenced, their texts are in the job."""

    node_id: str
    level: int = 0
    version: int | None = None
    children: list[ChildRef]
    job: ReduceJob
    replaces: list[str] = Field(default_factory=list)

    @property
    def child_ids(self) -> list[str]:
        return [c.node_id for c in self.children]


# --- the stored layout --------------------------------------------------------------------------------------


class SlotV2(StoredModel):
    stores: ClassVar = Slot

    node_id: str
    ready: bool


class SummaryTreeV2(StateModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)
    stores: ClassVar = SummaryTree
    renamed: ClassVar = {"unchained_globals": "legacy_globals"}

    levels: list[list[SlotV2]] = Field(default_factory=list)
    merges_per_level: list[int] = Field(default_factory=list)
    global_version: int = 0
    global_children: list[str] = Field(default_factory=list)
    last_batch: int = 0
    latest_revision: dict[str, int] = Field(default_factory=dict, alias="revised")
    first_batch: int = 1
    unwritten: list[list[int]] = Field(default_factory=list)
    merges_before_forget: list[int] = Field(default_factory=list)
    legacy_globals: int = 0


class ChildRefV2(StoredModel):
    stores: ClassVar = ChildRef

    node_id: str
    level: int
    item_count: int
    first_ts: str | None = None
    last_ts: str | None = None


class MergerScheduleV2(StateModel):
    stores: ClassVar = MergerSchedule

    first_node_ms: int | None = None
    last_global_ms: int | None = None
    ended: bool = False
    next_sweep_ms: int | None = None


class LogPositionV2(StateModel):
    stores: ClassVar = LogPosition
    added: ClassVar = frozenset({"history", "branch", "current"})  # (flink_memory.memory_log.Lineage)

    seq: int = 0
    history: str = ""
    branch: str = ""
    current: SummaryNode | None = None


class StoredNodeV2(StateModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)
    stores: ClassVar = StoredNode

    node: SummaryNode
    parent: str | None = None
    newest_ms: int = 0
    running_revision: str | None = Field(None, alias="revising")
    held: bool = False


class ParentJobV2(StateModel):
    stores: ClassVar = ParentJob

    node_id: str
    level: int = 0
    version: int | None = None
    children: list[ChildRefV2]
    job: ReduceJobV2
    replaces: list[str] = Field(default_factory=list)


def merge_job(node_id: str, level: int, children: list[SummaryNode], target_tokens: int,
              replaces: list[str] | None = None) -> ParentJob:
    """The job of a merge of these children (in this order), asking `target_tokens` of its summary."""
    return ParentJob(node_id=node_id, level=level, children=[ChildRef.of(c) for c in children],
                     replaces=replaces or [],
                     job=ReduceJob(purpose="merge", entries=[merge_entry(c) for c in children],
                                   target_tokens=target_tokens))


SCHEMA = StateSchema(values={TREE: SummaryTreeV2, SCHEDULE: MergerScheduleV2, GLOBAL: ParentJobV2,
                             LOG: LogPositionV2},
                     maps={NODES: StoredNodeV2, MERGES: ParentJobV2})
