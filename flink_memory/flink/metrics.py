"""Metric counters of the Flink shell, batched: each increment handed to Flink is a call into the JVM."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flink_memory.requests import ChatRequest, ChatResult

METRIC_FLUSH_S = 0.5  # metric increments are summed in Python and handed to Flink at most this often
MAX_UNCONSUMED = 10_000  # results counted at their end and remembered until consumed, before a cleanup
REPORT_EVERY_S = 1.0  # a stage blocked on calls (the end of a bounded input) reports at least this often


class Tally:
    """Metric counters whose increments are summed in Python and handed to Flink every METRIC_FLUSH_S: each
    `inc` is a call into the JVM (tens of microseconds), which per record would cost more than the record."""

    def __init__(self, group: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        self.clock = clock
        self.counters: dict[str, Any] = {}
        self.pending: Counter[str] = Counter()
        self.flushed_at = clock()

    def add(self, name: str, n: int = 1) -> None:
        self.pending[name] += n
        if self.clock() - self.flushed_at >= METRIC_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        for name, n in self.pending.items():
            if n:
                if name not in self.counters:
                    self.counters[name] = self.group.counter(name)
                self.counters[name].inc(n)
        self.pending.clear()
        self.flushed_at = self.clock()


class CallMeter:
    """Counts a stage function's LLM calls when they end, not when its core consumes their results.

    On a bounded input the cores consume results between end-of-input rounds, which on a slow model can be
    minutes apart: counted at consumption, `llm_calls` would stand still while the provider answers. Calls
    are matched by request digest; a result counted here is remembered (by identity) until its core consumes
    it, so it is counted once either way. `open_calls` is how many of this function's calls are queued or
    running: the `llm_in_flight` level."""

    def __init__(self, tally: Tally, latency: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.tally, self.latency, self.clock = tally, latency, clock
        self.open: set[str] = set()  # digests of submitted calls not seen finished yet
        self.counted: dict[int, tuple[str, ChatResult]] = {}  # results counted when they ended, until consumed
        self.synced_at = clock()

    @property
    def open_calls(self) -> int:
        return len(self.open)

    def submitted(self, requests: Iterable[ChatRequest]) -> None:
        self.open.update(request.digest for request in requests)

    def sync(self, finished: Mapping[str, ChatResult | BaseException], force: bool = False) -> None:
        """Count the calls that ended since the last sync (at most every METRIC_FLUSH_S unless forced: it
        looks at every open call)."""
        if not force and self.clock() - self.synced_at < METRIC_FLUSH_S:
            return
        self.synced_at = self.clock()
        for digest in [d for d in self.open if finished.get(d) is not None]:
            self.open.discard(digest)
            result = finished.get(digest)
            if isinstance(result, ChatResult):  # (a failure is counted when its core sees it)
                self.count(result)
                self.counted[id(result)] = (digest, result)
        if len(self.counted) > MAX_UNCONSUMED:  # results no core will take (an evicted key's) left the pool
            self.counted = {k: v for k, v in self.counted.items() if finished.get(v[0]) is not None}

    def consumed(self, results: Iterable[ChatResult], digests: Iterable[str]) -> None:
        """A core consumed these: count what no sync counted yet, and stop tracking their calls."""
        for result in results:
            if self.counted.pop(id(result), None) is None:
                self.count(result)
        self.open.difference_update(digests)

    def count(self, result: ChatResult) -> None:
        if result.from_journal:
            self.tally.add("journal_hits")
        else:
            self.tally.add("llm_calls")
            self.tally.add(f"llm_calls_{result.kind or 'other'}")
            self.tally.add("llm_call_ms", int(result.latency_s * 1000))
            self.latency.update(int(result.latency_s * 1000))
        self.tally.add("prompt_tokens", result.prompt_tokens)
        self.tally.add("completion_tokens", result.completion_tokens)
        if result.truncated:
            self.tally.add("llm_truncated")
