"""Summarize any list of entries into one text without ever sending a request larger than the window.

A `ReduceJob` is plain data (kept in a stage's state between calls). Each round is a pure function of
its entries and its frozen token scale: if they fit one request, that request is the final call; otherwise
an entry too large for a request is split into parts, entries are packed into groups that fit, and each group
is summarized into a shorter entry, asked to be short enough that the next round fits one request. The same
entries always give the same requests, so replays hit the journal.

Entries are `{"text", "from", "to"}` (from/to: RFC 3339 times or None).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from flink_memory.requests import ChatRequest, ChatResult, RequestFactory
from flink_memory.summarize.prompts import SUMMARY_PROMPT_VERSION, Packer, Purpose, escape, messages_for, written_bound
from flink_memory.summarize.rooms import entry_limit, entry_room, summary_length
from flink_memory.tokens.budget import Budget
from flink_memory.tokens.split import split_text

MAX_ROUNDS = 12
MAX_REJECTIONS = 8  # length rejections re-packed before the job waits like any failed call


class ReductionStalled(RuntimeError):
    """Summaries stopped getting shorter: the model returns outputs as long as its inputs."""


def _split_entry(entry: dict[str, Any], room: int, packer: Packer) -> list[dict[str, Any]]:
    """Split one entry's text so that every part fits `room` alone; deterministic."""
    header = packer.cost({**entry, "text": ""})
    counter, scale = packer.counter, packer.scale
    pieces = split_text(entry["text"], max(8, room - header), lambda t: counter.tokens(escape(t), scale))
    return [{**entry, "text": piece} for piece in pieces]


class ReduceJob(BaseModel):
    purpose: Purpose
    entries: list[dict[str, Any]]
    target_tokens: int | None = None  # length asked of the final summary; None: llm.max_output_tokens
    # the scale this round is packed at (kept for replays): the owner's (a batch's, from its agent's first
    # report), else the estimate's upper bound, or tighter where the job's last round taught how its text counts
    scale: float | None = None
    # a part round's own scale: the owner's scale was taught by the agent's first batch, which need not bound
    # another batch's text; decided once, from the job's own reports only (so a rerun packs the same)
    round_scale: float | None = None
    # the largest ratio (provider count / our count) the provider reported for the last round's requests:
    # what the next round's text (their answers) counts like, learned from the job's own requests only, so a
    # rerun packs its next round the same
    own_ratio: float | None = None
    round: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    attempts: int = 0
    retry_at_ms: int = 0
    rejections: int = 0
    truncated: bool = False
    models: list[str] = Field(default_factory=list)

    # --- planning ------------------------------------------------------------------------------------

    @property
    def _round_purpose(self) -> Purpose:
        return "part" if self.purpose == "batch" else self.purpose

    def _final_target(self, budget: Budget) -> int:
        return min(self.target_tokens or budget.max_output_tokens, budget.max_output_tokens)

    def _scale_now(self, budget: Budget) -> float:
        """The scale a round packed now takes: the upper bound, or tighter where the last round's reports taught
        how the job's own text counts. Never what the process has learned from other requests: that depends on
        which calls ended first, and a rerun would cut differently and pay again."""
        scale = budget.counter.calibration.initial
        if self.own_ratio is not None:
            scale = min(scale, budget.counter.calibration.scale_of(self.own_ratio))
        return scale

    def _plan(self, budget: Budget) -> tuple[bool, list[list[dict[str, Any]]]]:
        if self.scale is None:
            self.scale = self._scale_now(budget)
        final, groups = self._plan_at(budget, self.scale)
        if final or self._round_purpose == self.purpose:
            return final, groups
        if self.round_scale is None:  # parts are packed as a kind of their own: at the bound, or the job's own ratio
            self.round_scale = self._scale_now(budget)
        if self.round_scale > self.scale:  # (never final where the job's is not)
            return False, self._plan_at(budget, self.round_scale)[1]
        return False, groups

    def _plan_at(self, budget: Budget, scale: float) -> tuple[bool, list[list[dict[str, Any]]]]:
        room = entry_limit(budget, self.purpose, scale)
        alone = Packer(budget.counter, scale)  # (empty: each entry is costed with its date line)
        expanded: list[dict[str, Any]] = []
        for entry in self.entries:
            fits = alone.cost(entry) <= room
            expanded.extend([entry] if fits else _split_entry(entry, room, alone))
        whole = Packer(budget.counter, scale)
        if len(expanded) == len(self.entries) and sum(whole.add(e) for e in expanded) <= room:
            return True, [expanded]
        groups: list[list[dict[str, Any]]] = [[]]
        packer = Packer(budget.counter, scale)
        for entry in expanded:
            if groups[-1] and packer.used + packer.cost(entry) > room:
                groups.append([])
                packer = Packer(budget.counter, scale)
            groups[-1].append(entry)
            packer.add(entry)
        return False, groups

    def _round_target(self, budget: Budget, groups: int) -> int:
        """Each group's summary must leave room for the others in the next round's one request."""
        return summary_length(budget, entry_room(budget, self.purpose, budget.max_output_tokens, self.scale), groups)

    def requests(self, factory: RequestFactory) -> list[ChatRequest]:
        """The calls of the current round, in order."""
        budget = factory.budget
        final, groups = self._plan(budget)
        if final:
            messages = messages_for(self.purpose, groups[0], self._final_target(budget))
            return [factory.build(messages, prompt_version=SUMMARY_PROMPT_VERSION, scale=self.scale,
                                  kind=self.purpose, bound=self._bound(budget, messages, groups[0], self.scale))]
        target = self._round_target(budget, len(groups))
        scale = max(self.scale or 0.0, self.round_scale or 0.0)
        requests = []
        for group in groups:
            messages = messages_for(self._round_purpose, group, target)
            requests.append(factory.build(messages, prompt_version=SUMMARY_PROMPT_VERSION, scale=scale,
                                          kind=self._round_purpose, bound=self._bound(budget, messages, group, scale)))
        return requests

    def _bound(self, budget: Budget, messages: list[dict[str, str]], group: list[dict[str, Any]],
               scale: float | None) -> float | None:
        """The scale a request was packed at when its own text taught it, not its kind (`ChatRequest.bound`):
        a job's earlier round or the agent's summaries (`own_ratio`), and entries counted by what the
        provider counted writing them (`written_bound`); as one factor of the request's raw count."""
        counter = budget.counter
        own = None if self.own_ratio is None else counter.calibration.scale_of(self.own_ratio)
        at = scale or 1.0
        saved = 0
        for entry in group:
            if (bound := written_bound(entry)) is not None:
                saved += max(0, counter.line(escape(entry["text"]), at) - bound)
        if not saved:
            return at if own is not None and at <= own else None
        raw = counter.raw_request(messages)
        return (counter.request(messages, at) - saved) / raw if raw else None

    def advance(self, factory: RequestFactory, results: list[ChatResult]) -> str | None:
        """Apply the results of the current round; the final text once done, else None."""
        requests = self.requests(factory)
        final, groups = self._plan(factory.budget)
        if len(results) != len(groups):
            raise ValueError(f"round {self.round} expects {len(groups)} results, got {len(results)}")
        counter = factory.budget.counter
        ratios = [result.prompt_tokens / ours for request, result in zip(requests, results)
                  if result.prompt_tokens > 0 and (ours := counter.raw_request(request.message_dicts())) > 0]
        self.own_ratio = max(ratios) if ratios else self.own_ratio
        for result in results:
            self.calls += 0 if result.from_journal else 1
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens
            self.truncated = self.truncated or result.truncated
            if result.model not in self.models:
                self.models.append(result.model)
        if final:
            return results[0].text
        self.round += 1
        if self.round >= MAX_ROUNDS:
            raise ReductionStalled(f"{self.purpose} summary did not converge in {MAX_ROUNDS} rounds")
        self.entries = [_condensed(group, result) for group, result in zip(groups, results)]
        # the next round is packed by what this round's reports taught (kept in state from then on), or at the
        # scale a length rejection forced
        self.scale = self.scale if self.rejections else None
        self.round_scale = None
        return None

    def rejected(self, factory: RequestFactory) -> bool:
        """A request of this round was refused for its length: re-pack smaller (False once tried too often)."""
        if self.rejections >= MAX_REJECTIONS:
            return False
        self.rejections += 1
        self.scale = (self.scale or factory.budget.counter.calibration.initial) * 1.25
        self.round_scale = None
        return True


def _condensed(group: list[dict[str, Any]], result: ChatResult) -> dict[str, Any]:
    """A group's summary as an entry of the next round, with the time range it stands for (and the tokens the
    provider counted writing it)."""
    starts = [e["from"] for e in group if e.get("from")]
    ends = [e["to"] for e in group if e.get("to")]
    entry = {"text": result.text, "from": min(starts) if starts else None, "to": max(ends) if ends else None}
    if result.completion_tokens:
        entry["tokens"] = result.completion_tokens
    return entry
