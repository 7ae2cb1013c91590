"""The replay journal: LLM results by request digest, outside Flink state, so no call is paid for twice.

A checkpoint restores state but not the calls made since; those requests come again after a restart,
with the same digests (the core builds them deterministically), and are answered from here. The embedded
store is one SQLite file (WAL, busy timeout): safe for many Python workers on one machine. For a
cluster of several machines implement `Journal` on a shared store (a SQL database, Redis, a KV service).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import xxhash

from flink_memory.digests import digest
from flink_memory.llm.client import ChatResult

log = logging.getLogger(__name__)


class Journal(Protocol):
    def get(self, key: str, canonical: dict[str, Any]) -> ChatResult | None: ...

    def put(self, key: str, canonical: dict[str, Any], result: ChatResult) -> None: ...


def _checksum(key: str, body: str) -> str:
    return xxhash.xxh3_128_hexdigest(f"{len(key)}:{key}{body}".encode())


class SqliteJournal:
    """One SQLite file; entries verify by checksum, expire by age and count."""

    PRUNE_EVERY = 500

    def __init__(self, path: str, *, max_entries: int = 1_000_000, max_age_days: float = 30.0) -> None:
        self.path = Path(path.removeprefix("file://"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_entries = max_entries
        self.max_age_s = max_age_days * 86400
        self._lock = threading.Lock()
        self._puts = 0
        self._db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 60000")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, request_digest TEXT NOT NULL, "
            "body TEXT NOT NULL, checksum TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS results_created ON results(created)")

    def get(self, key: str, canonical: dict[str, Any]) -> ChatResult | None:
        with self._lock:
            row = self._db.execute(
                "SELECT request_digest, body, checksum FROM results WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        request_digest, body, checksum = row
        try:
            if request_digest != key or digest(canonical) != key:
                raise ValueError("request digest does not match its key")
            if _checksum(key, body) != checksum:
                raise ValueError("checksum mismatch")
            data = json.loads(body)
            return ChatResult(text=data["text"], prompt_tokens=int(data["prompt_tokens"]),
                              completion_tokens=int(data["completion_tokens"]), model=data["model"],
                              from_journal=True)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("journal entry %s ignored (%s); the call is made again", key, exc)
            with self._lock:
                self._db.execute("DELETE FROM results WHERE key = ? AND checksum = ?", (key, checksum))
            return None

    def put(self, key: str, canonical: dict[str, Any], result: ChatResult) -> None:
        body = json.dumps({"text": result.text, "prompt_tokens": result.prompt_tokens,
                           "completion_tokens": result.completion_tokens, "model": result.model},
                          ensure_ascii=False, sort_keys=True)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO results (key, request_digest, body, checksum, created) VALUES (?,?,?,?,?)",
                (key, digest(canonical), body, _checksum(key, body), time.time()),
            )
            self._puts += 1
            if self._puts % self.PRUNE_EVERY == 0:
                self._prune()

    def _prune(self) -> None:
        self._db.execute("DELETE FROM results WHERE created < ?", (time.time() - self.max_age_s,))
        self._db.execute(
            "DELETE FROM results WHERE key IN (SELECT key FROM results ORDER BY created DESC LIMIT -1 OFFSET ?)",
            (self.max_entries,),
        )

    def prune(self) -> None:
        with self._lock:
            self._prune()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
