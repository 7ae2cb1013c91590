"""The reader part of a store: what `flink-memory show`, the service's browse pages and the agents' bridge read
(the current memory, nodes, units, a timeline). Recall is flink_memory.store.recall's. Reads return
`SummaryNode` models (`flink_memory.records`) and plain values, never raw rows.
"""

from __future__ import annotations

import json
from typing import Any

from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store.connection import StoreConnection
from flink_memory.store.rules import UNIT_PREFIX
from flink_memory.store.schema import (
    AGENTS,
    ALL_OF_AGENT,
    CURRENT,
    HAS_AGENT,
    NODE,
    NODES,
    PENDING_PREFIX,
    REPLACED,
    UNITS_OF_AGENT,
)


class StoreReader:
    """Reads of live nodes and units on a connection."""

    def __init__(self, connection: StoreConnection) -> None:
        self.connection = connection

    def current(self, agent_id: str) -> SummaryNode | None:
        """The agent's current memory: its live global node with the highest version."""
        found = self.connection.bodies(CURRENT, (agent_id,))
        return found[0] if found else None

    def node(self, agent_id: str, node_id: str) -> SummaryNode | None:
        """A live node by id (None when it was never written or has been replaced)."""
        found = self.connection.bodies(NODE, (agent_id, node_id))
        return found[0] if found else None

    def children(self, agent_id: str, node_id: str) -> list[SummaryNode]:
        """The stored child nodes of a merge or global node, in the order of its `children`. A batch node's
        children are memory units, not nodes: []. Children a retention mode did not write are left out."""
        parent = self.node(agent_id, node_id)
        if parent is None or parent.kind == "batch" or not parent.children:
            return []
        marks = ", ".join("?" for _ in parent.children)
        sql = f"SELECT body FROM {NODES} WHERE agent_id = ? AND node_id IN ({marks})"
        found = {n.node_id: n for n in self.connection.bodies(sql, (agent_id, *parent.children))}
        return [found[c] for c in parent.children if c in found]

    def nodes(self, agent_id: str) -> list[SummaryNode]:
        """Every live node of the agent, batch nodes first (by specificity, then id)."""
        return self.connection.bodies(ALL_OF_AGENT, (agent_id,))

    def units(self, agent_id: str) -> list[tuple[MemoryUnit, str | None]]:
        """Every live memory unit of the agent with the batch node that covers it (None: not yet), by id; a
        provisional row (not committed yet) stands for the committed row of its unit."""
        found: dict[str, tuple[MemoryUnit, str | None]] = {}
        for key, body, covered_by in self.connection.query(UNITS_OF_AGENT, (agent_id,)):
            unit = MemoryUnit.model_validate_json(body)
            if key.startswith(PENDING_PREFIX) or unit.unit_id not in found:
                found[unit.unit_id] = (unit, covered_by)
        return [found[unit_id] for unit_id in sorted(found)]

    def units_by_id(self, agent_id: str, unit_ids: list[str]) -> list[tuple[MemoryUnit, str | None, bool]]:
        """These live units of the agent (a batch node's children), in the order asked, each with its covering
        batch node and whether it is provisional (its row stands for the committed one); ids not stored are
        left out."""
        if not unit_ids:
            return []
        keys = [p + u for u in unit_ids for p in (UNIT_PREFIX, PENDING_PREFIX)]
        sql = (f"SELECT node_id, body, covered_by FROM {NODES} WHERE agent_id = ? AND kind = 'unit' "
               f"AND node_id IN ({', '.join('?' for _ in keys)})")
        found: dict[str, tuple[MemoryUnit, str | None, bool]] = {}
        for key, body, covered_by in self.connection.query(sql, (agent_id, *keys)):
            unit = MemoryUnit.model_validate_json(body)
            pending = key.startswith(PENDING_PREFIX)
            if pending or unit.unit_id not in found:
                found[unit.unit_id] = (unit, covered_by, pending)
        return [found[u] for u in unit_ids if u in found]

    def timeline(self, agent_id: str, offset: int = 0, limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        """A page of the agent's live units and nodes, newest first (by the end of the time each covers, then
        id), and how many there are: (rows as dicts of node_id, kind, level, version, item_count, first_ts,
        last_ts, text, replaces, provisional, covered_by), total."""
        total = int(self.connection.query(f"SELECT COUNT(*) FROM {NODES} WHERE agent_id = ? AND kind <> 'hidden'",
                                          (agent_id,))[0][0])
        sql = (f"SELECT node_id, kind, level, version, item_count, first_ts, last_ts, text, body, covered_by "
               f"FROM {NODES} WHERE agent_id = ? AND kind <> 'hidden' "
               f"ORDER BY COALESCE(last_ts, '') DESC, node_id DESC LIMIT ? OFFSET ?")
        rows = []
        for key, kind, level, version, items, first_ts, last_ts, text, body, covered_by in self.connection.query(
                sql, (agent_id, limit, offset)):
            unit = kind == "unit"
            replaces = [] if unit else json.loads(body).get("replaces", [])
            rows.append({"node_id": key.split(":", 1)[1] if unit else key, "kind": kind, "level": level,
                         "version": version, "item_count": items, "first_ts": first_ts, "last_ts": last_ts,
                         "text": text, "replaces": replaces, "provisional": key.startswith(PENDING_PREFIX),
                         "covered_by": covered_by if unit else None})
        return rows, total

    def replaced_count(self, agent_id: str) -> int:
        """How many node ids of the agent a written node replaced (re-made or retracted nodes)."""
        return int(self.connection.query(f"SELECT COUNT(*) FROM {REPLACED} WHERE agent_id = ?", (agent_id,))[0][0])

    def parents(self, agent_id: str) -> dict[str, str]:
        """Each child id of the agent's live nodes (node ids and, under batch nodes, unit ids) -> its parent."""
        sql = f"SELECT node_id, body FROM {NODES} WHERE agent_id = ? AND kind IN ('batch', 'merge', 'global')"
        out: dict[str, str] = {}
        for node_id, body in self.connection.query(sql, (agent_id,)):
            for child in json.loads(body)["children"]:
                out[child] = node_id
        return out

    def agent_vectors(self, agent_id: str) -> tuple[int, int]:
        """(the agent's rows, those with a vector)."""
        rows, embedded = self.connection.query(f"SELECT COUNT(*), COUNT(vector) FROM {NODES} WHERE agent_id = ?",
                                               (agent_id,))[0]
        return int(rows), int(embedded)

    def agents(self) -> list[str]:
        """Agents with at least one live node or unit, sorted."""
        return [row[0] for row in self.connection.query(AGENTS, ())]

    def has_agent(self, agent_id: str) -> bool:
        """True when the agent has a live node or unit (one indexed lookup, not a scan of every agent)."""
        return bool(self.connection.query(HAS_AGENT, (agent_id,)))
