"""The store's side of the job's memory log (flink_memory.store.applier, flink_memory.store.provisional).

`apply_log` writes committed runs of each agent's two logs in one transaction with the agent's new positions
(`flink_memory_positions`, compared and set), so no entry is skipped or applied twice. A unit the batcher just
accepted is shown at once as a provisional row (`pending:<unit id>`, `pending_seq` its place in the batcher
log), and a deletion or a forget hides the unit's committed rows at once (kind `hidden`) and is remembered as a
pending deletion, so that no older committed write shows them again; the commit that reaches their place
removes the provisional rows and the pending deletions and shows a hidden unit again unless it deleted it. A
provisional write behind the committed position changes nothing (a slow writer, a zombie attempt).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flink_memory.store.rules import UNIT_PREFIX, PositionConflict
from flink_memory.store.schema import (
    APPLIED,
    APPLIED_FILE,
    CONFIRMED_DELETES,
    CONFIRMED_PENDING,
    DELETE_UNIT,
    DROP_ALL_PENDING,
    DROP_PENDING,
    FORGET_UNITS,
    HIDE_UNIT,
    HIDE_UNITS,
    PENDING_DELETE,
    PENDING_PREFIX,
    POSITION,
    SET_POSITION,
    UNHIDE,
    UPSERT_PENDING,
    unit_row,
)
from flink_memory.store.writes import StoreWrites

if TYPE_CHECKING:
    from flink_memory.stages.unit_rows import LogEntry, UnitRows


class LogWrites(StoreWrites):
    """Committed log runs and provisional unit rows (a part of MemoryStore)."""

    def _rows_statements(self, rows: UnitRows) -> list[tuple[str, tuple[Any, ...]]]:
        """A committed unit-rows message: what UnitRows.apply does, as statements of one transaction."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        if rows.forget:
            statements.append((self._sql(FORGET_UNITS), (rows.agent_id,)))
        statements += [(self._sql(DELETE_UNIT), (rows.agent_id, UNIT_PREFIX + u)) for u in rows.delete]
        return statements + self._unit_statements(rows.upsert, rows.seq)

    def write_provisional(self, messages: UnitRows | list[UnitRows]) -> None:
        """Show unit-rows messages at once, before their commit, in one transaction: accepted units as provisional
        rows; a deletion or a forget removes the units' rows now and stays pending until the commit that reaches
        its `seq`."""
        messages = messages if isinstance(messages, list) else [messages]
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for rows in messages:
            agent, ahead = rows.agent_id, (rows.seq, rows.agent_id)
            if rows.forget:
                statements += [(self._sql(HIDE_UNITS), (rows.seq, agent, rows.seq, *ahead)),
                               (self._sql(DROP_ALL_PENDING), (agent, *ahead)),
                               (self._sql(PENDING_DELETE), (agent, "*", rows.seq, *ahead))]
            for unit_id in rows.delete:
                statements += [(self._sql(HIDE_UNIT), (rows.seq, agent, UNIT_PREFIX + unit_id, rows.seq, *ahead)),
                               (self._sql(DROP_PENDING), (agent, PENDING_PREFIX + unit_id, *ahead)),
                               (self._sql(PENDING_DELETE), (agent, unit_id, rows.seq, *ahead))]
            statements += [(self._sql(UPSERT_PENDING), (*unit_row(u, PENDING_PREFIX), rows.seq, *ahead, agent,
                                                        u.unit_id, rows.seq)) for u in rows.upsert]
        statements += self._vector_statements([(u.agent_id, PENDING_PREFIX + u.unit_id, u.text)
                                               for rows in messages for u in rows.upsert])
        if statements:
            self._commit(sorted({rows.agent_id for rows in messages}), statements)

    def log_position(self, agent_id: str) -> tuple[int, int]:
        """(the agent's merger log applied so far, its batcher log applied so far): their last seqs, 0 if none."""
        rows = self._fetch(self._sql(POSITION), (agent_id,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def applied_files(self) -> set[str]:
        """The memory log's files applied to their end."""
        return {row[0] for row in self._fetch(f"SELECT name FROM {APPLIED}", ())}

    def apply_log(self, runs: dict[tuple[str, str], list[LogEntry]], files: Iterable[str] = ()) -> None:
        """Apply runs of committed log entries, each the next consecutive seqs of one agent's log `by` one writer
        ((agent, "batcher" | "merger") -> entries), record the new positions and the `files` applied to their
        end: one transaction. An agent whose position moved meanwhile fails it all (PositionConflict)."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        checks: list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]] = []
        agents = sorted({agent for (agent, _), entries in runs.items() if entries})
        for agent in agents:
            old = self.log_position(agent)
            new = list(old)
            for place, by in enumerate(("merger", "batcher")):
                entries = runs.get((agent, by), [])
                if not entries:
                    continue
                if any(b.seq != a.seq + 1 for a, b in zip(entries, entries[1:])):
                    raise ValueError(f"the {by} log run of {agent} has a gap: {[e.seq for e in entries]}")
                if entries[0].seq != old[place] + 1:
                    raise PositionConflict(f"{self.location}: the {by} log of {agent} is at {old[place]}, not "
                                           f"{entries[0].seq - 1}")
                for entry in entries:
                    if entry.node is not None:
                        statements += self._node_statements([entry.node])
                    elif entry.units is not None:
                        statements += self._rows_statements(entry.units)
                new[place] = entries[-1].seq
            checks.append((self._sql(POSITION), (agent,), [old] if old != (0, 0) else []))
            statements += [(self._sql(UNHIDE), (agent, new[1])), (self._sql(CONFIRMED_PENDING), (agent, new[1])),
                           (self._sql(CONFIRMED_DELETES), (agent, new[1])),
                           (self._sql(SET_POSITION), (agent, new[0], new[1]))]
        statements += [(self._sql(APPLIED_FILE), (name,)) for name in files]
        if statements:
            self._commit(agents, statements, checks)
