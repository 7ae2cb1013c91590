"""LLM calls on worker threads, looked up by request digest, with an estimate of when each one ends.

Operators never block on a call during normal processing: they submit requests, and a key is woken when
its calls are expected to be done (`wake_at_ms`: the call's start plus the typical latency seen so far), so
finished work is applied within a few milliseconds instead of a fixed polling interval. Keyed by digest, a
request submitted twice runs once, and a result outlives the failure of its siblings in the same round (the
journal keeps it across restarts too). A worker thread starts the next queued call the moment one ends.
"""

from __future__ import annotations

import bisect
import itertools
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from flink_memory.requests import ChatRequest, ChatResult

# Which queued call a free worker takes first: calls that other work waits for before calls nothing waits
# for (a plan holds back its agent's records, a batch its merges and global; a global ends a chain), so the
# last chains of a run do not end with the pool half idle.
PRIORITY = {"plan": 1, "part": 2, "batch": 2, "merge": 3, "global": 4}


@dataclass
class _Call:
    future: Future[ChatResult]
    seq: int
    priority: int = 3
    started_at: float | None = None

    @property
    def order(self) -> tuple[int, int]:
        """Its place in the queue: a worker takes the smallest first."""
        return self.priority, self.seq


class CallPool:
    def __init__(self, complete: Any, workers: int, *, min_poll_ms: int = 5, max_poll_ms: int = 1000) -> None:
        self._complete = complete
        self.workers = workers
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"flink-memory-llm-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._waiting: list[tuple[int, int]] = []  # queue order of the calls no worker has picked up, sorted
        self._running: dict[int, _Call] = {}  # by seq
        self._latency_s: float | None = None  # moving average of call durations
        self.min_poll_ms = min_poll_ms
        self.max_poll_ms = max_poll_ms

    def submit(self, request: ChatRequest) -> None:
        key = request.digest
        with self._lock:
            if key in self._calls or self._closed:
                return
            call = _Call(Future(), next(self._seq), PRIORITY.get(request.kind, 3))
            self._calls[key] = call
            bisect.insort(self._waiting, call.order)
        self._queue.put((call.priority, call.seq, (call, request)))

    def _work(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            call, request = item
            with self._lock:  # (queued to running in one step: wake_at_ms always finds it in one of the two)
                index = bisect.bisect_left(self._waiting, call.order)
                if index < len(self._waiting) and self._waiting[index] == call.order:
                    del self._waiting[index]
                if not call.future.set_running_or_notify_cancel():
                    continue
                started = time.monotonic()
                call.started_at = started
                self._running[call.seq] = call
            try:
                call.future.set_result(self._complete(request))
            except BaseException as exc:  # noqa: BLE001 - the caller reads it from the future
                call.future.set_exception(exc)
            finally:
                elapsed = time.monotonic() - started
                with self._lock:
                    self._running.pop(call.seq, None)
                    self._latency_s = elapsed if self._latency_s is None else 0.8 * self._latency_s + 0.2 * elapsed

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for c in self._calls.values() if not c.future.done())

    def finished(self) -> Mapping[str, ChatResult | BaseException]:
        """Finished calls by digest (what the stage cores read); unfinished and unknown ones are absent."""
        return _FinishedView(self)

    def _result(self, digest: str) -> ChatResult | BaseException | None:
        with self._lock:
            call = self._calls.get(digest)
        if call is None or not call.future.done():
            return None
        error = call.future.exception()
        return error if error is not None else call.future.result()

    def any_done(self, digests: Iterable[str]) -> bool:
        """Whether one of these calls has finished (or is unknown here, e.g. after a restore)."""
        with self._lock:
            return any((c := self._calls.get(d)) is None or c.future.done() for d in digests)

    def all_done(self, digests: Iterable[str]) -> bool:
        """Whether every one of these calls has finished (or is unknown here)."""
        with self._lock:
            return all((c := self._calls.get(d)) is None or c.future.done() for d in digests)

    def wake_at_ms(self, digests: Iterable[str], now_ms: int) -> int:
        """When to look at these calls again: when the first of them is expected to end."""
        now = time.monotonic()
        latency = self._latency_s if self._latency_s is not None else 0.2
        soonest: float | None = None
        with self._lock:
            slots: list[float] | None = None  # when each worker is expected to be free, soonest first
            for digest in digests:
                call = self._calls.get(digest)
                if call is None or call.future.done():
                    return now_ms
                if call.started_at is not None:
                    eta = call.started_at + latency
                    if eta <= now:  # running longer than usual: look again after a fraction of its age
                        eta = now + min(self.max_poll_ms / 1000, 0.2 * (now - call.started_at))
                else:  # queued: it starts when the workers have taken every call before it in queue order
                    if slots is None:
                        slots = self._free_at(now, latency)
                    ahead = bisect.bisect_left(self._waiting, call.order)
                    eta = slots[ahead % len(slots)] + latency * (ahead // len(slots)) + latency
                soonest = eta if soonest is None else min(soonest, eta)
        if soonest is None:
            return now_ms
        delay_ms = int((soonest - now) * 1000) + 1
        return now_ms + max(self.min_poll_ms, min(self.max_poll_ms, delay_ms))

    def _free_at(self, now: float, latency: float) -> list[float]:
        """When each worker is expected to take its next call (now for an idle one), soonest first."""
        ends = sorted(max(now, (c.started_at or now) + latency) for c in self._running.values())
        return ends[: self.workers] + [now] * max(0, self.workers - len(ends))

    def wait(self, digests: Iterable[str], timeout_s: float | None = None) -> None:
        """Block until every given (submitted) call is done, or the timeout passes."""
        with self._lock:
            futures = [c.future for d in digests if (c := self._calls.get(d)) is not None]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = [f for f in futures if not f.done()]
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            pending = [f for f in pending if not f.done()]
            if deadline is not None and time.monotonic() >= deadline:
                return

    def forget(self, digests: Iterable[str]) -> None:
        with self._lock:
            for digest in digests:
                call = self._calls.get(digest)
                if call is not None and call.future.done():
                    del self._calls[digest]

    def close(self, grace_s: float = 0.0) -> None:
        """Cancel queued calls; give running ones `grace_s` to finish, so their results reach the journal
        (an operator closing on failure or cancel then does not pay for them again after the restart)."""
        with self._lock:
            self._closed = True
            for call in self._calls.values():
                call.future.cancel()  # queued ones only: a running future cannot be cancelled
            running = [c.future for c in self._calls.values() if not c.future.done()]
        for _ in self._threads:
            self._queue.put((-1, -1, None))
        if running and grace_s > 0:
            wait(running, timeout=grace_s)


class _FinishedView(Mapping[str, "ChatResult | BaseException"]):
    def __init__(self, pool: CallPool) -> None:
        self._pool = pool

    def __getitem__(self, digest: str) -> ChatResult | BaseException:
        result = self._pool._result(digest)
        if result is None:
            raise KeyError(digest)
        return result

    def get(self, digest: str, default: Any = None) -> Any:  # type: ignore[override]
        result = self._pool._result(digest)
        return default if result is None else result

    def __iter__(self):  # type: ignore[no-untyped-def]
        with self._pool._lock:
            return iter([d for d, c in self._pool._calls.items() if c.future.done()])

    def __len__(self) -> int:
        return sum(1 for _ in self)
