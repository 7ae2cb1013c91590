"""The start-up check of the token budget: what it accepts never makes a request that does not fit.

It asks the same rooms the packers use (`summarize.rooms`; the chunk planner's for plans), with
the conservative estimate unless a counter is given, and refuses an impossible window with the smallest
`llm.context_window` that works for the other settings.
"""

from __future__ import annotations

from flink_memory.chunking.plans import PLAN_OUTPUT_TOKENS, ChunkPlanner
from flink_memory.config import Config, ConfigError
from flink_memory.requests import RequestFactory
from flink_memory.summarize.prompts import Packer
from flink_memory.summarize.rooms import Rooms, entry_room
from flink_memory.tokens.counter import TokenCounter

# A summary of N model tokens counts up to this many N by the calibrated estimate (merges and later rounds
# are packed after the first responses have calibrated the count; an exact tokenizer counts 1).
CALIBRATED_OUTPUT_FACTOR = 1.5
MIN_BATCH_ROOM = 64
MIN_PLANNER_LINES = 4


def problems(config: Config, counter: TokenCounter | None = None) -> list[str]:
    """Why these settings cannot run (empty when they can)."""
    counter = counter or TokenCounter()
    factory = RequestFactory.from_config(config.llm, counter)
    budget = factory.budget
    found: list[str] = []
    if budget.prompt_room() <= 0:
        return [f"llm.max_output_tokens ({config.llm.max_output_tokens}) leaves no room for a prompt"]
    rooms = Rooms.from_config(config, budget)
    batch_room = entry_room(budget, "batch", rooms.child_target)
    if batch_room < MIN_BATCH_ROOM:
        found.append(f"a batch request has room for {batch_room} tokens of items (needs {MIN_BATCH_ROOM})")
    factor = 1 if counter.exact else CALIBRATED_OUTPUT_FACTOR
    summary = Packer(counter).cost({"text": "x", "from": "2026-01-01", "to": "2026-12-31"})
    summary += int(config.llm.max_output_tokens * factor)
    for purpose in ("merge", "global", "part"):
        room = entry_room(budget, purpose, config.llm.max_output_tokens)
        if room < 2 * summary:
            found.append(f"a {purpose} request has room for {room} tokens, two summaries of "
                         f"llm.max_output_tokens need {2 * summary}")
            break
    if config.chunking.semantic:
        planner = ChunkPlanner(config, factory, rooms.batch_item_room)
        lines = planner.lines_per_request(None)
        if budget.context_window - PLAN_OUTPUT_TOKENS <= 0 or lines < MIN_PLANNER_LINES:
            found.append(f"a planning request holds {max(0, lines)} exchanges (needs {MIN_PLANNER_LINES})")
    return found


def minimum_window(config: Config, counter: TokenCounter | None = None) -> int | None:
    """The smallest llm.context_window that works with the other settings (None: none up to 10M tokens)."""
    low, high = 512, 10_000_000

    def works(window: int) -> bool:
        return not problems(config.model_copy(update={"llm": config.llm.model_copy(
            update={"context_window": window})}), counter)

    if not works(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if works(middle):
            high = middle
        else:
            low = middle + 1
    return low


def check(config: Config, counter: TokenCounter | None = None) -> None:
    """Raise ConfigError naming every problem and the smallest window that works."""
    found = problems(config, counter)
    if not found:
        return
    smallest = minimum_window(config, counter)
    advice = (f"the smallest llm.context_window that works with these settings is {smallest}"
              if smallest else "no context window works: lower llm.max_output_tokens")
    raise ConfigError(f"llm.context_window = {config.llm.context_window} is too small with "
                      f"llm.max_output_tokens = {config.llm.max_output_tokens}: {'; '.join(found)}; {advice}")
