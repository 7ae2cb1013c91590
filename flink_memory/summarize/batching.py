"""Per-agent batch packing: close at max_items, at the token budget, or when a timeout says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_memory.config import Config
from flink_memory.summarize.prompts import element
from flink_memory.summarize.reduce import frame_tokens
from flink_memory.tokens import Budget, estimate_tokens


def unit_entry(unit: dict[str, Any]) -> dict[str, Any]:
    """How a memory unit appears in a batch prompt."""
    entry = {"id": unit["unit_id"], "ts": unit.get("ts"), "text": unit["text"]}
    return {k: v for k, v in entry.items() if v is not None}


def unit_cost(unit: dict[str, Any]) -> int:
    return estimate_tokens(element(unit_entry(unit))) + 2


@dataclass(frozen=True)
class BatchLimits:
    max_items: int
    max_tokens: int

    @classmethod
    def from_config(cls, config: Config) -> BatchLimits:
        room = Budget(config.llm.context_window, config.llm.max_output_tokens).input_tokens - frame_tokens("batch")
        wanted = config.batching.max_tokens
        return cls(config.batching.max_items, min(room, wanted) if wanted else room)


@dataclass
class BatchBuffer:
    """Units waiting for their batch; plain data kept in keyed state."""

    units: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    opened_at_ms: int | None = None

    def add(self, unit: dict[str, Any], limits: BatchLimits, now_ms: int) -> list[list[dict[str, Any]]]:
        """Add one unit; returns the batches this closes, oldest first.

        A unit larger than the whole budget is a batch of its own (the reduce job splits its text).
        """
        closed: list[list[dict[str, Any]]] = []
        cost = unit_cost(unit)
        if self.units and self.tokens + cost > limits.max_tokens:
            closed.append(self.take())
        if not self.units:
            self.opened_at_ms = now_ms
        self.units.append(unit)
        self.tokens += cost
        if len(self.units) >= limits.max_items or self.tokens >= limits.max_tokens:
            closed.append(self.take())
        return closed

    def take(self) -> list[dict[str, Any]]:
        units, self.units, self.tokens, self.opened_at_ms = self.units, [], 0, None
        return units

    def to_state(self) -> dict[str, Any]:
        return {"units": self.units, "tokens": self.tokens, "opened_at_ms": self.opened_at_ms}

    @classmethod
    def from_state(cls, data: dict[str, Any] | None) -> BatchBuffer:
        return cls(**data) if data else cls()
