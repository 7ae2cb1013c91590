"""Metric counters of the Flink shell, batched: each increment handed to Flink is a call into the JVM."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

METRIC_FLUSH_S = 0.5  # metric increments are summed in Python and handed to Flink at most this often


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
