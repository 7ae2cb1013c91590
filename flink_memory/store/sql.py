"""The live-memory store: summary nodes in SQLite (one file, WAL) or PostgreSQL (psycopg 3), one schema.

Two tables and a full-text index: `flink_memory_nodes` holds each live node (its columns for queries and
`body`, the node's JSON exactly as written to summaries/), `flink_memory_replaced` every (agent, node id)
that a written node lists in `replaces`. A write records the replacements first, deletes the nodes they
name, then upserts each node that is not replaced, in one transaction per call (PostgreSQL takes an
advisory lock per agent for it, SQLite's write lock covers the file). A node is live while it is in the
nodes table: whatever the arrival order, a replaced node is never stored again, and a replayed node
rewrites its own row. The text of a replaced node leaves the store; its id stays in the replacements table.

`MemoryStore` holds every statement and read rule; a store supplies its connection, schema and search.
Reads return `SummaryNode` models (`flink_memory.records`) and `Recalled` hits, never raw rows.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from flink_memory.databases import PostgresConnection, is_postgres, redact_url, sqlite_connect, sqlite_path
from flink_memory.records import SummaryNode
from flink_memory.store.core import (
    SPECIFICITY,
    Recalled,
    as_node,
    fts5_query,
    query_terms,
    specificity_steps,
    tsquery_term,
)

SCHEMA_VERSION = 1
NODES = "flink_memory_nodes"
REPLACED = "flink_memory_replaced"
META = "flink_memory_store_meta"
FTS = "flink_memory_nodes_fts"  # SQLite only: FTS5 over the text of NODES (PostgreSQL: a tsvector column)
COLUMNS = ("agent_id", "node_id", "kind", "level", "steps", "version", "item_count", "first_ts", "last_ts", "text",
           "body")

# The statements both stores run, with `?` placeholders (PostgreSQL's store turns them into `%s`).
RECORD_REPLACED = f"INSERT INTO {REPLACED} (agent_id, node_id) VALUES (?, ?) ON CONFLICT DO NOTHING"
DELETE_REPLACED = f"DELETE FROM {NODES} WHERE agent_id = ? AND node_id = ?"
UPSERT = (
    f"INSERT INTO {NODES} ({', '.join(COLUMNS)}) SELECT {', '.join('?' for _ in COLUMNS)} "
    f"WHERE NOT EXISTS (SELECT 1 FROM {REPLACED} r WHERE r.agent_id = ? AND r.node_id = ?) "
    f"ON CONFLICT (agent_id, node_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
)
CURRENT = f"SELECT body FROM {NODES} WHERE agent_id = ? AND kind = 'global' ORDER BY version DESC LIMIT 1"
NODE = f"SELECT body FROM {NODES} WHERE agent_id = ? AND node_id = ?"
ALL_OF_AGENT = f"SELECT body FROM {NODES} WHERE agent_id = ? ORDER BY steps, node_id"
AGENTS = f"SELECT DISTINCT agent_id FROM {NODES} ORDER BY agent_id"
SCHEMA = f"SELECT value FROM {META} WHERE key = 'schema_version'"
INIT_META = f"INSERT INTO {META} (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}') ON CONFLICT DO NOTHING"


class StoreError(RuntimeError):
    """The store cannot be used; the message says why."""


class StoreNotFound(StoreError):
    """Nothing (or nothing of ours) at this location yet."""


def node_row(node: SummaryNode) -> tuple[Any, ...]:
    return (node.agent_id, node.node_id, node.kind, node.level, specificity_steps(node.kind, node.level),
            node.version, node.item_count, node.first_ts, node.last_ts, node.text, node.model_dump_json())


class MemoryStore(ABC):
    """Upserts and reads on one schema; `open_store` picks the store. Use as a context manager."""

    placeholder = "?"
    location: str
    missing_table: tuple[type[Exception], ...] = ()  # what the driver raises for a table that is not there

    @abstractmethod
    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Run the statements in one transaction, holding the write lock of each agent."""

    @abstractmethod
    def _search(self, agent_id: str, terms: list[str], k: int) -> list[tuple[str, float]]:
        """(body, score) of the agent's k best nodes for any of `terms`, best first."""

    @abstractmethod
    def close(self) -> None: ...

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

    # --- writes --------------------------------------------------------------------------------------

    def upsert(self, nodes: Iterable[SummaryNode | dict[str, Any] | str]) -> int:
        """Write nodes (models, dicts or summaries/ JSON lines) idempotently; returns how many were given."""
        parsed = [as_node(n) for n in nodes]
        if not parsed:
            return 0
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for node in parsed:
            for old in node.replaces:
                statements.append((self._sql(RECORD_REPLACED), (node.agent_id, old)))
                statements.append((self._sql(DELETE_REPLACED), (node.agent_id, old)))
        for node in parsed:
            statements.append((self._sql(UPSERT), (*node_row(node), node.agent_id, node.node_id)))
        self._write(sorted({n.agent_id for n in parsed}), statements)
        return len(parsed)

    # --- reads ---------------------------------------------------------------------------------------

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

    def agents(self) -> list[str]:
        """Agents with at least one live node, sorted."""
        return [row[0] for row in self._fetch(self._sql(AGENTS), ())]

    def recall(self, agent_id: str, query: str, k: int = 5) -> list[Recalled]:
        """The agent's k live nodes that best match `query` (natural language), best first; no model needed.

        Ranking: see flink_memory.store.core. A question without meaningful words gives []."""
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        return [Recalled.of(SummaryNode.model_validate_json(body), score)
                for body, score in self._search(agent_id, terms, k)]

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


class SqliteStore(MemoryStore):
    """One SQLite file (WAL): the job's subtasks write, any number of readers read meanwhile.

    Full text by FTS5 (external content over the nodes table, porter stemmer, kept in step by triggers),
    ranked by bm25. A writer holds the file's write lock (BEGIN IMMEDIATE) for one upsert call."""

    missing_table = (sqlite3.OperationalError,)

    def __init__(self, location: str, *, create: bool = False) -> None:
        self.location = str(sqlite_path(location))
        try:
            self._db = sqlite_connect(location, create=create)
        except FileNotFoundError:
            raise StoreNotFound(f"no memory store at {self.location}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.location} is not a readable SQLite database: {exc}") from None
        # the ranking needs power(); SQLite has it only when built with its math functions
        self._db.create_function("power", 2, math.pow, deterministic=True)
        self._lock = threading.Lock()
        if create:
            with self._lock:
                self._db.executescript(f"""
                    BEGIN IMMEDIATE;
                    CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                    {INIT_META};
                    CREATE TABLE IF NOT EXISTS {NODES} (
                        id INTEGER PRIMARY KEY, agent_id TEXT NOT NULL, node_id TEXT NOT NULL, kind TEXT NOT NULL,
                        level INTEGER NOT NULL, steps INTEGER NOT NULL, version INTEGER, item_count INTEGER NOT NULL,
                        first_ts TEXT, last_ts TEXT, text TEXT NOT NULL, body TEXT NOT NULL,
                        UNIQUE (agent_id, node_id));
                    CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version);
                    CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL,
                        PRIMARY KEY (agent_id, node_id));
                    CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5(
                        text, content='{NODES}', content_rowid='id', tokenize='porter unicode61');
                    CREATE TRIGGER IF NOT EXISTS {NODES}_ai AFTER INSERT ON {NODES} BEGIN
                        INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END;
                    CREATE TRIGGER IF NOT EXISTS {NODES}_ad AFTER DELETE ON {NODES} BEGIN
                        INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text); END;
                    CREATE TRIGGER IF NOT EXISTS {NODES}_au AFTER UPDATE ON {NODES} BEGIN
                        INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text);
                        INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END;
                    COMMIT;
                """)
        self._check_schema()

    def __repr__(self) -> str:
        return f"SqliteStore({self.location!r})"

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _search(self, agent_id: str, terms: list[str], k: int) -> list[tuple[str, float]]:
        sql = (f"SELECT n.body, -bm25({FTS}) * power(?, n.steps) AS score FROM {FTS} "
               f"JOIN {NODES} n ON n.id = {FTS}.rowid WHERE {FTS} MATCH ? AND n.agent_id = ? "
               "ORDER BY score DESC, n.steps, n.node_id LIMIT ?")
        return [(body, float(score)) for body, score in
                self._fetch(sql, (SPECIFICITY, fts5_query(terms), agent_id, k))]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresStore(MemoryStore):
    """Tables in PostgreSQL that every TaskManager (and any reader) reaches; the same rows as SqliteStore.

    Full text by a stored `english` tsvector column (GIN index). PostgreSQL's ts_rank_cd knows nothing of
    how rare a word is, so each question term is ranked on its own and weighted by its BM25 inverse document
    frequency among the agent's live nodes: a rare name outweighs a word every node has."""

    placeholder = "%s"
    LOCK_ID = 0x666D7374  # advisory lock of schema creation (per-agent writes lock on the agent's hash)

    def __init__(self, url: str, *, create: bool = False) -> None:
        self.location = redact_url(url)
        self._db = PostgresConnection(url, setting="store.url", application_name="flink-memory store")
        self.missing_table = (self._db.psycopg.errors.UndefinedTable,)
        try:
            if create:
                self._db.run(self._create_schema)
            self._check_schema()
        except self._db.psycopg.OperationalError as exc:
            self._db.close()
            raise StoreError(f"cannot reach the memory store at {self.location}: {exc}") from None
        except StoreError:
            self._db.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresStore({self.location!r})"

    def _create_schema(self, conn: Any) -> None:
        with conn.transaction():  # concurrent CREATE ... IF NOT EXISTS can collide in pg_type without it
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK_ID,))
            conn.execute(f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(INIT_META)
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {NODES} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
                "kind TEXT NOT NULL, level INTEGER NOT NULL, steps INTEGER NOT NULL, version INTEGER, "
                "item_count INTEGER NOT NULL, first_ts TEXT, last_ts TEXT, text TEXT NOT NULL, body TEXT NOT NULL, "
                "tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED, "
                "PRIMARY KEY (agent_id, node_id))")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_tsv ON {NODES} USING GIN (tsv)")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
                         "PRIMARY KEY (agent_id, node_id))")

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._db.run(lambda c: c.execute(sql, params).fetchall())

    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        def write(conn: Any) -> None:
            with conn.transaction():
                for agent in agents:  # sorted: two writers of the same agents take the locks in one order
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (agent,))
                for sql, params in statements:
                    conn.execute(sql, params)

        self._db.run(write)

    def _search(self, agent_id: str, terms: list[str], k: int) -> list[tuple[str, float]]:
        sql = f"""
            WITH live AS (SELECT node_id, steps, body, tsv FROM {NODES} WHERE agent_id = %(agent)s),
            terms AS (SELECT DISTINCT to_tsquery('english', t) AS q FROM unnest(%(terms)s::text[]) AS t),
            weights AS (
                SELECT terms.q, ln(1 + ((SELECT count(*) FROM live) - count(live.node_id) + 0.5)
                                   / (count(live.node_id) + 0.5)) AS idf
                FROM terms LEFT JOIN live ON live.tsv @@ terms.q
                WHERE numnode(terms.q) > 0 GROUP BY terms.q)
            SELECT live.body, sum(weights.idf * ts_rank_cd(live.tsv, weights.q, 1)) * power(%(factor)s, live.steps)
                   AS score
            FROM live JOIN weights ON live.tsv @@ weights.q
            GROUP BY live.node_id, live.steps, live.body
            ORDER BY score DESC, live.steps, live.node_id LIMIT %(k)s"""
        params = {"agent": agent_id, "terms": [tsquery_term(t) for t in terms], "factor": SPECIFICITY, "k": k}
        return [(body, float(score)) for body, score in self._db.run(lambda c: c.execute(sql, params).fetchall())]

    def close(self) -> None:
        self._db.close()


def open_store(location: str, *, create: bool = False) -> MemoryStore:
    """The store at `location`: a postgresql:// (or postgres://) URL, else a SQLite file path.

    Readers open an existing store (StoreNotFound otherwise); the job's sink passes `create=True`, which
    creates the file or the tables when missing."""
    if is_postgres(location):
        return PostgresStore(location, create=create)
    return SqliteStore(location, create=create)
