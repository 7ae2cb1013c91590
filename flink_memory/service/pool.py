"""The service's store connections: a few stores, each lent to one request at a time, sharing one vector cache.

A store serializes its calls on its one connection (SQLite's and PostgreSQL's stores hold a lock around
it), so one store serves one recall at a time. The pool opens up to `size` stores (by default one more than
the CPU cores, `default_size`), lends each to one caller and queues the others in arrival order (first come,
first served: a waiter is handed the next store given back, never overtaken by a later caller). The stores
share one `SharedVectorCache`, so an agent's matrix is read from the database and kept in memory once, not
once per connection.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flink_memory.store import MemoryStore
from flink_memory.store.vectors import VectorCache

BUSY_TIMEOUT_S = 30.0


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def default_size() -> int:
    """Reads at once: a recall is CPU work (embedding the question, the full-text search, the vector product,
    the ranking), so more of them than cores only share the cores; one more keeps the cores busy while a
    recall waits for the GIL or the database (2 cores, 32 clients of benchmarks/service_load.py: 1.82
    cores busy with 3 stores, 1.70 with 2)."""
    return cpu_cores() + 1


class PoolBusy(TimeoutError):
    """No store came free within the pool's timeout."""


class SharedVectorCache(VectorCache):
    """A VectorCache for the stores of several threads: one caller at a time looks up (or loads) a matrix;
    the search over a matrix it got runs outside the lock (a loaded matrix is never changed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def vectors(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return super().vectors(*args, **kwargs)


class StorePool:
    """Up to `size` stores made by `open_store` (opened when first needed), each lent to one caller."""

    def __init__(self, open_store: Callable[[], MemoryStore], size: int, busy_timeout_s: float = BUSY_TIMEOUT_S
                 ) -> None:
        if size < 1:
            raise ValueError(f"a store pool needs at least one store, not {size}")
        self.size = size
        self.busy_timeout_s = busy_timeout_s
        self.vectors = SharedVectorCache()
        self._open_store = open_store
        self._lock = threading.Lock()
        self._idle: list[MemoryStore] = []
        self._opened = 0
        self._waiting: deque[tuple[threading.Event, list[MemoryStore | None]]] = deque()
        self._closed = False

    @contextmanager
    def lend(self) -> Iterator[MemoryStore]:
        """A store for this caller alone until the block ends; PoolBusy when none came free in time."""
        store = self._take()
        try:
            yield store
        finally:
            self._give_back(store)

    def _open(self) -> MemoryStore:
        try:
            store = self._open_store()
        except BaseException:
            with self._lock:
                self._opened -= 1
                if self._waiting:  # a waiter opens one itself rather than waiting for this one
                    event, slot = self._waiting.popleft()
                    slot.append(None)
                    event.set()
            raise
        store.recaller.vector_cache = self.vectors  # the matrices of every store of the pool
        return store

    def _take(self) -> MemoryStore:
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the store pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._opened < self.size:
                    self._opened += 1
                    waiter = None
                else:
                    waiter = (threading.Event(), [])
                    self._waiting.append(waiter)
            if waiter is None:
                return self._open()
            if not waiter[0].wait(self.busy_timeout_s):
                with self._lock:
                    if not waiter[1]:  # (still queued: leave the queue)
                        self._waiting.remove(waiter)
                        raise PoolBusy(f"all {self.size} store connections stayed busy for {self.busy_timeout_s:g} s")
            store = waiter[1][0]
            if store is not None:
                return store

    def _give_back(self, store: MemoryStore) -> None:
        with self._lock:
            if self._closed:
                store.close()
                return
            if self._waiting:
                event, slot = self._waiting.popleft()
                slot.append(store)
                event.set()
                return
            self._idle.append(store)

    def close(self) -> None:
        """Close the idle stores now and each lent one when it is given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for store in idle:
            store.close()
