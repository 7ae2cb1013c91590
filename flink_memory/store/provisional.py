"""Provisional rows written behind: the job's unit-row messages shown in the store within `flush_s`, many
in one transaction.

A message per transaction costs a write lock, a commit and the agent's generation bump each: at stream speed
that is most of a store writer's time, and it contends with the applier for the write lock. The writer hands
messages over (`submit`, in order) and a thread of its own writes what has gathered, in order, every
`flush_s`; `close` writes the rest. A store error is raised to the writer on its next `submit` or `close`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flink_memory.memory_log import UnitRows
from flink_memory.store.sql import MemoryStore

FLUSH_S = 0.05  # the longest a unit waits to be shown


class WriteBehind:
    """Shows unit-rows messages through `store.write_provisional` from a thread; `written` hears the agents."""

    def __init__(self, store: MemoryStore, written: Callable[[list[str]], None] | None = None,
                 flush_s: float = FLUSH_S) -> None:
        self.store, self.written, self.flush_s = store, written, flush_s
        self._pending: list[UnitRows] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="flink-memory-provisional", daemon=True)
        self._thread.start()

    def submit(self, rows: UnitRows) -> None:
        if self.error is not None:
            raise self.error
        with self._lock:
            self._pending.append(rows)

    def close(self) -> None:
        """Write what is left, stop the thread; raise what failed."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.flush_s)
            with self._lock:
                batch, self._pending = self._pending, []
            if batch:
                try:
                    self.store.write_provisional(batch)
                    if self.written is not None:
                        self.written(sorted({rows.agent_id for rows in batch if rows.upsert}))
                except BaseException as exc:  # noqa: BLE001 - handed to the writer
                    self.error = exc
                    return
            if stopping:
                return
