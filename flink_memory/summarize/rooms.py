"""What fits in each request: the room for a batch's items, a merge's children, a global's, and the length asked
of a summary so that fan_in of them fit one merge. One home for this arithmetic; the start-up check
(flink_memory.budgets) and every packer (batches, reduce rounds, the tree's merges) ask it.

A room is the window less the output, a reserve (tokens.budget) and the request's frame (its system prompt and
chat template, with no entries), counted at a calibration scale. What must not depend on what a process has
learned of the provider's counts (the target asked of a child, the room long texts are cut to) is counted
uncalibrated (scale 1), so a restored job asks exactly what it asked before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flink_memory.config import Config
from flink_memory.summarize.prompts import Purpose, messages_for
from flink_memory.tokens.budget import Budget
from flink_memory.tokens.counter import TokenCounter

_TARGET_SLACK = 2  # the target's digits in the system prompt may differ between rounds


def frame_tokens(budget: Budget, purpose: Purpose, target_tokens: int, scale: float | None = None) -> int:
    """Tokens of a request of `purpose` with no entries (system prompt and chat template)."""
    return budget.counter.request(messages_for(purpose, [], target_tokens), scale) + 1


def entry_room(budget: Budget, purpose: Purpose, target_tokens: int, scale: float | None = None) -> int:
    """Tokens the entries of one request may take."""
    return budget.prompt_room() - frame_tokens(budget, purpose, target_tokens, scale)


def summary_length(budget: Budget, room: int, shares: int) -> int:
    """Length to ask of one of `shares` summaries that the next request holds together in `room` tokens (the
    one formula: a child of a merge, a group of a reduce round)."""
    return max(16, min(budget.max_output_tokens, room // shares - 8))


def child_target(budget: Budget, fan_in: int) -> int:
    """Length to ask of a summary that a merge will combine with fan_in - 1 siblings.

    The merge frame is counted uncalibrated (scale 1, an upper bound): the target is in every batch and merge
    prompt, so it must not depend on what a process has learned, or a restored job would ask differently."""
    return summary_length(budget, entry_room(budget, "merge", budget.max_output_tokens, 1.0), fan_in)


def batch_item_room(config: Config) -> int:
    """Tokens the items of one batch request may take, by the uncalibrated estimate: what a text is cut to fit
    before batching, so its parts never depend on what a process has learned of the provider's counts."""
    budget = Budget(config.llm.context_window, config.llm.max_output_tokens, TokenCounter())
    return entry_room(budget, "batch", child_target(budget, config.summarization.fan_in))


def entry_limit(budget: Budget, purpose: Purpose, scale: float | None = None) -> int:
    """Tokens the entries of one request of `purpose` may take, whichever round it turns out to be in: what
    the batcher fills a batch to, so that a batch it closes is always one request."""
    out = budget.max_output_tokens
    round_purpose: Purpose = "part" if purpose == "batch" else purpose
    return min(entry_room(budget, purpose, out, scale), entry_room(budget, round_purpose, out, scale)) - _TARGET_SLACK


@dataclass
class BatchLimits:
    """When the batcher closes a batch: at `max_items`, or when its items fill one request (or
    batching.max_tokens), at the calibration it was opened with."""

    max_items: int
    configured_tokens: int | None  # batching.max_tokens; None: as much as one request holds
    target_tokens: int  # summary length asked of a batch, so that fan_in of them fit one merge
    _rooms: dict[float, int] = field(default_factory=dict, repr=False, compare=False)

    def max_tokens(self, budget: Budget, scale: float) -> int:
        """Item tokens one batch packed at `scale` may take (the room follows the calibration)."""
        if scale not in self._rooms:
            room = entry_limit(budget, "batch", scale)
            self._rooms[scale] = min(room, self.configured_tokens) if self.configured_tokens else room
        return self._rooms[scale]


@dataclass(frozen=True)
class Rooms:
    """What fits in each request of a job that does not depend on what it learns of the provider's counts, worked
    out once from its config when a stage core (or the start-up check) is made; the rooms asked at a calibration
    scale as the job runs are the functions above."""

    child_target: int  # the length asked of a batch or merge summary, so that fan_in of them fit one merge
    batch_item_room: int  # a batch's items by the uncalibrated estimate: what long texts are cut to fit
    batch: BatchLimits

    @classmethod
    def from_config(cls, config: Config, budget: Budget) -> Rooms:
        target = child_target(budget, config.summarization.fan_in)
        limits = BatchLimits(config.batching.max_items, config.batching.max_tokens or None, target)
        return cls(target, batch_item_room(config), limits)
