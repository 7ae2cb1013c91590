"""The replay journal: LLM results by request digest, outside Flink state, so no call is paid for twice.

A checkpoint restores state but not the calls made since; those requests come again after a restart,
with the same digests (the core builds them deterministically), and are answered from here. Two stores
share one row format and one read rule (`RowJournal`): one SQLite file (WAL, busy timeout), safe for many
Python workers on one machine, or a PostgreSQL table (`journal.path: postgresql://...`) that TaskManagers
on several machines share, so a call re-run after a rescheduling onto another machine is answered too.

A row holds the request digest, the answer's JSON body, a checksum over both and its creation time; never
the API key (requests are journaled in their canonical form, which has none). Reads fail closed: a row
whose digest or checksum does not verify is deleted and the call is made again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import xxhash

from flink_memory.databases import PostgresConnection, is_postgres, redact_url, sqlite_connect, sqlite_path
from flink_memory.digests import digest
from flink_memory.requests import ChatResult, Journal

log = logging.getLogger(__name__)
__all__ = ["Journal", "PostgresJournal", "RowJournal", "SqliteJournal", "open_journal", "redact_url"]


def _checksum(key: str, body: str) -> str:
    return xxhash.xxh3_128_hexdigest(f"{len(key)}:{key}{body}".encode())


class Row(NamedTuple):
    """One journal entry as stored; the same columns in every store."""

    key: str
    request_digest: str
    body: str
    checksum: str
    created: float


def encode_row(key: str, canonical: dict[str, Any], result: ChatResult, now: float | None = None) -> Row:
    body = json.dumps({"text": result.text, "prompt_tokens": result.prompt_tokens,
                       "completion_tokens": result.completion_tokens, "model": result.model,
                       "truncated": result.truncated},
                      ensure_ascii=False, sort_keys=True)
    return Row(key, digest(canonical), body, _checksum(key, body), time.time() if now is None else now)


def decode_row(key: str, canonical: dict[str, Any], request_digest: str, body: str, checksum: str) -> ChatResult:
    """The stored answer, or ValueError when anything about the row does not verify."""
    if request_digest != key or digest(canonical) != key:
        raise ValueError("request digest does not match its key")
    if _checksum(key, body) != checksum:
        raise ValueError("checksum mismatch")
    try:
        data = json.loads(body)
        return ChatResult(text=data["text"], prompt_tokens=int(data["prompt_tokens"]),
                          completion_tokens=int(data["completion_tokens"]), model=data["model"],
                          from_journal=True, truncated=bool(data.get("truncated", False)))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed body: {exc}") from None


class RowJournal(ABC):
    """The read, write and expiry rules; a store supplies the five statements."""

    PRUNE_EVERY = 500  # writes; and at a process's first write, and at least every PRUNE_AFTER_S of writing
    PRUNE_AFTER_S = 600.0

    def __init__(self, *, max_entries: int, max_age_days: float) -> None:
        self.max_entries = max_entries
        self.max_age_s = max_age_days * 86400
        self._puts = 0
        self._pruned_at: float | None = None  # (monotonic) None: not yet in this process

    @abstractmethod
    def _select(self, key: str) -> tuple[str, str, str] | None:
        """(request_digest, body, checksum) of `key`, if stored."""

    @abstractmethod
    def _upsert(self, row: Row) -> None:
        """Insert or replace atomically: concurrent writers of one key leave one whole row."""

    @abstractmethod
    def _delete(self, key: str, checksum: str) -> None:
        """Delete this exact row (not one a concurrent writer has just replaced it with)."""

    @abstractmethod
    def _expire(self, older_than: float, keep: int) -> None:
        """Delete rows created before `older_than`, then all but the `keep` newest."""

    @abstractmethod
    def _count(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def get(self, key: str, canonical: dict[str, Any]) -> ChatResult | None:
        row = self._select(key)
        if row is None:
            return None
        request_digest, body, checksum = row
        try:
            return decode_row(key, canonical, request_digest, body, checksum)
        except ValueError as exc:
            log.warning("journal entry %s ignored (%s); the call is made again", key, exc)
            self._delete(key, checksum)
            return None

    def put(self, key: str, canonical: dict[str, Any], result: ChatResult) -> None:
        self._upsert(encode_row(key, canonical, result))
        self._puts += 1
        now = time.monotonic()
        if (self._pruned_at is None or self._puts % self.PRUNE_EVERY == 0
                or now - self._pruned_at >= self.PRUNE_AFTER_S):  # (short runs too keep the journal bounded)
            self._pruned_at = now
            self.prune()

    def count_fault(self, fault_key: str) -> int:
        """Remember one more occurrence of a fault (an error of ours for one record); returns how many so far.

        Kept beside the results, so the count survives the restart that the first occurrence causes.
        """
        key = "fault:" + fault_key
        seen = int((self._get_note(key) or {}).get("faults", 0)) + 1
        self._put_note(key, {"faults": seen})
        return seen

    def _get_note(self, key: str) -> dict[str, Any] | None:
        """A bookkeeping row kept beside the results (fault counts); None if absent or altered."""
        row = self._select(key)
        if row is None or _checksum(key, row[1]) != row[2]:
            return None
        try:
            data = json.loads(row[1])
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _put_note(self, key: str, data: dict[str, Any]) -> None:
        body = json.dumps(data, sort_keys=True)
        self._upsert(Row(key, key, body, _checksum(key, body), time.time()))

    def prune(self) -> None:
        self._expire(time.time() - self.max_age_s, self.max_entries)

    def __len__(self) -> int:
        return self._count()


class SqliteJournal(RowJournal):
    """One SQLite file; entries verify by checksum, expire by age and count."""

    def __init__(self, path: str, *, max_entries: int = 1_000_000, max_age_days: float = 30.0) -> None:
        super().__init__(max_entries=max_entries, max_age_days=max_age_days)
        self.path = sqlite_path(path)
        self._lock = threading.Lock()
        self._db = sqlite_connect(path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, request_digest TEXT NOT NULL, "
            "body TEXT NOT NULL, checksum TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS results_created ON results(created)")

    def _select(self, key: str) -> tuple[str, str, str] | None:
        with self._lock:
            return self._db.execute(
                "SELECT request_digest, body, checksum FROM results WHERE key = ?", (key,)
            ).fetchone()

    def _upsert(self, row: Row) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO results (key, request_digest, body, checksum, created) VALUES (?,?,?,?,?)",
                row,
            )

    def _delete(self, key: str, checksum: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM results WHERE key = ? AND checksum = ?", (key, checksum))

    def _expire(self, older_than: float, keep: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM results WHERE created < ?", (older_than,))
            self._db.execute(
                "DELETE FROM results WHERE key IN (SELECT key FROM results ORDER BY created DESC LIMIT -1 OFFSET ?)",
                (keep,),
            )

    def _count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresJournal(RowJournal):
    """A table in PostgreSQL (psycopg 3) that every TaskManager shares; rows as in SqliteJournal.

    One autocommit connection per worker process, shared by its call threads (psycopg serializes them);
    a broken connection is reopened once per statement, and every statement is safe to repeat.
    """

    TABLE = "flink_memory_journal"
    LOCK_ID = 0x666D6A6C  # advisory lock: one schema creation and one pruning at a time across workers

    def __init__(self, url: str, *, max_entries: int = 1_000_000, max_age_days: float = 30.0) -> None:
        super().__init__(max_entries=max_entries, max_age_days=max_age_days)
        self.url = url
        self._db = PostgresConnection(url, setting="journal.path", application_name="flink-memory journal")
        self._run = self._db.run
        self._run(self._create_schema)

    def __repr__(self) -> str:
        return f"PostgresJournal({redact_url(self.url)!r})"

    def _create_schema(self, conn: Any) -> None:
        with conn.transaction():  # concurrent CREATE TABLE IF NOT EXISTS can collide in pg_type without it
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK_ID,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (key TEXT PRIMARY KEY, request_digest TEXT NOT NULL, "
                "body TEXT NOT NULL, checksum TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)"
            )
            conn.execute(f"CREATE INDEX IF NOT EXISTS {self.TABLE}_created ON {self.TABLE} (created)")

    def _select(self, key: str) -> tuple[str, str, str] | None:
        return self._run(lambda c: c.execute(
            f"SELECT request_digest, body, checksum FROM {self.TABLE} WHERE key = %s", (key,)).fetchone())

    def _upsert(self, row: Row) -> None:
        self._run(lambda c: c.execute(
            f"INSERT INTO {self.TABLE} (key, request_digest, body, checksum, created) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET request_digest = EXCLUDED.request_digest, body = EXCLUDED.body, "
            "checksum = EXCLUDED.checksum, created = EXCLUDED.created", tuple(row)))

    def _delete(self, key: str, checksum: str) -> None:
        self._run(lambda c: c.execute(f"DELETE FROM {self.TABLE} WHERE key = %s AND checksum = %s", (key, checksum)))

    def _expire(self, older_than: float, keep: int) -> None:
        def expire(conn: Any) -> None:
            with conn.transaction():  # one pruner at a time: overlapping DELETEs of two workers could deadlock
                if not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (self.LOCK_ID,)).fetchone()[0]:
                    return
                conn.execute(f"DELETE FROM {self.TABLE} WHERE created < %s", (older_than,))
                conn.execute(f"DELETE FROM {self.TABLE} WHERE key IN (SELECT key FROM {self.TABLE} "
                             "ORDER BY created DESC OFFSET %s)", (keep,))

        self._run(expire)

    def _count(self) -> int:
        return int(self._run(lambda c: c.execute(f"SELECT COUNT(*) FROM {self.TABLE}").fetchone()[0]))

    def close(self) -> None:
        self._db.close()


def open_journal(path: str, *, max_entries: int = 1_000_000, max_age_days: float = 30.0) -> RowJournal:
    """The journal `journal.path` names: a postgresql:// URL, else a SQLite file path."""
    if is_postgres(path):
        return PostgresJournal(path, max_entries=max_entries, max_age_days=max_age_days)
    return SqliteJournal(path, max_entries=max_entries, max_age_days=max_age_days)
