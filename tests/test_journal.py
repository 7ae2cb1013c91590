"""The replay journal: concurrent writers in several processes, corrupt entries never reused, expiry."""

import logging
import multiprocessing
import sqlite3

from flink_memory.digests import digest
from flink_memory.llm.client import ChatResult
from flink_memory.llm.journal import SqliteJournal

WRITERS = 4
ENTRIES = 150


def canonical(writer: int, k: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"writer {writer} request {k}"}]}


def result(writer: int, k: int) -> ChatResult:
    return ChatResult(text=f"answer {writer}/{k}", prompt_tokens=k, completion_tokens=writer, model="m")


def write_many(path: str, writer: int) -> None:
    journal = SqliteJournal(path)
    for k in range(ENTRIES):
        body = canonical(writer, k)
        journal.put(digest(body), body, result(writer, k))
        if k % 10 == 0:  # readers interleave with writers
            journal.get(digest(canonical((writer + 1) % WRITERS, k)), canonical((writer + 1) % WRITERS, k))
    journal.close()


def test_concurrent_writer_processes_keep_every_entry_readable(tmp_path):
    path = str(tmp_path / "journal.sqlite")
    SqliteJournal(path).close()  # create the schema once, as the first worker would
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=write_many, args=(path, w)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    journal = SqliteJournal(path)
    assert len(journal) == WRITERS * ENTRIES
    for w in range(WRITERS):
        for k in range(ENTRIES):
            body = canonical(w, k)
            got = journal.get(digest(body), body)
            assert got is not None and got.from_journal
            assert (got.text, got.prompt_tokens, got.completion_tokens) == (f"answer {w}/{k}", k, w)


def test_corrupted_entry_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "journal.sqlite"
    journal = SqliteJournal(str(path))
    good, bad = canonical(0, 1), canonical(0, 2)
    journal.put(digest(good), good, result(0, 1))
    journal.put(digest(bad), bad, result(0, 2))
    with sqlite3.connect(path) as db:  # a flipped byte in the stored answer
        db.execute("UPDATE results SET body = replace(body, 'answer', 'ANSWER') WHERE key = ?", (digest(bad),))
    with caplog.at_level(logging.WARNING, logger="flink_memory.llm.journal"):
        assert journal.get(digest(bad), bad) is None
    assert "checksum mismatch" in caplog.text
    assert journal.get(digest(good), good).text == "answer 0/1"
    assert len(journal) == 1  # the corrupt row is gone, so the call is made and journaled again


def test_entry_under_another_request_is_not_reused(tmp_path):
    journal = SqliteJournal(str(tmp_path / "journal.sqlite"))
    body = canonical(0, 1)
    journal.put(digest(body), body, result(0, 1))
    assert journal.get(digest(body), canonical(0, 2)) is None  # key and request disagree: never used


def test_expiry_by_count_and_age(tmp_path):
    journal = SqliteJournal(str(tmp_path / "journal.sqlite"), max_entries=10, max_age_days=1)
    for k in range(30):
        body = canonical(1, k)
        journal.put(digest(body), body, result(1, k))
    journal.prune()
    assert len(journal) == 10
    newest = canonical(1, 29)
    assert journal.get(digest(newest), newest) is not None
    journal._db.execute("UPDATE results SET created = created - 2 * 86400")
    journal.prune()
    assert len(journal) == 0
