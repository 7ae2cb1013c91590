"""An agent's summary tree: a frontier of unmerged nodes per level, merged `fan_in` at a time.

Plain data, kept in the merger's keyed state. Slots keep arrival order, so a merge whose call finished
early still takes its place in chronology, and grouping depends only on the order of nodes, never on
timing: a replay forms the same groups and hits the journal. A new batch node costs O(log N) merges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_memory.summarize.prompts import Packer, entry_room
from flink_memory.tokens import Budget


def merge_entry(node: dict[str, Any]) -> dict[str, Any]:
    """How a child node appears in a merge prompt: its time range and its text."""
    return {"text": node["text"], "from": node.get("first_ts"), "to": node.get("last_ts")}


@dataclass(frozen=True)
class MergeStart:
    """A merge to run: `node_id` is the id the merged node will carry."""

    node_id: str
    level: int
    children: list[dict[str, Any]]


@dataclass
class SummaryTree:
    agent_id: str
    levels: list[list[dict[str, Any]]] = field(default_factory=list)
    merges_per_level: list[int] = field(default_factory=list)  # node ids count per level: deterministic
    global_version: int = 0
    global_children: list[str] = field(default_factory=list)

    # --- growth --------------------------------------------------------------------------------------

    def add(self, node: dict[str, Any], fan_in: int, budget: Budget) -> list[MergeStart]:
        """A finished node joins the frontier of its level; returns the merges this makes ready."""
        level = node["level"]
        slots = self._level(level)
        for slot in slots:
            if slot["node"] is None and slot["job"] == node["node_id"]:
                slot["node"], slot["job"] = node, None
                break
        else:
            slots.append({"node": node, "job": None})
        return self._form_groups(level, fan_in, budget)

    def _level(self, level: int) -> list[dict[str, Any]]:
        while len(self.levels) < level:
            self.levels.append([])
        return self.levels[level - 1]

    def _form_groups(self, level: int, fan_in: int, budget: Budget) -> list[MergeStart]:
        started: list[MergeStart] = []
        limit = entry_room(budget, "merge", budget.max_output_tokens)
        slots = self._level(level)
        while True:
            group: list[dict[str, Any]] = []
            packer = Packer(budget.counter)
            ready = False
            for slot in slots:
                if slot["node"] is None:
                    break  # an earlier merge is still running: keep chronology, wait for it
                entry = merge_entry(slot["node"])
                if len(group) >= 2 and packer.used + packer.cost(entry) > limit:
                    ready = True  # the next node would not fit this request
                    break
                group.append(slot["node"])
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
            node_id = f"merge-L{level + 1}-{self.merges_per_level[level]:06d}"
            self._level(level + 1).append({"node": None, "job": node_id})
            started.append(MergeStart(node_id=node_id, level=level + 1, children=group))

    # --- the global summary --------------------------------------------------------------------------

    def settled(self) -> bool:
        return all(slot["node"] is not None for slots in self.levels for slot in slots)

    def frontier(self) -> list[dict[str, Any]]:
        """Unmerged nodes, oldest first: higher levels were formed from earlier items."""
        nodes: list[dict[str, Any]] = []
        for slots in reversed(self.levels):
            nodes.extend(slot["node"] for slot in slots if slot["node"] is not None)
        return nodes

    def needs_global(self) -> bool:
        frontier = self.frontier()
        return self.settled() and bool(frontier) and [n["node_id"] for n in frontier] != self.global_children

    def next_global_id(self) -> tuple[str, int]:
        version = self.global_version + 1
        return f"global-v{version:06d}", version

    def global_done(self, children: list[str], version: int) -> None:
        self.global_children = children
        self.global_version = version

    # --- state ---------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "levels": self.levels,
            "merges_per_level": self.merges_per_level,
            "global_version": self.global_version,
            "global_children": self.global_children,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> SummaryTree:
        return cls(**data)
