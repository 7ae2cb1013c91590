"""Per-agent batch packing: close at max_items or at the token budget (and, on unbounded input, a timeout).

The buffer is small state (counts and the newest entry's dates); the units themselves live in a map keyed
by sequence number, so adding a unit reads and writes one entry, never the whole batch.
"""

from __future__ import annotations

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

    The open batch is packed at the scale it was opened with, which its agent's batcher decides (its own
    first batch report, `stages.batcher`): where it closes depends on the units and that scale alone, never
    on when a call ended, so every run and every replay closes it at the same unit. A buffer opened with no
    scale (`held`: the agent's first batch has not reported yet) only keeps its units in order; the batcher
    packs them once the report has come."""

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

    @property
    def held(self) -> bool:
        """Units kept without a scale to pack them at (see the class)."""
        return bool(self.count) and self.scale is None

    def fits(self, entry: dict[str, Any], limits: BatchLimits, budget: Budget) -> bool:
        """Whether `entry` joins the open batch (always, when none is open or it is held)."""
        if not self.count or self.scale is None:
            return True
        return self.tokens + self._packer(budget).cost(entry) <= limits.max_tokens(budget, self.scale)

    def put(self, entry: dict[str, Any] | None, limits: BatchLimits, now_ms: int, budget: Budget,
            scale: float | None) -> ClosedBatch | None:
        """Add one entry (it gets `next_seq`; None: a gap, a unit retracted meanwhile), opening a batch at
        `scale` when none is open; returns the batch when this fills it (by count, or by tokens as the batch
        request renders them: a date line only where the day changes). A unit larger than the whole budget is
        a batch of its own (the reduce job splits its text)."""
        if not self.count:
            self.opened_at_ms, self.scale = now_ms, scale
        self.count += 1
        if entry is None:
            return None
        if self.scale is not None:
            self.tokens += self._packer(budget, self.count - 1).cost(entry)
        self.last = {"from": entry.get("from"), "to": entry.get("to"), "text": ""}
        if self.scale is not None and (self.count >= limits.max_items
                                       or self.tokens >= limits.max_tokens(budget, self.scale)):
            return self.take()
        return None

    def unpack(self) -> int | None:
        """Empty the open batch to pack its units again (they keep their sequence numbers); returns when it
        opened."""
        opened_at = self.opened_at_ms
        self.count, self.tokens, self.opened_at_ms, self.last, self.scale = 0, 0, None, None, None
        return opened_at

    def _packer(self, budget: Budget, count: int | None = None) -> Packer:
        """A packer positioned after the buffered units (only the last one's date matters)."""
        return Packer.after(budget.counter, self.count if count is None else count, self.tokens, self.last,
                            self.scale)

    def take(self) -> ClosedBatch:
        taken = ClosedBatch(range(self.first, self.first + self.count), self.scale)
        self.first += self.count
        self.count, self.tokens, self.opened_at_ms, self.last, self.scale = 0, 0, None, None, None
        return taken
