"""Per-agent batch packing: close at max_items or at the token budget (and, on unbounded input, a timeout).

The buffer is small state (counts and the newest entry's dates); the units themselves live in a map keyed
by sequence number, so adding a unit reads and writes one entry, never the whole batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from pydantic import BaseModel

from flink_memory.records import MemoryUnit
from flink_memory.summarize.prompts import Packer
from flink_memory.summarize.rooms import BatchLimits
from flink_memory.tokens.budget import Budget


def unit_entry(unit: MemoryUnit | dict[str, Any]) -> dict[str, Any]:
    """How a memory unit appears in a batch prompt: its text and its time."""
    data = unit.model_dump(mode="json") if isinstance(unit, MemoryUnit) else unit
    return {"text": data["text"], "from": data.get("ts"), "to": data.get("ts")}


class ClosedBatch(NamedTuple):
    seqs: range  # the sequence numbers of its units
    scale: float | None  # the calibration its units were packed with: its request is built with the same


class BatchBuffer(BaseModel):
    """Units waiting for their batch: sequence numbers first .. first + count - 1.

    The open batch keeps the calibration scale it was opened with, so where it closes depends on the units
    alone: a job restored from a checkpoint closes it at the same unit and sends the same request (a journal
    hit), whatever the counter has learned since."""

    first: int = 0
    count: int = 0
    tokens: int = 0
    opened_at_ms: int | None = None
    last: dict[str, Any] | None = None  # the newest entry's dates (the next one's date line depends on it)
    scale: float | None = None

    @property
    def next_seq(self) -> int:
        """The sequence number the next unit gets."""
        return self.first + self.count

    def add(self, entry: dict[str, Any], limits: BatchLimits, now_ms: int, budget: Budget) -> list[ClosedBatch]:
        """Add one entry (it gets `next_seq`); returns the batches this closes.

        Costs are counted as the batch request renders them (a date line only where the day changes). A unit
        larger than the whole budget is a batch of its own (the reduce job splits its text).
        """
        closed: list[ClosedBatch] = []
        self._open(budget, now_ms)
        cost = self._packer(budget).cost(entry)
        if self.count and self.tokens + cost > limits.max_tokens(budget, self.scale):
            closed.append(self.take())
            self._open(budget, now_ms)
            cost = self._packer(budget).cost(entry)
        self.count += 1
        self.tokens += cost
        self.last = {"from": entry.get("from"), "to": entry.get("to"), "text": ""}
        if self.count >= limits.max_items or self.tokens >= limits.max_tokens(budget, self.scale):
            closed.append(self.take())
        return closed

    def repack(self, entries: list[dict[str, Any] | None], limits: BatchLimits, now_ms: int,
               budget: Budget) -> Iterator[ClosedBatch]:
        """Pack the buffered entries again, at the scale of now (`entries`: those of `first` .. `next_seq - 1`,
        None for a unit retracted meanwhile); yields the batches this closes, the rest stays buffered."""
        opened_at = self.opened_at_ms
        self.count, self.tokens, self.last, self.scale = 0, 0, None, None
        for entry in entries:
            if entry is None:  # (a gap keeps its sequence number)
                self._open(budget, now_ms)
                self.count += 1
                continue
            yield from self.add(entry, limits, now_ms, budget)
        if self.count and opened_at is not None:  # (the units left over arrived that long ago)
            self.opened_at_ms = min(opened_at, self.opened_at_ms or opened_at)

    def _open(self, budget: Budget, now_ms: int) -> None:
        if not self.count:
            self.opened_at_ms = now_ms
        if self.scale is None:  # (a buffer opened without a scale takes the current one once)
            self.scale = budget.counter.scale_for("batch")

    def _packer(self, budget: Budget) -> Packer:
        """A packer positioned after the buffered units (only the last one's date matters)."""
        return Packer.after(budget.counter, self.count, self.tokens, self.last, self.scale)

    def take(self) -> ClosedBatch:
        taken = ClosedBatch(range(self.first, self.first + self.count), self.scale)
        self.first += self.count
        self.count, self.tokens, self.opened_at_ms, self.last, self.scale = 0, 0, None, None, None
        return taken
