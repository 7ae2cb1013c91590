"""The log part of a store: its side of the job's memory log (flink_memory.store.applier,
flink_memory.store.provisional).

`apply_log` writes committed runs of each agent's two logs in one transaction with the agent's new positions
(`flink_memory_positions`, compared and set), so no entry is skipped or applied twice. A unit the batcher just
accepted is shown at once as a provisional row (`pending:<unit id>`, `pending_seq` its place in the batcher
log), and a deletion or a forget hides the unit's committed rows at once (kind `hidden`) and is remembered as a
pending deletion, so that no older committed write shows them again; the commit that reaches their place
removes the provisional rows and the pending deletions and shows a hidden unit again unless it deleted it. A
provisional write behind the committed position changes nothing (a slow writer, a zombie attempt).

Positions are (branch, seq) per log (flink_memory.memory_log.Lineage). A branch's first entry (its `base`: where the
log stood) that does not continue the stored position is a restore of another point: the rows and replacements
that the log's entries outside the new branch's lineage wrote are dropped (each row records the entry that
wrote it last), and the entry's snapshot (what the job holds of the agent) is written. Provisional rows, hidden
rows and pending deletions of an older branch are void at the first commit of a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flink_memory.store.connection import Checks, Statements, StoreConnection
from flink_memory.store.lag import Lag
from flink_memory.store.rules import UNIT_PREFIX, PositionConflict
from flink_memory.store.schema import (
    APPLIED,
    APPLIED_FILE,
    BRANCHES_OF,
    CONFIRMED_DELETES,
    CONFIRMED_PENDING,
    DELETE_UNIT,
    DROP_ALL_PENDING,
    DROP_PENDING,
    FORGET_UNITS,
    HIDE_UNIT,
    HIDE_UNITS,
    MARK_REPLACED,
    MARK_ROW,
    META,
    META_VALUE,
    NODES,
    PENDING_DELETE,
    PENDING_PREFIX,
    POSITION,
    RECORD_BRANCH,
    REPLACED,
    SET_ATTEMPT,
    SET_COVER,
    SET_META,
    SET_POSITION,
    UNHIDE,
    UPSERT_PENDING,
    VOID_AGENTS,
    VOID_DELETES,
    VOID_HIDDEN,
    VOID_PENDING,
    off_chain,
    unit_row,
)
from flink_memory.store.vector_rows import VectorRows
from flink_memory.store.writes import StoreWriter

LAG_KEY = "applier_lag"  # the meta row of the applier's last lag (flink_memory.store.lag.Lag, JSON)
SET_LAG = f"INSERT INTO {META} (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"

if TYPE_CHECKING:
    from flink_memory.memory_log import LogEntry, UnitRows

WRITERS = ("merger", "batcher")


@dataclass(frozen=True)
class Positions:
    """Where an agent's two logs stand in the store: (branch, last applied seq) each, and their history."""

    merger: tuple[str, int] = ("", 0)
    batcher: tuple[str, int] = ("", 0)
    history: str = ""

    def of(self, by: str) -> tuple[str, int]:
        return self.merger if by == "merger" else self.batcher

    @property
    def row(self) -> tuple[Any, ...]:
        return (self.merger[1], self.batcher[1], self.merger[0], self.batcher[0], self.history)


class LogWriter:
    """Committed log runs and provisional unit rows on a connection, written with the writer's statements for
    nodes and units and the vectors' for their vectors."""

    def __init__(self, connection: StoreConnection, vectors: VectorRows, writer: StoreWriter) -> None:
        self.connection = connection
        self.vectors = vectors
        self.writer = writer
        self.writer_attempt = 0  # the attempt of the job's task this store writes provisional rows for

    def _rows_statements(self, rows: UnitRows) -> Statements:
        """A committed unit-rows message: what UnitRows.apply does, as statements of one transaction."""
        sql = self.connection.sql
        statements: Statements = []
        if rows.forget:
            statements.append((sql(FORGET_UNITS), (rows.agent_id,)))
        statements += [(sql(DELETE_UNIT), (rows.agent_id, UNIT_PREFIX + u)) for u in rows.delete]
        return statements + self.writer.unit_statements(rows.upsert, rows.seq, rows.branch)

    def write_provisional(self, messages: UnitRows | list[UnitRows]) -> None:
        """Show unit-rows messages at once, before their commit, in one transaction: accepted units as provisional
        rows; a deletion or a forget removes the units' rows now and stays pending until the commit that reaches
        its `seq`."""
        sql = self.connection.sql
        messages = messages if isinstance(messages, list) else [messages]
        attempt = self.writer_attempt
        statements: Statements = []
        for rows in messages:
            agent, seq, branch = rows.agent_id, rows.seq, rows.branch
            ahead = (seq, rows.history, branch, branch, agent, attempt, branch)
            if rows.forget:
                statements += [(sql(HIDE_UNITS), (seq, branch, attempt, agent, branch, branch, seq, *ahead)),
                               (sql(DROP_ALL_PENDING), (agent, *ahead)),
                               (sql(PENDING_DELETE), (agent, "*", seq, branch, attempt, *ahead))]
            for unit_id in rows.delete:
                statements += [(sql(HIDE_UNIT), (seq, branch, attempt, agent, UNIT_PREFIX + unit_id, branch,
                                                 branch, seq, *ahead)),
                               (sql(DROP_PENDING), (agent, PENDING_PREFIX + unit_id, *ahead)),
                               (sql(PENDING_DELETE), (agent, unit_id, seq, branch, attempt, *ahead))]
            statements += [(sql(UPSERT_PENDING), (*unit_row(u, PENDING_PREFIX), seq, branch, attempt, *ahead,
                                                  agent, u.unit_id, branch, seq, branch)) for u in rows.upsert]
        statements += self.vectors.statements([(u.agent_id, PENDING_PREFIX + u.unit_id, u.text)
                                                for rows in messages for u in rows.upsert])
        if statements:
            self.connection.commit(sorted({rows.agent_id for rows in messages}), statements)

    def restart_attempt(self, branch: str, attempt: int) -> None:
        """The job's provisional writer (re)starts as `attempt` of `branch` (a failover keeps the branch): what an
        earlier attempt showed and no commit took is void now (hidden units shown again, its provisional rows
        and pending deletions gone: the replay shows its own), and a late write of one changes nothing. This
        store's provisional writes are then of `attempt`."""
        sql = self.connection.sql
        self.writer_attempt = attempt
        agents = sorted(row[0] for row in self.connection.query(VOID_AGENTS, (branch, attempt)))
        voids = (VOID_HIDDEN, VOID_PENDING, VOID_DELETES)
        self.connection.commit(agents, [(sql(void), (branch, attempt)) for void in (SET_ATTEMPT, *voids)])

    def log_position(self, agent_id: str) -> tuple[int, int]:
        """(the agent's merger log applied so far, its batcher log applied so far): their last seqs, 0 if none."""
        positions = self.log_positions(agent_id)
        return positions.merger[1], positions.batcher[1]

    def log_positions(self, agent_id: str) -> Positions:
        """Where the agent's logs stand: their branches and last seqs, and the history they belong to."""
        rows = self.connection.query(POSITION, (agent_id,))
        if not rows:
            return Positions()
        merger, batcher, merger_branch, batcher_branch, history = rows[0]
        return Positions((merger_branch or "", int(merger)), (batcher_branch or "", int(batcher)), history or "")

    def history(self) -> str | None:
        """The history of the job this store follows (flink_memory.history), None before one claimed it."""
        rows = self.connection.query(META_VALUE, ("history",))
        return str(rows[0][0]) if rows else None

    def claim_history(self, history: str) -> None:
        """Record the history a job starting on this store writes (the first one's stays)."""
        self.connection.commit([], [(self.connection.sql(SET_META), ("history", history))])

    def applied_files(self) -> set[str]:
        """The memory log's files applied to their end."""
        return {row[0] for row in self.connection.fetch(f"SELECT name FROM {APPLIED}", ())}

    def apply_log(self, runs: dict[tuple[str, str], list[LogEntry]], files: Iterable[str] = ()) -> None:
        """Apply runs of committed log entries, each the next entries of one agent's log `by` one writer
        ((agent, "batcher" | "merger") -> entries: consecutive seqs of one branch, or a branch's first entry
        and the seqs after it), record the new positions and the `files` applied to their end: one
        transaction. An agent whose position moved meanwhile fails it all (PositionConflict)."""
        sql, location = self.connection.sql, self.connection.location
        statements: Statements = []
        checks: Checks = []
        agents = sorted({agent for (agent, _), entries in runs.items() if entries})
        for agent in agents:
            old = self.log_positions(agent)
            moved: dict[str, tuple[str, int]] = {}
            history = old.history
            for by in WRITERS:
                entries = runs.get((agent, by), [])
                branch, at = old.of(by)
                for i, entry in enumerate(entries):
                    if entry.base is not None:
                        if i == 0 and entry.branch <= branch:  # (another applier took this branch already)
                            raise PositionConflict(f"{location}: the {by} log of {agent} is at branch "
                                                   f"{branch!r}, not before {entry.branch!r}")
                        statements += self._fork_statements(entry, (branch, at))
                    elif (entry.branch, entry.seq) != (branch, at + 1):
                        if i == 0:
                            raise PositionConflict(f"{location}: the {by} log of {agent} is at {branch!r}:{at}, "
                                                   f"not {entry.branch!r}:{entry.seq - 1}")
                        raise ValueError(f"the {by} log run of {agent} has a gap: "
                                         f"{[(e.branch, e.seq) for e in entries]}")
                    elif entry.node is not None:
                        statements += self.writer.node_statements([entry.node])
                        statements += self._marks(entry, [entry.node.node_id], entry.node.replaces)
                    elif entry.units is not None:
                        statements += self._rows_statements(entry.units)
                        statements += self._marks(entry, [UNIT_PREFIX + u.unit_id for u in entry.units.upsert])
                    branch, at, history = entry.branch, entry.seq, entry.history or history
                moved[by] = (branch, at)
            new = Positions(moved["merger"], moved["batcher"], history)
            checks.append((sql(POSITION), (agent,), [old.row] if old != Positions() else []))
            (branch, at) = new.batcher
            statements += [(sql(UNHIDE), (agent, branch, at, branch)),
                           (sql(CONFIRMED_PENDING), (agent, branch, at, branch)),
                           (sql(CONFIRMED_DELETES), (agent, branch, at, branch)),
                           (sql(SET_POSITION), (agent, *new.row))]
        statements += [(sql(APPLIED_FILE), (name,)) for name in files]
        if statements:
            self.connection.commit(agents, statements, checks)

    def record_applier_lag(self, lag: Lag) -> None:
        """The applier's lag after its last poll, for readers (`flink-memory serve`'s health answer)."""
        self.connection.write([], [(self.connection.sql(SET_LAG), (LAG_KEY, lag.model_dump_json()))])

    def applier_lag(self) -> Lag | None:
        """The lag the applier last recorded; None if no applier has written this store yet."""
        try:
            value = self.connection.meta(LAG_KEY)
        except self.connection.missing_table:
            return None
        return Lag.model_validate_json(value) if value else None

    def _marks(self, entry: LogEntry, keys: list[str], replaces: Iterable[str] = ()) -> Statements:
        """Record which entry wrote these rows and replacements (what a restore of another point drops)."""
        sql = self.connection.sql
        mark = (entry.by, entry.branch, entry.seq, entry.agent_id)
        return ([(sql(MARK_ROW), (*mark, key)) for key in keys]
                + [(sql(MARK_REPLACED), (*mark, old)) for old in replaces])

    def _fork_statements(self, entry: LogEntry, stored: tuple[str, int]) -> Statements:
        """A branch's first entry: recorded; when it does not continue the stored position (a restore of an
        older point, or a log the store never followed), the rows the log wrote outside the branch's lineage
        go and the snapshot comes in."""
        sql = self.connection.sql
        assert entry.base is not None
        agent, by, base = entry.agent_id, entry.by, entry.base
        statements: Statements = [(sql(RECORD_BRANCH), (agent, by, entry.branch, base.branch, base.seq))]
        if (base.branch, base.seq) == stored:
            return statements
        branches = self.connection.query(BRANCHES_OF, (agent, by))
        known = {branch: (parent, int(seq)) for branch, parent, seq in branches}
        chain, branch = [(base.branch, base.seq)], base.branch
        while branch in known and len(chain) <= len(known):
            branch, seq = known[branch]
            chain.append((branch, seq))
        statements += [(sql(off_chain(NODES, chain)), (agent, by)),
                       (sql(off_chain(REPLACED, chain)), (agent, by))]
        snapshot = entry.snapshot
        if snapshot is None:
            return statements
        units = [unit for unit, _ in snapshot.units]
        statements += self.writer.unit_statements(units, entry.seq, entry.branch)
        statements += [(sql(SET_COVER), (covered, agent, UNIT_PREFIX + unit.unit_id))
                       for unit, covered in snapshot.units if covered is not None]
        statements += self._marks(entry, [UNIT_PREFIX + unit.unit_id for unit in units])
        if snapshot.nodes:
            statements += self.writer.node_statements(snapshot.nodes)
            statements += self._marks(entry, [n.node_id for n in snapshot.nodes],
                                      [old for n in snapshot.nodes for old in n.replaces])
        return statements
