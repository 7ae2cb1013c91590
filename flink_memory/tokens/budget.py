"""Request budgets: prompt + max_tokens never above the context window, measured with one counter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_memory.tokens.counter import TokenCounter


def reserve_tokens(context_window: int) -> int:
    """Head room left free in every packed request: joins of separately counted pieces can merge or split."""
    return max(8, context_window // 100)


@dataclass
class Budget:
    """prompt + max_tokens never above context_window, measured with one counter."""

    context_window: int
    max_output_tokens: int
    counter: TokenCounter = field(default_factory=TokenCounter)

    @property
    def reserve(self) -> int:
        return reserve_tokens(self.context_window)

    def prompt_room(self, max_tokens: int | None = None) -> int:
        """Prompt tokens a packed request may carry (by the counter's current scale)."""
        out = self.max_output_tokens if max_tokens is None else max_tokens
        return self.context_window - out - self.reserve

    def check(self, messages: list[dict[str, Any]], max_tokens: int | None = None,
              scale: float | None = None) -> int:
        """Raise if a request could exceed the window; returns its prompt count."""
        count = self.counter.request(messages, scale)
        out = self.max_output_tokens if max_tokens is None else max_tokens
        if count + out > self.context_window:
            raise RequestTooLarge(
                f"request of ~{count} prompt tokens + {out} output tokens exceeds the context window "
                f"of {self.context_window}"
            )
        return count


class RequestTooLarge(ValueError):
    """A request that could exceed the context window: a bug upstream, never sent."""
