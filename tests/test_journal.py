"""The replay journal, in SQLite and in PostgreSQL: concurrent writers in several processes, corrupt entries
never reused, expiry, the API key never stored."""

import logging
import multiprocessing
import sqlite3
from dataclasses import dataclass

import pytest
from pgserver import new_database

from flink_memory.config import load_config
from flink_memory.digests import digest
from flink_memory.llm.chat_client import LLMClient
from flink_memory.llm.journal import PostgresJournal, RowJournal, SqliteJournal, open_journal, redact_url
from flink_memory.requests import ChatResult

WRITERS = 4
ENTRIES = 150


@dataclass
class Store:
    """Where a journal lives, and raw SQL on its table for tampering with rows as a fault would."""

    location: str
    table: str

    def open(self, **limits) -> RowJournal:
        return open_journal(self.location, **limits)

    def execute(self, sql: str) -> list[tuple]:
        sql = sql.format(table=self.table)
        if self.location.startswith("postgresql://"):
            import psycopg

            with psycopg.connect(self.location, autocommit=True) as conn:
                cursor = conn.execute(sql)
                return cursor.fetchall() if cursor.description else []
        with sqlite3.connect(self.location) as db:
            return db.execute(sql).fetchall()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def store(request, tmp_path) -> Store:
    if request.param == "sqlite":
        return Store(str(tmp_path / "journal.sqlite"), "results")
    return Store(new_database(request.getfixturevalue("postgres_url")), PostgresJournal.TABLE)


def canonical(writer: int, k: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"writer {writer} request {k}"}]}


def result(writer: int, k: int) -> ChatResult:
    return ChatResult(text=f"answer {writer}/{k}", prompt_tokens=k, completion_tokens=writer, model="m")


def write_many(location: str, writer: int) -> None:
    journal = open_journal(location)
    for k in range(ENTRIES):
        body = canonical(writer, k)
        journal.put(digest(body), body, result(writer, k))
        if k % 10 == 0:  # readers interleave with writers
            journal.get(digest(canonical((writer + 1) % WRITERS, k)), canonical((writer + 1) % WRITERS, k))
    journal.close()


def write_same_keys(location: str, writer: int) -> None:
    """Every writer answers the same requests (as two attempts of one call would), with its own text."""
    journal = open_journal(location)
    for k in range(ENTRIES):
        body = canonical(0, k)
        journal.put(digest(body), body, result(writer, k))
    journal.close()


def run_writers(location: str, target) -> None:
    open_journal(location).close()  # create the schema once, as the first worker would
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=target, args=(location, w)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0


def test_concurrent_writer_processes_keep_every_entry_readable(store):
    run_writers(store.location, write_many)
    journal = store.open()
    assert len(journal) == WRITERS * ENTRIES
    for w in range(WRITERS):
        for k in range(ENTRIES):
            body = canonical(w, k)
            got = journal.get(digest(body), body)
            assert got is not None and got.from_journal
            assert (got.text, got.prompt_tokens, got.completion_tokens) == (f"answer {w}/{k}", k, w)


def test_concurrent_writers_of_the_same_keys_leave_one_whole_row_each(store):
    run_writers(store.location, write_same_keys)
    journal = store.open()
    assert len(journal) == ENTRIES
    for k in range(ENTRIES):
        body = canonical(0, k)
        got = journal.get(digest(body), body)  # checksum verifies: body and checksum are of one writer
        assert got is not None
        writer = got.completion_tokens
        assert got.text == f"answer {writer}/{k}" and 0 <= writer < WRITERS


def test_corrupted_entry_is_ignored_with_a_warning(store, caplog):
    journal = store.open()
    good, bad = canonical(0, 1), canonical(0, 2)
    journal.put(digest(good), good, result(0, 1))
    journal.put(digest(bad), bad, result(0, 2))
    # a flipped byte in the stored answer
    store.execute(f"UPDATE {{table}} SET body = replace(body, 'answer', 'ANSWER') WHERE key = '{digest(bad)}'")
    with caplog.at_level(logging.WARNING, logger="flink_memory.llm.journal"):
        assert journal.get(digest(bad), bad) is None
    assert "checksum mismatch" in caplog.text
    assert journal.get(digest(good), good).text == "answer 0/1"
    assert len(journal) == 1  # the corrupt row is gone, so the call is made and journaled again


def test_entry_under_another_request_is_not_reused(store):
    journal = store.open()
    body = canonical(0, 1)
    journal.put(digest(body), body, result(0, 1))
    assert journal.get(digest(body), canonical(0, 2)) is None  # key and request disagree: never used


def test_expiry_by_count_and_age(store):
    journal = store.open(max_entries=10, max_age_days=1)
    for k in range(30):
        body = canonical(1, k)
        journal.put(digest(body), body, result(1, k))
    journal.prune()
    assert len(journal) == 10
    newest = canonical(1, 29)
    assert journal.get(digest(newest), newest) is not None
    store.execute("UPDATE {table} SET created = created - 2 * 86400")
    journal.prune()
    assert len(journal) == 0


def test_api_key_is_never_journaled(store, scripted, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret-123456")
    cfg = load_config(None, ["llm.provider=openai", f"llm.base_url={scripted.base_url}", "llm.api_key_env=MY_KEY"],
                      environ={})
    journal = store.open()
    client = LLMClient(cfg.llm, cfg.llm.base_url, journal=journal)
    request = client.requests.build([{"role": "user", "content": "Alice met Bob"}], prompt_version="t1")
    first, again = client.complete(request), client.complete(request)
    assert scripted.authorizations == ["Bearer sk-secret-123456"]  # the key was in play, and the second
    assert again.from_journal and again.text == first.text       # answer came from the journal
    rows = store.execute("SELECT * FROM {table}")  # the answer, and what it taught the token count
    assert len([row for row in rows if not row[0].startswith("calibration:")]) == 1
    assert "sk-secret" not in repr(rows) and scripted.base_url not in repr(rows)


def test_open_journal_picks_the_store_by_path(tmp_path):
    assert isinstance(open_journal(str(tmp_path / "j.sqlite")), SqliteJournal)
    assert isinstance(open_journal(f"file://{tmp_path}/k.sqlite"), SqliteJournal)
    assert redact_url("postgresql://u:pw@db:5433/mem") == "postgresql://u:***@db:5433/mem"
    assert redact_url("postgresql://u@db/mem") == "postgresql://u@db/mem"


@pytest.mark.slow
def test_postgres_journal_survives_a_dropped_connection(postgres_url):
    import psycopg

    url = new_database(postgres_url)
    journal = PostgresJournal(url)
    body = canonical(0, 1)
    journal.put(digest(body), body, result(0, 1))
    with psycopg.connect(url, autocommit=True) as admin:  # the server ends the journal's session
        ended = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'flink-memory journal' AND datname = current_database()")
        assert ended.fetchall() == [(True,)]
    assert journal.get(digest(body), body).text == "answer 0/1"  # reconnected once, same answer


@pytest.mark.slow  # a pytest run in a subprocess per case
@pytest.mark.parametrize("ci, outcome, reason", [("true", "1 error", "PostgreSQL tests cannot run"),
                                                 ("", "1 skipped", "no PostgreSQL server can be started here")])
def test_without_postgres_the_tests_say_so_and_fail_under_ci(tmp_path, ci, outcome, reason):
    """No PostgreSQL (no server package, no pg_config on PATH): under CI=true the PostgreSQL tests fail,
    elsewhere they skip, naming the cause."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env.update(PATH=str(tmp_path), CI=ci, FLINK_MEMORY_TEST_POSTGRES="machine")  # no server package, empty PATH
    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider",
                           f"{tests / 'test_journal.py'}::test_entry_under_another_request_is_not_reused[postgres]"],
                          cwd=tests.parent, env=env, capture_output=True, text=True, timeout=120)
    assert outcome in done.stdout and reason in done.stdout and "pg_config is not on PATH" in done.stdout
    assert (done.returncode != 0) == (ci == "true")


def test_short_runs_keep_the_journal_bounded_too(store):
    """Every process prunes at its first write: runs of fewer writes than PRUNE_EVERY do not pile up, and an
    entry older than max_age_days leaves at the next run's first write."""
    for run in range(4):
        journal = store.open(max_entries=5, max_age_days=1)
        for k in range(10):
            body = canonical(run, k)
            journal.put(digest(body), body, result(run, k))
        journal.close()
    assert len(store.open(max_entries=5, max_age_days=1)) <= 5 + 9  # (pruned at each run's first write)
    store.execute("UPDATE {table} SET created = created - 2 * 86400")
    journal = store.open(max_entries=5, max_age_days=1)
    body = canonical(9, 0)
    journal.put(digest(body), body, result(9, 0))
    assert len(journal) == 1
