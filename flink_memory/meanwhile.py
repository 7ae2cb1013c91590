"""A call run in a thread while the caller goes on: a recall searches by keyword while its question is embedded
and searched by meaning (a model's engine, numpy and a database driver release the GIL)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def meanwhile(call: Callable[[], T], *, name: str, started: bool = True) -> Callable[[], T]:
    """Start `call` in a daemon thread and return once it runs (`started`; else at once: the thread runs when
    the caller next waits, as a search off the caller's own path may); calling the result waits for its value
    (or raises what it raised, in the caller's thread). A caller calls the result before it returns, also on
    errors, so that what `call` uses is never used by two calls at once."""
    done: list[T] = []
    failed: list[BaseException] = []
    running = threading.Event()

    def run() -> None:
        running.set()
        try:
            done.append(call())
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    if started:
        running.wait()

    def result() -> T:
        thread.join()
        if failed:
            raise failed[0]
        return done[0]

    return result
