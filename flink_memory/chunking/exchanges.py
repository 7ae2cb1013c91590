"""Exchanges, plans and chunks: the planner may choose boundaries, never text.

An exchange is a user message with the replies that follow it (messages before the first user message
join the first exchange). A plan is the list of end-exchange indices of its chunks. Chunks are slices of
the source's own message objects, so every value stays byte-for-byte the source's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flink_memory.tokens.estimate import estimate_tokens

Exchange = tuple[int, int]  # first and last message index, inclusive


class InvalidPlan(ValueError):
    """A planner answer that does not describe a partition of the exchanges."""


def group_exchanges(messages: Sequence[dict[str, Any]]) -> list[Exchange]:
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not starts:
        return [(0, len(messages) - 1)]
    if starts[0] != 0:
        starts[0] = 0  # leading system/assistant messages belong to the first exchange
    ends = [s - 1 for s in starts[1:]] + [len(messages) - 1]
    return list(zip(starts, ends))


def render_messages(messages: Sequence[dict[str, Any]]) -> str:
    """A chunk as text for summarization (the chunk itself keeps the original objects)."""
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)


def exchange_costs(messages: Sequence[dict[str, Any]], exchanges: Sequence[Exchange]) -> list[int]:
    return [estimate_tokens(render_messages(messages[a : b + 1])) + 1 for a, b in exchanges]


def fixed_plan(costs: Sequence[int], max_tokens: int) -> list[int]:
    """Greedy size-based boundaries that never split an exchange."""
    boundaries: list[int] = []
    used = 0
    for index, cost in enumerate(costs):
        if index > 0 and used and used + cost > max_tokens:
            boundaries.append(index - 1)
            used = 0
        used += cost
    boundaries.append(len(costs) - 1)
    return boundaries


def validate_plan(answer: Any, n_exchanges: int) -> list[int]:
    """Integers, strictly increasing, in range, ending at the last exchange; else InvalidPlan."""
    if isinstance(answer, dict):
        if set(answer) != {"ends"}:
            raise InvalidPlan(f"expected an object with the single key 'ends', got keys {sorted(answer)[:5]}")
        answer = answer["ends"]
    if not isinstance(answer, list):
        raise InvalidPlan(f"expected a list of end indices, got {type(answer).__name__}")
    if not answer:
        raise InvalidPlan("empty list of end indices")
    if len(answer) > n_exchanges:
        raise InvalidPlan(f"{len(answer)} end indices for {n_exchanges} exchanges")
    for value in answer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidPlan(f"end index {value!r} is not an integer")
        if not 0 <= value < n_exchanges:
            raise InvalidPlan(f"end index {value} is out of range 0..{n_exchanges - 1}")
    for before, after in zip(answer, answer[1:]):
        if after <= before:
            raise InvalidPlan(f"end indices are not strictly increasing ({before} then {after})")
    if answer[-1] != n_exchanges - 1:
        raise InvalidPlan(f"the last end index must be the final exchange {n_exchanges - 1}, got {answer[-1]}")
    return list(answer)


def enforce_budget(boundaries: Sequence[int], costs: Sequence[int], max_tokens: int) -> list[int]:
    """Split any chunk over budget at exchange boundaries (a lone oversized exchange stays whole)."""
    result: list[int] = []
    start = 0
    for end in boundaries:
        result.extend(start + b for b in fixed_plan(costs[start : end + 1], max_tokens))
        start = end + 1
    return result


def materialize(
    messages: Sequence[dict[str, Any]], exchanges: Sequence[Exchange], boundaries: Sequence[int],
    costs: Sequence[int], max_tokens: int,
) -> list[dict[str, Any]]:
    """Chunks as slices of the source messages; flags a single exchange over budget as oversized."""
    chunks = []
    start = 0
    for index, end in enumerate(boundaries):
        first, last = exchanges[start][0], exchanges[end][1]
        tokens = sum(costs[start : end + 1])
        chunks.append(
            {
                "index": index,
                "start": start,
                "end": end,
                "messages": list(messages[first : last + 1]),
                "tokens": tokens,
                "oversized": tokens > max_tokens,
            }
        )
        start = end + 1
    return chunks
