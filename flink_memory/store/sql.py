"""The live-memory store: summary nodes and memory units in SQLite (one file, WAL) or PostgreSQL (psycopg 3),
one schema (flink_memory.store.sqlite, flink_memory.store.postgres).

The tables and statements are flink_memory.store.schema's. A write records the replacements first, deletes the
nodes they name, then upserts each node that is not replaced, in one transaction per call (PostgreSQL takes an
advisory lock per agent for it, SQLite's write lock covers the file). A node is live while it is in the
nodes table: whatever the arrival order, a replaced node is never stored again, and a replayed node
rewrites its own row. The text of a replaced node leaves the store; its id stays in the replacements table.
A unit row leaves with the batch node that covered it unless the replacing batch node lists it again, or
by `delete_units`; a row's vector leaves with it (and is reset when its text changes).

The store follows the job's memory log (flink_memory.store.applier): `apply_log` writes committed runs of
each agent's two logs in one transaction with the agent's new positions (`flink_memory_positions`, compared
and set), so no entry is skipped or applied twice. A unit the batcher just accepted is shown at once as a
provisional row (`pending:<unit id>`, `pending_seq` its place in the batcher log), and a deletion or a forget
hides the unit's committed rows at once (kind `hidden`) and is remembered as a pending deletion, so that no
older committed write shows them again; the commit that reaches their place removes the provisional rows and
the pending deletions and shows a hidden unit again unless it deleted it. A provisional write behind the
committed position changes nothing (a slow writer, a zombie attempt).

Vectors: with an inline model (the static one) a write carries its rows' vectors in the same transaction; a
slower model's follow in a transaction of their own (a row not yet embedded is found by keyword). Either way a
row reuses the vector of a live row with the same text digest and model (a replay embeds nothing again).

`MemoryStore` holds every statement and read rule; a store supplies its connection, schema and search.
Reads return `SummaryNode` models (`flink_memory.records`) and `Recalled` hits, never raw rows.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from flink_memory.meanwhile import meanwhile
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store.diversity import DIVERSITY, WINDOW, Ranked, diversify, stands_for
from flink_memory.store.ranking import Candidate, Fusion, TermCounts, rank
from flink_memory.store.rules import (
    UNIT_KIND,
    UNIT_PREFIX,
    PositionConflict,
    Recalled,
    StoreError,
    StoreNotFound,
    as_node,
    as_unit,
    query_terms,
)
from flink_memory.store.schema import (
    AGENTS,
    ALL_OF_AGENT,
    APPLIED,
    APPLIED_FILE,
    BUMP,
    CONFIRMED_DELETES,
    CONFIRMED_PENDING,
    COVER,
    CURRENT,
    DELETE_REPLACED,
    DELETE_UNIT,
    DROP_ALL_PENDING,
    DROP_PENDING,
    FORGET_UNITS,
    GENERATION,
    HAS_AGENT,
    HIDDEN_KIND,
    HIDE_UNIT,
    HIDE_UNITS,
    HIT,
    HIT_WIDTH,
    META,
    META_VALUE,
    NODE,
    NODES,
    PENDING_DELETE,
    PENDING_PREFIX,
    POSITION,
    PROMOTE,
    RECORD_REPLACED,
    ROWS_OF_AGENT,
    SCHEMA,
    SCHEMA_VERSION,
    SET_META,
    SET_POSITION,
    SET_VECTOR,
    UNCOVERED,
    UNEMBEDDED,
    UNHIDE,
    UNITS_OF_AGENT,
    UPSERT,
    UPSERT_PENDING,
    UPSERT_UNIT,
    VECTORS_OF_AGENT,
    hit,
    node_row,
    text_digest,
    unit_row,
)
from flink_memory.store.vectors import VectorCache, cosines, nearest

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder
    from flink_memory.stages.unit_rows import LogEntry, UnitRows

Mode = Literal["hybrid", "keyword", "vector"]
KEYWORD_CANDIDATES = 400  # rows sharing a term with the question (MemoryStore._matching)
VECTOR_CANDIDATES = 50  # nearest rows by cosine

CHILDREN_CACHED_AGENTS = 64  # agents whose nodes' child ids a reader keeps (recall's diversity)
NO_SEQ = 2**62  # (a unit written outside the log: no pending deletion is of a later seq)


class MemoryStore(ABC):
    """Upserts and reads on one schema; `open_store` picks the store. Use as a context manager.

    With an `embedder`, writes embed their rows (in the write itself when the embedder is `inline`, else after
    committing them) and recall can rank by meaning."""

    placeholder = "?"
    location: str
    embedder: Embedder | None = None
    diversity: float = DIVERSITY  # recall's default weight of distinct results (recall.diversity)
    missing_table: tuple[type[Exception], ...] = ()  # what the driver raises for a table that is not there
    _vector_cache: VectorCache | None = None  # this reader's per-agent matrices and row counts
    _children_cache: dict[tuple[str, int], dict[str, list[str]]] | None = None  # (agent, generation): node -> ids
    _model_recorded = False  # this writer checked (and recorded) its embedder's model

    @abstractmethod
    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]],
               checks: list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]] = ()) -> None:  # type: ignore[assignment]
        """Run the statements in one transaction, holding the write lock of each agent; first each check's
        query must return its rows exactly, else nothing is written (PositionConflict)."""

    @abstractmethod
    def _matching(self, agent_id: str, terms: list[str], limit: int, *,
                  with_vectors: bool = False) -> list[tuple[Any, ...]]:
        """HIT columns of the agent's rows holding any of `terms` (full text): all of them when there are at
        most `limit`, else `limit` of those likely to rank best (by the engine's own rank or cheaper)."""

    @abstractmethod
    def close(self) -> None: ...

    def _commit(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]],
                checks: list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]] = ()) -> None:  # type: ignore[assignment]
        """`_write`, and the agents' generations move on (readers reload their cached vectors)."""
        self._write(agents, statements + [(self._sql(BUMP), (agent,)) for agent in agents], checks)

    def _generation(self, agent_id: str) -> int | None:
        """The agent's generation (0: never written); None for a store written before generations."""
        try:
            rows = self._fetch(self._sql(GENERATION), (agent_id,))
        except self.missing_table:
            return None
        return int(rows[0][0]) if rows else 0

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self.placeholder)

    def _bodies(self, sql: str, params: tuple[Any, ...]) -> list[SummaryNode]:
        return [SummaryNode.model_validate_json(row[0]) for row in self._fetch(self._sql(sql), params)]

    def _check_schema(self) -> None:
        try:
            rows = self._fetch(self._sql(SCHEMA), ())
        except self.missing_table:
            raise StoreNotFound(f"{self.location} holds no flink-memory store") from None
        if not rows:
            raise StoreNotFound(f"{self.location} holds no flink-memory store (no schema version)")
        if rows[0][0] != str(SCHEMA_VERSION):
            raise StoreError(f"store schema version {rows[0][0]} at {self.location} is not readable by this "
                             f"release (it reads version {SCHEMA_VERSION})")

    def _meta(self, key: str) -> str | None:
        rows = self._fetch(self._sql(META_VALUE), (key,))
        return rows[0][0] if rows else None

    def upsert(self, nodes: Iterable[SummaryNode | dict[str, Any] | str]) -> int:
        """Write nodes (models, dicts or summaries/ JSON lines) idempotently; returns how many were given.

        A batch node's units point at it; the units of a batch node it replaces that it does not list
        leave the store (a deleted or forgotten unit), with their vectors."""
        parsed = [as_node(n) for n in nodes]
        if not parsed:
            return 0
        agents = sorted({n.agent_id for n in parsed})
        self._commit(agents, self._node_statements(parsed))
        if not self.embeds_in_writes:
            self.embed_pending(agents)
        return len(parsed)

    def _node_statements(self, nodes: list[SummaryNode]) -> list[tuple[str, tuple[Any, ...]]]:
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for node in nodes:
            for old in node.replaces:
                statements.append((self._sql(RECORD_REPLACED), (node.agent_id, old)))
                statements.append((self._sql(DELETE_REPLACED), (node.agent_id, old)))
        for node in nodes:
            statements.append((self._sql(UPSERT), (*node_row(node), node.agent_id, node.node_id)))
            if node.kind == "batch":
                statements += [(self._sql(COVER), (node.node_id, node.agent_id, UNIT_PREFIX + unit, node.agent_id,
                                                   node.node_id)) for unit in node.children]
        for node in nodes:
            statements += [(self._sql(UNCOVERED), (node.agent_id, old)) for old in node.replaces]
        return statements + self._vector_statements([(n.agent_id, n.node_id, n.text) for n in nodes])

    def _unit_statements(self, units: list[MemoryUnit], seq: int = NO_SEQ) -> list[tuple[str, tuple[Any, ...]]]:
        statements = []
        for unit in units:
            committed, pending = UNIT_PREFIX + unit.unit_id, PENDING_PREFIX + unit.unit_id
            if seq != NO_SEQ:
                statements.append((self._sql(PROMOTE), (committed, unit.agent_id, pending, text_digest(unit.text), seq,
                                                        unit.agent_id, committed)))
            row = unit_row(unit)
            hiding = (unit.agent_id, unit.unit_id, seq)
            statements.append((self._sql(UPSERT_UNIT), (*row[:2], *hiding, *row[2:], *hiding)))
        embedded = self._vectored(units) if seq != NO_SEQ else set()
        return statements + self._vector_statements([(u.agent_id, UNIT_PREFIX + u.unit_id, u.text) for u in units
                                                     if (u.agent_id, u.unit_id, text_digest(u.text)) not in embedded])

    def _vectored(self, units: list[MemoryUnit]) -> set[tuple[str, str, str]]:
        """(agent, unit id, digest) of these units whose row, committed or provisional (which the commit
        renames), already has a vector of that text: a writer that embeds in its writes does not again."""
        if not units or not self.embeds_in_writes:
            return set()
        found: set[tuple[str, str, str]] = set()
        by_agent: dict[str, list[str]] = {}
        for unit in units:
            by_agent.setdefault(unit.agent_id, []).extend((UNIT_PREFIX + unit.unit_id, PENDING_PREFIX + unit.unit_id))
        for agent, keys in by_agent.items():
            sql = (f"SELECT node_id, digest FROM {NODES} WHERE agent_id = ? AND node_id IN "
                   f"({', '.join('?' for _ in keys)}) AND vector IS NOT NULL")
            for key, digest in self._fetch(self._sql(sql), (agent, *keys)):
                found.add((agent, key.split(":", 1)[1], digest))
        return found

    def upsert_units(self, units: Iterable[MemoryUnit | dict[str, Any] | str]) -> int:
        """Write memory units (committed rows) idempotently; a unit whose text changed (an update) loses its
        old vector. Returns how many were given."""
        parsed = [as_unit(u) for u in units]
        if not parsed:
            return 0
        agents = sorted({u.agent_id for u in parsed})
        self._commit(agents, self._unit_statements(parsed))
        if not self.embeds_in_writes:
            self.embed_pending(agents)
        return len(parsed)

    def delete_units(self, agent_id: str, unit_ids: Iterable[str]) -> None:
        """Remove units (deleted, or dropped by a forget) with their vectors."""
        statements = [(self._sql(DELETE_UNIT), (agent_id, UNIT_PREFIX + u)) for u in unit_ids]
        if statements:
            self._commit([agent_id], statements)

    def forget_units(self, agent_id: str) -> None:
        """Remove every committed unit of the agent (a forget) with their vectors; its nodes go when replaced."""
        self._commit([agent_id], [(self._sql(FORGET_UNITS), (agent_id,))])

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
                statements += [(self._sql(HIDE_UNITS), (rows.seq, agent, *ahead)),
                               (self._sql(DROP_ALL_PENDING), (agent, *ahead)),
                               (self._sql(PENDING_DELETE), (agent, "*", rows.seq, *ahead))]
            for unit_id in rows.delete:
                statements += [(self._sql(HIDE_UNIT), (rows.seq, agent, UNIT_PREFIX + unit_id, *ahead)),
                               (self._sql(DROP_PENDING), (agent, PENDING_PREFIX + unit_id, *ahead)),
                               (self._sql(PENDING_DELETE), (agent, unit_id, rows.seq, *ahead))]
            statements += [(self._sql(UPSERT_PENDING), (*unit_row(u, PENDING_PREFIX), rows.seq, *ahead))
                           for u in rows.upsert]
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

    def embedding_model(self) -> str | None:
        """The model of the store's vectors (None: no vectors yet)."""
        return self._meta("embedding_model")

    def vector_counts(self) -> tuple[int, int]:
        """(rows, rows with a vector) over the whole store: how far the vectors are behind the rows."""
        rows, embedded = self._fetch(f"SELECT COUNT(*), COUNT(vector) FROM {NODES}", ())[0]
        return int(rows), int(embedded)

    def _check_model(self, embedder: Embedder, *, record: bool) -> bool:
        """True when the store's vectors are of `embedder`'s model (recording it when `record` and none is
        recorded yet); False when the store holds no vectors yet. Another model: StoreError."""
        name = self.embedding_model()
        if name is None and record:
            self._write([], [(self._sql(SET_META), ("embedding_model", embedder.name)),
                             (self._sql(SET_META), ("embedding_dim", str(embedder.dim)))])
            name = self._meta("embedding_model")
        if name is None:
            return False
        dim = self._meta("embedding_dim")
        if name != embedder.name or dim != str(embedder.dim):
            raise StoreError(f"the vectors of {self.location} are of the embedding model {name} ({dim} dimensions), "
                             f"not {embedder.name} ({embedder.dim}): set embeddings.provider and embeddings.model "
                             "to the store's, or recall with --mode keyword")
        return True

    def forget_vectors(self) -> int:
        """Drop every vector and the record of their model, in one transaction, so that `embed_pending` gives
        each row a vector of another model (the first vector written records it). Returns the rows cleared.
        Stop the job's writers first, or restart them with the new model: a writer of the old model would
        record it again."""
        count = self.vector_counts()[1]
        self._write([], [(f"UPDATE {NODES} SET vector = NULL WHERE vector IS NOT NULL", ()),
                         (f"DELETE FROM {META} WHERE key IN ('embedding_model', 'embedding_dim')", ())])
        self._model_recorded = False
        return count

    @property
    def embeds_in_writes(self) -> bool:
        """Whether writes carry their rows' vectors (an embedder fast enough to run inside the write, such as
        the static model); else `embed_pending` gives them after the commit, or a background thread does."""
        return self.embedder is not None and self.embedder.inline

    def _vector_statements(self, rows: list[tuple[str, str, str]]) -> list[tuple[str, tuple[Any, ...]]]:
        """SET_VECTOR statements for (agent, row key, text) just upserted in the same transaction, when writes
        carry their vectors (`embeds_in_writes`); none otherwise."""
        rows = [row for row in rows if row[2]]
        if not rows or not self.embeds_in_writes:
            return []
        assert self.embedder is not None
        if not self._model_recorded:
            self._model_recorded = self._check_model(self.embedder, record=True)
        vectors = self.embedder.passages([text for _, _, text in rows])
        return [(self._sql(SET_VECTOR), (self._vector_value(v), agent, key, text_digest(text)))
                for (agent, key, text), v in zip(rows, vectors)]

    def embed_pending(self, agents: Iterable[str]) -> int:
        """Embed the agents' rows that have no vector yet (reusing the vector of a live row with the same
        text); returns how many rows got one. Without an embedder: 0."""
        if self.embedder is None:
            return 0
        done = 0
        for agent in agents:
            rows = self._fetch(self._sql(UNEMBEDDED), (agent,))
            if not rows:
                continue
            vectors = self.embedder.passages([text for _, text, _ in rows])
            self._check_model(self.embedder, record=True)
            self._commit([agent], [(self._sql(SET_VECTOR), (self._vector_value(v), agent, key, digest))
                                  for (key, _, digest), v in zip(rows, vectors)])
            done += len(rows)
        return done

    def _vector_value(self, vector: Any) -> Any:
        """A vector as SET_VECTOR writes it: little-endian float32 bytes (PostgreSQL's pgvector column: text)."""
        from flink_memory.embeddings import to_bytes
        return to_bytes(vector)

    def current(self, agent_id: str) -> SummaryNode | None:
        """The agent's current memory: its live global node with the highest version."""
        found = self._bodies(CURRENT, (agent_id,))
        return found[0] if found else None

    def node(self, agent_id: str, node_id: str) -> SummaryNode | None:
        """A live node by id (None when it was never written or has been replaced)."""
        found = self._bodies(NODE, (agent_id, node_id))
        return found[0] if found else None

    def children(self, agent_id: str, node_id: str) -> list[SummaryNode]:
        """The stored child nodes of a merge or global node, in the order of its `children`. A batch node's
        children are memory units, not nodes: []. Children a retention mode did not write are left out."""
        parent = self.node(agent_id, node_id)
        if parent is None or parent.kind == "batch" or not parent.children:
            return []
        marks = ", ".join("?" for _ in parent.children)
        sql = f"SELECT body FROM {NODES} WHERE agent_id = ? AND node_id IN ({marks})"
        found = {n.node_id: n for n in self._bodies(sql, (agent_id, *parent.children))}
        return [found[c] for c in parent.children if c in found]

    def nodes(self, agent_id: str) -> list[SummaryNode]:
        """Every live node of the agent, batch nodes first (by specificity, then id)."""
        return self._bodies(ALL_OF_AGENT, (agent_id,))

    def units(self, agent_id: str) -> list[tuple[MemoryUnit, str | None]]:
        """Every live memory unit of the agent with the batch node that covers it (None: not yet), by id; a
        provisional row (not committed yet) stands for the committed row of its unit."""
        found: dict[str, tuple[MemoryUnit, str | None]] = {}
        for key, body, covered_by in self._fetch(self._sql(UNITS_OF_AGENT), (agent_id,)):
            unit = MemoryUnit.model_validate_json(body)
            if key.startswith(PENDING_PREFIX) or unit.unit_id not in found:
                found[unit.unit_id] = (unit, covered_by)
        return [found[unit_id] for unit_id in sorted(found)]

    def agents(self) -> list[str]:
        """Agents with at least one live node or unit, sorted."""
        return [row[0] for row in self._fetch(self._sql(AGENTS), ())]

    def has_agent(self, agent_id: str) -> bool:
        """True when the agent has a live node or unit (one indexed lookup, not a scan of every agent)."""
        return bool(self._fetch(self._sql(HAS_AGENT), (agent_id,)))

    def recall(self, agent_id: str, query: str, k: int = 5, mode: Mode | None = None,
               fusion: Fusion = "weighted", diversity: float | None = None) -> list[Recalled]:
        """The agent's k live units and nodes that best match `query` (natural language), best first.

        `mode`: keyword (full text only), vector (by meaning only) or hybrid (both, fused); None: hybrid
        when the store was opened with an embedder, else keyword. Ranking: flink_memory.store.ranking.
        `diversity` (0..1; None: the store's `diversity`, recall.diversity): how much results that only
        repeat the matching units of results above them give way (flink_memory.store.diversity); a hit
        names those it stands for in `folds`. A question without meaningful words gives []; so does an
        empty memory."""
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        mode = mode or ("hybrid" if self.embedder is not None else "keyword")
        if mode != "keyword" and self.embedder is None:
            raise StoreError(f"recall --mode {mode} needs an embedding model (embeddings.provider is none)")
        embedder = self.embedder if mode != "keyword" else None  # (the question embedded while the store searches:)
        question = embedder.query_meanwhile(query) if embedder and self._check_model(embedder, record=False) else None
        try:
            by_meaning = self._nearest_meanwhile(agent_id, question) if question is not None else None
        except BaseException:
            with contextlib.suppress(Exception):
                question()  # (waited for: an embedder is never used by two of its calls at once)
            raise
        counts = TermCounts(terms)
        rows: dict[str, tuple[Any, ...]] = {}
        try:
            if mode != "vector":
                matching = self._matching(agent_id, terms, KEYWORD_CANDIDATES, with_vectors=question is not None)
                rows = {row[0]: row for row in matching}
            for row in rows.values() if question is not None else ():
                counts.of(row[4])  # (while the question is embedded and searched)
        finally:
            scores, nearest_rows = by_meaning(rows) if by_meaning is not None else ({}, {})
        rows = {key: row[:HIT_WIDTH] for key, row in rows.items()}  # (a keyword row read with its vector)
        for key, row in nearest_rows.items():
            rows.setdefault(key, row)
        missing = [key for key in sorted(scores, key=lambda key: -scores[key])[:VECTOR_CANDIDATES] if key not in rows]
        if missing:
            sql = f"SELECT {HIT} FROM {NODES} WHERE agent_id = ? AND node_id IN ({', '.join('?' for _ in missing)})"
            rows.update((row[0], row) for row in self._fetch(self._sql(sql), (agent_id, *missing)))
        for key in [key for key, row in rows.items() if row[1] == HIDDEN_KIND]:  # (a deletion shown, not committed)
            del rows[key]
        for key in [key for key in rows if key.startswith(PENDING_PREFIX)]:  # (it stands for the committed row)
            rows.pop(UNIT_PREFIX + key.removeprefix(PENDING_PREFIX), None)
        if not rows:
            return []
        self._vector_cache = self._vector_cache or VectorCache()
        generation = self._generation(agent_id)
        total = self._vector_cache.rows(agent_id, generation,
                                        lambda agent: int(self._fetch(self._sql(ROWS_OF_AGENT), (agent,))[0][0]))
        candidates = [Candidate(key=key, text=row[4], steps=row[3], cosine=scores.get(key))
                      for key, row in rows.items()]
        weight = self.diversity if diversity is None else diversity
        if weight <= 0:
            ranked = rank(terms, candidates, total, k, mode, fusion, counts=counts)
            return [hit(rows[c.key], score) for c, score in ranked]
        ranked = rank(terms, candidates, total, k * WINDOW, mode, fusion, counts=counts)
        hits = [hit(rows[c.key], score) for c, score in ranked]
        by_id = {h.node_id: h for h in hits}
        def terms(candidate: Candidate) -> frozenset[str]:
            if mode != "keyword":
                return frozenset()
            return frozenset(t for t, n in zip(counts.stems, counts.of(candidate.text)[0]) if n)

        chosen = [Ranked(key=h.node_id, unit=h.kind == UNIT_KIND, score=h.score, covered_by=h.covered_by,
                         terms=terms(c)) for h, (c, _) in zip(hits, ranked)]
        chosen = diversify(chosen, stands_for(chosen, lambda ids: self._children(agent_id, generation, ids)), k, weight)
        return [by_id[c.key].model_copy(update={"folds": c.folds}) if c.folds else by_id[c.key] for c in chosen]

    def _children(self, agent_id: str, generation: int | None, node_ids: list[str]) -> dict[str, list[str]]:
        """The child ids of these live nodes (a batch node's are unit ids), kept while the agent's generation
        stays (any write moves it on)."""
        if self._children_cache is None:
            self._children_cache = {}
        key = (agent_id, generation or 0)
        cached = self._children_cache.get(key) if generation is not None else None
        if cached is None:
            cached = {}
            if generation is not None:
                if len(self._children_cache) >= CHILDREN_CACHED_AGENTS:
                    self._children_cache.pop(next(iter(self._children_cache)))
                self._children_cache[key] = cached
        missing = [n for n in node_ids if n not in cached]
        if missing:
            marks = ", ".join("?" for _ in missing)
            sql = f"SELECT node_id, body FROM {NODES} WHERE agent_id = ? AND node_id IN ({marks}) AND kind <> 'unit'"
            found = {node_id: json.loads(body)["children"] for node_id, body in self._fetch(self._sql(sql),
                                                                                             (agent_id, *missing))}
            cached.update({n: found.get(n, []) for n in missing})
        return {n: cached[n] for n in node_ids}

    def _nearest_meanwhile(self, agent_id: str, question: Callable[[], Any]) -> Callable[
            [Mapping[str, tuple[Any, ...]]], tuple[dict[str, float], dict[str, tuple[Any, ...]]]]:
        """Cosines of the agent's nearest rows, searched exactly on its cached matrix (store/vectors.py) in a
        thread while the caller searches by keyword; the result, given the keyword rows, adds their cosines and
        waits for the search (or raises what it raised), with the HIT rows it found that the caller lacks (none
        here: the caller reads them). The caller calls it, also on errors."""
        self._vector_cache = self._vector_cache or VectorCache()
        vectors = self._vector_cache.vectors(agent_id, self._generation(agent_id),
                                             lambda agent: self._fetch(self._sql(VECTORS_OF_AGENT), (agent,)))

        def search() -> tuple[Any, list[int]]:
            vector = question()
            return vector, nearest(vectors, vector, VECTOR_CANDIDATES)

        found = meanwhile(search, name="recall-by-meaning")

        def result(rows: Mapping[str, tuple[Any, ...]]) -> tuple[dict[str, float], dict[str, tuple[Any, ...]]]:
            vector, near = found()
            return cosines(vectors, vector, near, rows), {}

        return result

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()
