"""The writer part of a store: writes of nodes and units, each call one transaction.

A write records the replacements first, deletes the nodes they name, then upserts each node that is not
replaced (PostgreSQL takes an advisory lock per agent for it, SQLite's write lock covers the file). A node is
live while it is in the nodes table: whatever the arrival order, a replaced node is never stored again, and a
replayed node rewrites its own row. The text of a replaced node leaves the store; its id stays in the
replacements table. A unit row leaves with the batch node that covered it unless the replacing batch node
lists it again, or by `delete_units`; a row's vector leaves with it (and is reset when its text changes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store.connection import Statements, StoreConnection
from flink_memory.store.rules import UNIT_PREFIX, as_node, as_unit
from flink_memory.store.schema import (
    COVER,
    DELETE_REPLACED,
    DELETE_UNIT,
    FORGET_UNITS,
    LATEST,
    NODES,
    PENDING_PREFIX,
    PROMOTE,
    RECORD_REPLACED,
    UNCOVERED,
    UPSERT,
    UPSERT_UNIT,
    node_row,
    text_digest,
    unit_row,
)
from flink_memory.store.vector_rows import VectorRows

NO_SEQ = 2**62  # (a unit written outside the log: no pending deletion is of a later seq)


class StoreWriter:
    """Upserts and deletions of nodes and units on a connection, with their vectors; its statements are also
    what the log part writes in its own transactions."""

    def __init__(self, connection: StoreConnection, vectors: VectorRows) -> None:
        self.connection = connection
        self.vectors = vectors

    def upsert(self, nodes: Iterable[SummaryNode | dict[str, Any] | str]) -> int:
        """Write nodes (models, dicts or summaries/ JSON lines) idempotently; returns how many were given.

        A batch node's units point at it; the units of a batch node it replaces that it does not list
        leave the store (a deleted or forgotten unit), with their vectors."""
        parsed = [as_node(n) for n in nodes]
        if not parsed:
            return 0
        agents = sorted({n.agent_id for n in parsed})
        self.connection.commit(agents, self.node_statements(parsed))
        if not self.vectors.embeds_in_writes:
            self.vectors.embed_pending(agents)
        return len(parsed)

    def node_statements(self, nodes: list[SummaryNode]) -> Statements:
        sql, statements = self.connection.sql, []
        for node in nodes:
            for old in node.replaces:
                statements.append((sql(RECORD_REPLACED), (node.agent_id, old)))
                statements.append((sql(DELETE_REPLACED), (node.agent_id, old)))
        for node in nodes:
            statements.append((sql(UPSERT), (*node_row(node), node.agent_id, node.node_id)))
            if node.kind == "batch":
                statements += [(sql(COVER), (node.node_id, node.agent_id, UNIT_PREFIX + unit, node.agent_id,
                                             node.node_id)) for unit in node.children]
        for node in nodes:
            statements += [(sql(UNCOVERED), (node.agent_id, old)) for old in node.replaces]
        return statements + self.vectors.statements([(n.agent_id, n.node_id, n.text) for n in nodes])

    def unit_statements(self, units: list[MemoryUnit], seq: int = NO_SEQ, branch: str = LATEST) -> Statements:
        sql, statements = self.connection.sql, []
        for unit in units:
            committed, pending = UNIT_PREFIX + unit.unit_id, PENDING_PREFIX + unit.unit_id
            if seq != NO_SEQ:
                statements.append((sql(PROMOTE), (committed, unit.agent_id, pending, text_digest(unit.text),
                                                  branch, seq, unit.agent_id, committed)))
            row = unit_row(unit)
            hiding = (unit.agent_id, unit.unit_id, branch, seq, branch)
            statements.append((sql(UPSERT_UNIT), (*row[:2], *hiding, *row[2:], *hiding, *hiding)))
        embedded = self._vectored(units) if seq != NO_SEQ else set()
        return statements + self.vectors.statements([(u.agent_id, UNIT_PREFIX + u.unit_id, u.text) for u in units
                                                     if (u.agent_id, u.unit_id, text_digest(u.text)) not in embedded])

    def _vectored(self, units: list[MemoryUnit]) -> set[tuple[str, str, str]]:
        """(agent, unit id, digest) of these units whose row, committed or provisional (which the commit
        renames), already has a vector of that text: a writer that embeds in its writes does not again."""
        if not units or not self.vectors.embeds_in_writes:
            return set()
        found: set[tuple[str, str, str]] = set()
        by_agent: dict[str, list[str]] = {}
        for unit in units:
            by_agent.setdefault(unit.agent_id, []).extend((UNIT_PREFIX + unit.unit_id, PENDING_PREFIX + unit.unit_id))
        for agent, keys in by_agent.items():
            sql = (f"SELECT node_id, digest FROM {NODES} WHERE agent_id = ? AND node_id IN "
                   f"({', '.join('?' for _ in keys)}) AND vector IS NOT NULL")
            for key, digest in self.connection.query(sql, (agent, *keys)):
                found.add((agent, key.split(":", 1)[1], digest))
        return found

    def upsert_units(self, units: Iterable[MemoryUnit | dict[str, Any] | str]) -> int:
        """Write memory units (committed rows) idempotently; a unit whose text changed (an update) loses its
        old vector. Returns how many were given."""
        parsed = [as_unit(u) for u in units]
        if not parsed:
            return 0
        agents = sorted({u.agent_id for u in parsed})
        self.connection.commit(agents, self.unit_statements(parsed))
        if not self.vectors.embeds_in_writes:
            self.vectors.embed_pending(agents)
        return len(parsed)

    def delete_units(self, agent_id: str, unit_ids: Iterable[str]) -> None:
        """Remove units (deleted, or dropped by a forget) with their vectors."""
        statements = [(self.connection.sql(DELETE_UNIT), (agent_id, UNIT_PREFIX + u)) for u in unit_ids]
        if statements:
            self.connection.commit([agent_id], statements)

    def forget_units(self, agent_id: str) -> None:
        """Remove every committed unit of the agent (a forget) with their vectors; its nodes go when replaced."""
        self.connection.commit([agent_id], [(self.connection.sql(FORGET_UNITS), (agent_id,))])
