"""Connections shared by the replay journal and the memory store: one SQLite file or one PostgreSQL database.

A location is a file path (`file://` allowed) or a `postgresql://` / `postgres://` URL. SQLite files run in
WAL mode with a busy timeout, so many worker processes of one machine write while readers read; PostgreSQL
is reached through psycopg 3 (the `postgres` extra) with one autocommit connection per process, reopened
once when the server dropped it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
T = TypeVar("T")


def is_postgres(location: str) -> bool:
    return location.startswith(POSTGRES_SCHEMES)


def redact_url(url: str) -> str:
    """A connection URL fit for logs: any password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def sqlite_path(location: str) -> Path:
    return Path(location.removeprefix("file://"))


def sqlite_connect(location: str, *, create: bool = True) -> sqlite3.Connection:
    """A WAL connection with a 60 s busy timeout, shareable across threads (callers serialize its use).

    `create=False` opens an existing file only (FileNotFoundError otherwise): a reader never leaves an
    empty database behind a mistyped path."""
    path = sqlite_path(location)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    db = sqlite3.connect(str(path), timeout=60, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 60000")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    return db


class PostgresConnection:
    """One autocommit psycopg connection, shared by a process's threads (a lock serializes statements).

    `run(statement)` reopens a connection the server dropped and repeats the statement once, so every
    statement given to it must be safe to repeat."""

    def __init__(self, url: str, *, setting: str, application_name: str,
                 setup: Callable[[Any], None] | None = None) -> None:
        try:
            import psycopg
        except ImportError:
            raise RuntimeError(
                f"{setting} is a PostgreSQL URL but psycopg is not installed: pip install 'flink-memory[postgres]'"
            ) from None
        self.psycopg = psycopg
        self.url = url
        self.application_name = application_name
        self._lock = threading.Lock()
        self._conn: Any = None
        self._setup = setup  # run on each new connection (session settings)

    def __repr__(self) -> str:
        return f"PostgresConnection({redact_url(self.url)!r})"

    def run(self, statement: Callable[[Any], T]) -> T:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None or self._conn.closed:
                    self._conn = self.psycopg.connect(self.url, autocommit=True, connect_timeout=30,
                                                      application_name=self.application_name)
                    if self._setup is not None:
                        self._setup(self._conn)
                try:
                    return statement(self._conn)
                except self.psycopg.OperationalError as exc:
                    if attempt == 2 or not self._conn.closed and not self._conn.broken:
                        raise
                    log.warning("%s: connection to %s lost (%s); reconnecting", self.application_name,
                                redact_url(self.url), exc)
                    self._conn = None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
