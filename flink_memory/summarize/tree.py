"""An agent's summary tree: a frontier of unmerged nodes per level, merged `fan_in` at a time.

`SummaryTree` is the small part of the merger's state: per level, slots of node ids in arrival order
(a slot is a finished node, or a merge still running). Node contents live in a map beside it and are read
only to pack a merge group. Slots keep arrival order, so a merge whose call finished early still takes its
place in chronology, and grouping depends only on the order of nodes, never on timing: a replay forms the
same groups and hits the journal. A new batch node costs O(log N) merges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from flink_memory.ids import NodeId
from flink_memory.records import SummaryNode
from flink_memory.summarize.prompts import Packer
from flink_memory.summarize.rooms import entry_limit
from flink_memory.tokens.budget import Budget


def merge_entry(node: SummaryNode | dict[str, Any]) -> dict[str, Any]:
    """How a child node appears in a merge prompt: its time range and its text (and, for packing, the tokens
    the provider counted when it wrote the text: `prompts.written_bound`)."""
    data = node.model_dump(mode="json") if isinstance(node, SummaryNode) else node
    entry = {"text": data["text"], "from": data.get("first_ts"), "to": data.get("last_ts")}
    if data.get("completion_tokens"):
        entry["tokens"] = data["completion_tokens"]
    return entry


class ChildRef(BaseModel):
    """What a parent node needs of a child once the child's text has been merged."""

    node_id: str
    level: int
    item_count: int
    first_ts: str | None = None
    last_ts: str | None = None

    @classmethod
    def of(cls, node: SummaryNode) -> ChildRef:
        return cls(**node.model_dump(include=set(cls.model_fields)))


class Slot(BaseModel):
    node_id: str
    ready: bool  # False: the merge that makes this node is still running


@dataclass(frozen=True)
class MergeStart:
    """A merge to run: `node_id` is the id the merged node will carry."""

    node_id: str
    level: int
    children: list[SummaryNode]


class SummaryTree(BaseModel):
    levels: list[list[Slot]] = Field(default_factory=list)
    merges_per_level: list[int] = Field(default_factory=list)  # node ids count per level: deterministic
    global_version: int = 0
    global_children: list[str] = Field(default_factory=list)
    # every id written: batches 1..last_batch, merges by merges_per_level, globals by version, and revisions
    last_batch: int = 0
    latest_revision: dict[str, int] = Field(default_factory=dict)  # base id -> the latest revision written of it
    first_batch: int = 1  # the first batch of the memory as it is now (after a forget, the next one)
    # batch numbers never written, as [first, last] runs: batches leave the batcher in order, so one that is
    # skipped (all its units retracted before its summary, or dropped by a forget) never comes
    unwritten: list[list[int]] = Field(default_factory=list)
    merges_before_forget: list[int] = Field(default_factory=list)  # per level: merge ids of a forgotten memory
    # globals whose nodes name no predecessor (none was named before `replaces` was written): the next global
    # (or a forget) replaces all of them
    unchained_globals: int = 0

    def written_batches(self, first: int = 1) -> list[int]:
        """Numbers of the batches written from `first` on, oldest first."""
        skipped = {seq for start, end in self.unwritten for seq in range(max(start, first), end + 1)}
        return [seq for seq in range(first, self.last_batch + 1) if seq not in skipped]

    def _latest(self, base: NodeId) -> str:
        return str(base.revised(self.latest_revision.get(str(base), 0)))

    def live_batch_ids(self) -> list[str]:
        """The live id of every batch of the current memory (the latest revision of each), oldest first."""
        return [self._latest(NodeId.batch(seq)) for seq in self.written_batches(self.first_batch)]

    def live_merge_ids(self) -> list[str]:
        """The latest revision of every merge of the current memory (some may be running, not yet written)."""
        before = self.merges_before_forget
        return [self._latest(NodeId.merge(level + 1, n)) for level, count in enumerate(self.merges_per_level)
                for n in range((before[level] if level < len(before) else 0) + 1, count + 1)]

    def replaced_globals(self) -> list[str]:
        """The globals the next global replaces: the latest one (each names the one before it), or every
        global up to it while some named none (`unchained_globals`)."""
        first = 1 if self.unchained_globals else self.global_version
        return [str(NodeId.global_summary(n)) for n in range(max(first, 1), self.global_version + 1)]

    def forget(self) -> None:
        """The memory is dropped (an empty global replaces it): only the id counters stay."""
        self.levels, self.global_children, self.first_batch = [], [], self.last_batch + 1
        self.merges_before_forget = list(self.merges_per_level)
        self.latest_revision, self.unwritten, self.unchained_globals = {}, [], 0

    def note_id(self, node_id: str) -> bool:
        """Record a written id; True for a batch not seen before (it may arrive as a revision: a batch that
        took changes before it left)."""
        parsed = NodeId.parse(node_id)
        if parsed.revision:
            base = str(parsed.base)
            self.latest_revision[base] = max(parsed.revision, self.latest_revision.get(base, 0))
        if parsed.kind != "batch":
            return False
        seq = parsed.number
        if seq <= self.last_batch:
            return False
        if seq > self.last_batch + 1:
            self.unwritten.append([self.last_batch + 1, seq - 1])
        self.last_batch = seq
        return True

    # --- growth --------------------------------------------------------------------------------------

    def add(self, node: SummaryNode, fan_in: int | None, budget: Budget,
            lookup: Callable[[str], SummaryNode]) -> list[MergeStart]:
        """A finished node joins the frontier of its level; returns the merges this makes ready.

        `fan_in` None never merges (summarization.depth: single). `lookup` reads a frontier node's content.
        """
        slots = self._level(node.level)
        for slot in slots:
            if not slot.ready and slot.node_id == node.node_id:
                slot.ready = True
                break
        else:
            slots.append(Slot(node_id=node.node_id, ready=True))
        return self._form_groups(node.level, fan_in, budget, lookup) if fan_in else []

    def _level(self, level: int) -> list[Slot]:
        while len(self.levels) < level:
            self.levels.append([])
        return self.levels[level - 1]

    def _form_groups(self, level: int, fan_in: int, budget: Budget,
                     lookup: Callable[[str], SummaryNode]) -> list[MergeStart]:
        started: list[MergeStart] = []
        # packed as the merge job will pack it: at the upper bound, each summary's line bounded by the provider's
        # count of it when it was written (prompts.written_bound), never by what other calls taught the process
        scale = budget.counter.calibration.initial
        limit = entry_limit(budget, "merge", scale)
        slots = self._level(level)
        while True:
            group: list[SummaryNode] = []
            packer = Packer(budget.counter, scale)
            ready = False
            for slot in slots:
                if not slot.ready:
                    break  # an earlier merge is still running: keep chronology, wait for it
                node = lookup(slot.node_id)
                entry = merge_entry(node)
                if len(group) >= 2 and packer.used + packer.cost(entry) > limit:
                    ready = True  # the next node would not fit this request
                    break
                group.append(node)
                packer.add(entry)
                if len(group) >= fan_in or (len(group) == 2 and packer.used > limit):
                    ready = True  # two nodes that do not fit one request: the merge job condenses them
                    break
            if not ready or not group:
                return started
            del slots[: len(group)]
            while len(self.merges_per_level) < level + 1:
                self.merges_per_level.append(0)
            self.merges_per_level[level] += 1
            node_id = str(NodeId.merge(level + 1, self.merges_per_level[level]))
            self._level(level + 1).append(Slot(node_id=node_id, ready=False))
            started.append(MergeStart(node_id=node_id, level=level + 1, children=group))

    # --- changes -------------------------------------------------------------------------------------

    def swap(self, old_id: str, new_id: str) -> None:
        """A finished node that replaces a frontier node takes its slot, so chronology stays as it was."""
        if (found := self._find(old_id)) is not None:
            slots, index = found
            slots[index] = Slot(node_id=new_id, ready=True)

    def drop(self, node_id: str) -> None:
        """A frontier node leaves the frontier (it was replaced by an empty node)."""
        if (found := self._find(node_id)) is not None:
            slots, index = found
            del slots[index]

    def _find(self, node_id: str) -> tuple[list[Slot], int] | None:
        for slots in self.levels:
            for index, slot in enumerate(slots):
                if slot.node_id == node_id:
                    return slots, index
        return None

    def restore_level(self, slots: list[Slot]) -> None:
        """Append the next level up with these slots (arrival order): a frontier restored from saved state."""
        self.levels.append(slots)

    # --- the global summary --------------------------------------------------------------------------

    def settled(self) -> bool:
        """No merge is running: the frontier will not change until new input arrives."""
        return all(slot.ready for slots in self.levels for slot in slots)

    def frontier(self) -> list[str]:
        """Unmerged nodes, oldest first: higher levels were formed from earlier items."""
        return [slot.node_id for slots in reversed(self.levels) for slot in slots if slot.ready]

    def needs_global(self) -> bool:
        """The frontier changed since the last global (an emptied frontier needs an empty global too, so the
        last one, with the text of what was deleted, stops being current)."""
        frontier = self.frontier()
        return self.settled() and frontier != self.global_children and bool(frontier or self.global_children)

    def next_global_id(self) -> tuple[str, int]:
        version = self.global_version + 1
        return str(NodeId.global_summary(version)), version

    def global_done(self, children: list[str], version: int) -> None:
        self.global_children = children
        self.global_version = version
        self.unchained_globals = 0
