"""The store in one SQLite file (WAL): the job's subtasks write, any number of readers read meanwhile."""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flink_memory.databases import sqlite_connect, sqlite_path
from flink_memory.store.connection import Checks, Statements, StoreConnection
from flink_memory.store.rules import StoreError, StoreNotFound, fts5_query
from flink_memory.store.schema import (
    ADDED,
    ADDED_LOG_COLUMNS,
    CREATE_GENERATIONS,
    CREATE_LOG_TABLES,
    FTS,
    HIT,
    INIT_META,
    META,
    NODES,
    PENDING_INDEX,
    REPLACED,
)
from flink_memory.store.sql import MemoryStore
from flink_memory.store.vector_rows import VectorRows

FTS_CONTENT = f"{FTS}_content"  # what the full-text index reads: each row's text and its agent's token
# An agent's one full-text token: the hex of its id (one unicode61 token, any id) ending in a digit, which the
# porter stemmer leaves whole, so no two agents share a token.
AGENT_TOKEN = "hex({}) || '0'"
FTS_SCHEMA = (
    f"CREATE VIEW IF NOT EXISTS {FTS_CONTENT} AS SELECT id, text, {AGENT_TOKEN.format('agent_id')} AS agent "
    f"FROM {NODES}",
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5(text, agent, content='{FTS_CONTENT}', content_rowid='id', "
    "tokenize='porter unicode61')",
    f"CREATE TRIGGER IF NOT EXISTS {NODES}_ai AFTER INSERT ON {NODES} BEGIN "
    f"INSERT INTO {FTS} (rowid, text, agent) VALUES (new.id, new.text, {AGENT_TOKEN.format('new.agent_id')}); END",
    f"CREATE TRIGGER IF NOT EXISTS {NODES}_ad AFTER DELETE ON {NODES} BEGIN "
    f"INSERT INTO {FTS} ({FTS}, rowid, text, agent) VALUES ('delete', old.id, old.text, "
    f"{AGENT_TOKEN.format('old.agent_id')}); END",
    f"CREATE TRIGGER IF NOT EXISTS {NODES}_au AFTER UPDATE OF text, agent_id ON {NODES} BEGIN "
    f"INSERT INTO {FTS} ({FTS}, rowid, text, agent) VALUES ('delete', old.id, old.text, "
    f"{AGENT_TOKEN.format('old.agent_id')}); "
    f"INSERT INTO {FTS} (rowid, text, agent) VALUES (new.id, new.text, {AGENT_TOKEN.format('new.agent_id')}); END",
)

TABLES = (  # (columns added since: ADDED, ADDED_LOG_COLUMNS; then the indexes on them)
    f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    INIT_META,
    f"CREATE TABLE IF NOT EXISTS {NODES} (id INTEGER PRIMARY KEY, agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
    "kind TEXT NOT NULL, level INTEGER NOT NULL, steps INTEGER NOT NULL, version INTEGER, item_count INTEGER NOT NULL, "
    "first_ts TEXT, last_ts TEXT, text TEXT NOT NULL, body TEXT NOT NULL, covered_by TEXT, digest TEXT, vector BLOB, "
    "UNIQUE (agent_id, node_id))",
    f"CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version)",
    CREATE_GENERATIONS,
    *CREATE_LOG_TABLES,
    f"CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
    "PRIMARY KEY (agent_id, node_id))",
    *FTS_SCHEMA,
)


def agent_token(agent_id: str) -> str:
    """The agent's full-text token as AGENT_TOKEN computes it (SQLite's hex() is of the UTF-8 bytes)."""
    return agent_id.encode().hex().upper() + "0"


def sqlite_store(location: str, *, create: bool = False) -> MemoryStore:
    """The store in the SQLite file at `location` (`create`: the file and tables too, when missing)."""
    connection = SqliteConnection(location, create=create)
    return MemoryStore(connection, VectorRows(connection), SqliteSearch(connection))


def replace_fts(db: sqlite3.Connection, statements: Iterable[str]) -> None:
    """Replace the full-text index and its triggers with `statements`' and index every node again (the
    migration of a text-only index, inside the schema's write transaction)."""
    for suffix in ("ai", "ad", "au"):
        db.execute(f"DROP TRIGGER IF EXISTS {NODES}_{suffix}")
    db.execute(f"DROP TABLE {FTS}")
    for statement in statements:
        db.execute(statement)
    db.execute(f"INSERT INTO {FTS} ({FTS}) VALUES ('rebuild')")


class SqliteConnection(StoreConnection):
    """One SQLite connection, shared by threads one at a time (its lock); every transaction is `transaction`'s.
    A writer holds the file's write lock (BEGIN IMMEDIATE) for one write call."""

    missing_table = (sqlite3.OperationalError,)

    def __init__(self, location: str, *, create: bool = False) -> None:
        self.location = str(sqlite_path(location))
        try:
            self._db = sqlite_connect(location, create=create)
        except FileNotFoundError:
            raise StoreNotFound(f"no memory store at {self.location}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.location} is not a readable SQLite database: {exc}") from None
        self._lock = threading.Lock()
        if create:
            self._create_schema()
        self.check_schema()
        with self._lock:
            self.per_agent = self._fts_has_agent()  # the full-text index holds each row's agent (SqliteSearch)

    @contextmanager
    def transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """The connection inside one transaction (a write's by default; "BEGIN": one snapshot for reads), rolled
        back on any error."""
        with self._lock:
            self._db.execute(begin)
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _create_schema(self) -> None:
        # in one write transaction: two openers of a new store (a job's store sink subtasks) would both see a
        # column missing and the second ALTER fail ("duplicate column name"), failing the job's start
        with self.transaction() as db:
            for statement in TABLES:
                db.execute(statement)
            present = {row[1] for row in db.execute(f"PRAGMA table_info({NODES})")}
            for column, kind in ADDED.items():  # a store written before units and vectors
                if column not in present:
                    db.execute(f"ALTER TABLE {NODES} ADD COLUMN {column} {kind}")
            for table, column, kind in ADDED_LOG_COLUMNS:  # a store written before histories
                if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            db.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_covered ON {NODES} (agent_id, covered_by)")
            db.execute(PENDING_INDEX)
            if not self._fts_has_agent():  # (a text-only index: rebuilt with the agent column)
                replace_fts(db, FTS_SCHEMA)

    def _fts_has_agent(self) -> bool:
        """Whether the full-text index holds the agent column (a store written before it has text only)."""
        return "agent" in {row[1] for row in self._db.execute(f"PRAGMA table_info({FTS})")}

    def __repr__(self) -> str:
        return f"SqliteConnection({self.location!r})"

    def fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def write(self, agents: list[str], statements: Statements, checks: Checks | None = None) -> None:
        with self.transaction() as db:
            self._checked(db.execute, statements, checks)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class SqliteSearch:
    """Full text by FTS5 (external content over the nodes table, porter stemmer, kept in step by triggers),
    which finds the candidates: each row's text and its agent's token, matched together so that a search
    ranks the agent's rows only. Vectors are searched exactly per agent (flink_memory.store.vectors, by the
    recall part)."""

    def __init__(self, connection: SqliteConnection) -> None:
        self.connection = connection

    def facts(self, agent_id: str, terms: list[str]) -> None:
        return None

    def nearest_meanwhile(self, agent_id: str, question: Any, generation: int | None) -> None:
        return None

    def matching(self, agent_id: str, terms: list[str], limit: int, *,
                 question: Any | None = None) -> list[tuple[Any, ...]]:
        columns = ", ".join(f"n.{c.strip()}" for c in HIT.split(","))
        if not self.connection.per_agent:  # an index of text only (a store not yet opened by a writer of this release)
            sql = (f"SELECT {columns} FROM {FTS} JOIN {NODES} n ON n.id = {FTS}.rowid "
                   f"WHERE {FTS} MATCH ? AND n.agent_id = ? ORDER BY bm25({FTS}) LIMIT ?")
            return self.connection.fetch(sql, (fts5_query(terms), agent_id, limit))
        with self.connection.transaction("BEGIN") as db:  # one snapshot for every statement of the search
            ids = self._candidates(db, agent_token(agent_id), terms, limit)
            marks = ", ".join("?" for _ in ids)  # (`+agent_id`: by rowid, not by a scan of the agent's index)
            found = db.execute(f"SELECT id, {HIT} FROM {NODES} WHERE id IN ({marks}) AND +agent_id = ?",
                               (*ids, agent_id)).fetchall()
        place = {rowid: i for i, rowid in enumerate(ids)}
        return [row[1:] for row in sorted(found, key=lambda row: place[row[0]])]

    def close(self) -> None:
        pass  # (the connection is the store's)

    def _candidates(self, db: sqlite3.Connection, token: str, terms: list[str], limit: int) -> list[int]:
        """Row ids of the agent's rows holding any of `terms`: all of them when there are at most `limit`,
        else `limit` of them chosen without ranking every match (FTS5's bm25 reads each matching row and, for
        its weights, every row of the index holding each term: tens of milliseconds for a common word).

        The terms held by at most `limit` of the agent's rows are its rare ones: their rows come first, those
        holding more of the question's terms (rare or common) before those holding fewer, then those holding
        rarer ones, then the newest. Up to `limit`, rows holding every common term, then any common term,
        newest first, follow. flink_memory.store.ranking scores whatever is found."""
        def ids(expression: str, tail: str = "") -> list[int]:
            match = f'agent : "{token}" AND text : ({expression})'
            return [row[0] for row in db.execute(f"SELECT rowid FROM {FTS} WHERE {FTS} MATCH ?{tail}", (match,))]

        found = ids(fts5_query(terms), f" LIMIT {limit + 1}")
        if len(found) <= limit:
            return found
        holding: dict[str, set[int]] = {}  # term -> the rows of the rare terms that hold it
        weight: dict[str, float] = {}  # the rarer, the heavier
        common: list[str] = []
        for term in terms:
            rows = ids(fts5_query([term]), f" LIMIT {limit + 1}")
            if len(rows) > limit:
                common.append(term)
            elif rows:
                holding[term], weight[term] = set(rows), math.log1p(limit / len(rows))
        if holding:
            rare = fts5_query(list(holding))
            for term in common:
                holding[term] = set(ids(f"{fts5_query([term])} AND ({rare})"))
                weight[term] = math.log1p(limit / (limit + 1))
        held: dict[int, int] = {}
        rarity: dict[int, float] = {}
        for term, rows in holding.items():
            for rowid in rows:
                held[rowid] = held.get(rowid, 0) + 1
                rarity[rowid] = rarity.get(rowid, 0.0) + weight[term]
        chosen = sorted(held, key=lambda rowid: (-held[rowid], -rarity[rowid], -rowid))[:limit]
        taken = set(chosen)
        every = [" AND ".join(fts5_query([term]) for term in common)] if len(common) > 1 else []
        for expression in every + [fts5_query(common)] if common and len(chosen) < limit else []:
            for rowid in ids(expression, f" ORDER BY rowid DESC LIMIT {limit}"):
                if rowid not in taken:
                    chosen.append(rowid)
                    taken.add(rowid)
                    if len(chosen) == limit:
                        return chosen
        return chosen
