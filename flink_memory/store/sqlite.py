"""The store in one SQLite file (WAL): the job's subtasks write, any number of readers read meanwhile."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from flink_memory.databases import sqlite_connect, sqlite_path
from flink_memory.store.core import fts5_query
from flink_memory.store.sql import (
    ADDED,
    CREATE_GENERATIONS,
    FTS,
    HIT,
    INIT_META,
    META,
    NODES,
    REPLACED,
    MemoryStore,
    StoreError,
    StoreNotFound,
)


class SqliteStore(MemoryStore):
    """Full text by FTS5 (external content over the nodes table, porter stemmer, kept in step by triggers),
    which finds the candidates; vectors are searched exactly per agent (flink_memory.store.vectors). A writer holds the file's write lock
    (BEGIN IMMEDIATE) for one upsert call."""

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
            with self._lock:
                self._create_schema()
        self._check_schema()

    def _create_schema(self) -> None:
        self._db.executescript(f"""
            BEGIN IMMEDIATE;
            CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            {INIT_META};
            CREATE TABLE IF NOT EXISTS {NODES} (
                id INTEGER PRIMARY KEY, agent_id TEXT NOT NULL, node_id TEXT NOT NULL, kind TEXT NOT NULL,
                level INTEGER NOT NULL, steps INTEGER NOT NULL, version INTEGER, item_count INTEGER NOT NULL,
                first_ts TEXT, last_ts TEXT, text TEXT NOT NULL, body TEXT NOT NULL,
                covered_by TEXT, digest TEXT, vector BLOB,
                UNIQUE (agent_id, node_id));
            CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version);
            {CREATE_GENERATIONS};
            CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL,
                PRIMARY KEY (agent_id, node_id));
            CREATE VIRTUAL TABLE IF NOT EXISTS {FTS} USING fts5(
                text, content='{NODES}', content_rowid='id', tokenize='porter unicode61');
            CREATE TRIGGER IF NOT EXISTS {NODES}_ai AFTER INSERT ON {NODES} BEGIN
                INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END;
            CREATE TRIGGER IF NOT EXISTS {NODES}_ad AFTER DELETE ON {NODES} BEGIN
                INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text); END;
            CREATE TRIGGER IF NOT EXISTS {NODES}_au AFTER UPDATE OF text ON {NODES} BEGIN
                INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text);
                INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END;
            COMMIT;
        """)
        present = {row[1] for row in self._db.execute(f"PRAGMA table_info({NODES})")}
        for column, kind in ADDED.items():  # a store written before units and vectors
            if column not in present:
                self._db.execute(f"ALTER TABLE {NODES} ADD COLUMN {column} {kind}")
        self._db.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_covered ON {NODES} (agent_id, covered_by)")

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

    def _matching(self, agent_id: str, terms: list[str], limit: int) -> list[tuple[Any, ...]]:
        columns = ", ".join(f"n.{c.strip()}" for c in HIT.split(","))
        sql = (f"SELECT {columns} FROM {FTS} JOIN {NODES} n ON n.id = {FTS}.rowid "
               f"WHERE {FTS} MATCH ? AND n.agent_id = ? ORDER BY bm25({FTS}) LIMIT ?")
        return self._fetch(sql, (fts5_query(terms), agent_id, limit))

    def close(self) -> None:
        with self._lock:
            self._db.close()
