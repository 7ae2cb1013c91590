"""Per-agent batch packing: close at max_items, at the token budget, or when a timeout says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_memory.config import Config
from flink_memory.summarize.prompts import Packer, child_target, entry_room
from flink_memory.tokens import Budget


def unit_entry(unit: dict[str, Any]) -> dict[str, Any]:
    """How a memory unit appears in a batch prompt: its text and its time."""
    return {"text": unit["text"], "from": unit.get("ts"), "to": unit.get("ts")}


@dataclass(frozen=True)
class BatchLimits:
    max_items: int
    max_tokens: int
    target_tokens: int  # summary length asked of a batch, so that fan_in of them fit one merge

    @classmethod
    def from_config(cls, config: Config, budget: Budget) -> BatchLimits:
        target = child_target(budget, config.summarization.fan_in)
        room = entry_room(budget, "batch", target)
        wanted = config.batching.max_tokens
        return cls(config.batching.max_items, min(room, wanted) if wanted else room, target)


@dataclass
class BatchBuffer:
    """Units waiting for their batch; plain data kept in keyed state."""

    units: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    opened_at_ms: int | None = None

    def add(self, unit: dict[str, Any], limits: BatchLimits, now_ms: int,
            budget: Budget) -> list[list[dict[str, Any]]]:
        """Add one unit; returns the batches this closes, oldest first.

        Costs are counted as the batch request renders them (a date line only where the day changes). A unit
        larger than the whole budget is a batch of its own (the reduce job splits its text).
        """
        closed: list[list[dict[str, Any]]] = []
        packer = self._packer(budget)
        cost = packer.cost(unit_entry(unit))
        if self.units and self.tokens + cost > limits.max_tokens:
            closed.append(self.take())
            cost = self._packer(budget).cost(unit_entry(unit))
        if not self.units:
            self.opened_at_ms = now_ms
        self.units.append(unit)
        self.tokens += cost
        if len(self.units) >= limits.max_items or self.tokens >= limits.max_tokens:
            closed.append(self.take())
        return closed

    def _packer(self, budget: Budget) -> Packer:
        """A packer positioned after the buffered units (only the last one's date matters)."""
        last = unit_entry(self.units[-1]) if self.units else None
        return Packer.after(budget.counter, len(self.units), self.tokens, last)

    def take(self) -> list[dict[str, Any]]:
        units, self.units, self.tokens, self.opened_at_ms = self.units, [], 0, None
        return units

    def to_state(self) -> dict[str, Any]:
        return {"units": self.units, "tokens": self.tokens, "opened_at_ms": self.opened_at_ms}

    @classmethod
    def from_state(cls, data: dict[str, Any] | None) -> BatchBuffer:
        return cls(**data) if data else cls()
