"""The store in PostgreSQL tables that every TaskManager (and any reader) reaches; the same rows as SQLite."""

from __future__ import annotations

from typing import Any

from flink_memory.databases import PostgresConnection, redact_url
from flink_memory.store.core import tsquery_term
from flink_memory.store.sql import (
    CREATE_GENERATIONS,
    HIT,
    INIT_META,
    META,
    NODES,
    REPLACED,
    MemoryStore,
    StoreError,
)


class PostgresStore(MemoryStore):
    """Full text by a stored `english` tsvector column (GIN index), which finds the candidates; vectors
    (bytea) are searched exactly per agent. Writers lock per agent (advisory locks)."""

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
            # (columns of units and vectors: added to a store written before them too)
            conn.execute(f"ALTER TABLE {NODES} ADD COLUMN IF NOT EXISTS covered_by TEXT, "
                         "ADD COLUMN IF NOT EXISTS digest TEXT, ADD COLUMN IF NOT EXISTS vector BYTEA")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_globals ON {NODES} (agent_id, kind, version)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_covered ON {NODES} (agent_id, covered_by)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {NODES}_tsv ON {NODES} USING GIN (tsv)")
            conn.execute(CREATE_GENERATIONS)
            conn.execute(f"CREATE TABLE IF NOT EXISTS {REPLACED} (agent_id TEXT NOT NULL, node_id TEXT NOT NULL, "
                         "PRIMARY KEY (agent_id, node_id))")

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._db.run(lambda c: c.execute(sql, params).fetchall())
        except self._db.psycopg.OperationalError as exc:  # a reader (the service) answers 503, not a crash
            raise StoreError(f"cannot reach the memory store at {self.location}: {exc}") from None

    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        def write(conn: Any) -> None:
            with conn.transaction():
                for agent in agents:  # sorted: two writers of the same agents take the locks in one order
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (agent,))
                for sql, params in statements:
                    conn.execute(sql, params)

        self._db.run(write)

    def _matching(self, agent_id: str, terms: list[str], limit: int) -> list[tuple[Any, ...]]:
        sql = (f"SELECT {HIT} FROM {NODES}, to_tsquery('english', %s) q WHERE agent_id = %s AND tsv @@ q "
               "ORDER BY ts_rank_cd(tsv, q, 1) DESC LIMIT %s")
        return self._fetch(sql, (" | ".join(tsquery_term(t) for t in terms), agent_id, limit))

    def close(self) -> None:
        self._db.close()
