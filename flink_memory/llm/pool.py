"""LLM calls on worker threads, looked up by request digest.

Operators never block on a call: they submit requests, poll from timers, and apply results when they
are there. Keyed by digest, a request submitted twice runs once, and a result outlives the failure of
its siblings in the same round (the journal keeps it across restarts too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from flink_memory.llm.client import ChatRequest, ChatResult, LLMClient


class CallPool:
    def __init__(self, client: LLMClient, workers: int) -> None:
        self.client = client
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="flink-memory-llm")
        self._futures: dict[str, Future[ChatResult]] = {}
        self._lock = threading.Lock()

    def submit(self, request: ChatRequest) -> None:
        key = request.digest
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._executor.submit(self.client.complete, request)

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for f in self._futures.values() if not f.done())

    def poll(self, request: ChatRequest) -> ChatResult | BaseException | None:
        """The result, the error, or None while the call runs (or was never submitted)."""
        with self._lock:
            future = self._futures.get(request.digest)
        if future is None or not future.done():
            return None
        error = future.exception()
        return error if error is not None else future.result()

    def known(self, request: ChatRequest) -> bool:
        with self._lock:
            return request.digest in self._futures

    def wait(self, requests: Iterable[ChatRequest], timeout_s: float | None = None) -> None:
        """Block until every given (submitted) request is done, or the timeout passes."""
        with self._lock:
            futures = [self._futures[r.digest] for r in requests if r.digest in self._futures]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = [f for f in futures if not f.done()]
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            pending = [f for f in pending if not f.done()]
            if deadline is not None and time.monotonic() >= deadline:
                return

    def forget(self, requests: Iterable[ChatRequest]) -> None:
        with self._lock:
            for request in requests:
                self._futures.pop(request.digest, None)

    def close(self, grace_s: float = 0.0) -> None:
        """Cancel queued calls; give running ones `grace_s` to finish, so their results reach the journal
        (an operator closing on failure or cancel then does not pay for them again after the restart)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            running = [f for f in self._futures.values() if not f.done()]
        if running and grace_s > 0:
            wait(running, timeout=grace_s)
