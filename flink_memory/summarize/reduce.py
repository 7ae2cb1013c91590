"""Summarize any list of entries into one text without ever sending a request larger than the window.

A `ReduceJob` is plain data (it lives in Flink state between calls). Each round is a pure function of
its entries: if they fit one request, that request is the final call; otherwise an entry too large for a
request is split into parts, entries are packed into groups that fit, and each group is summarized into
a new, shorter entry. The same entries always give the same requests, so replays hit the journal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_memory.config import SUMMARY_PROMPT_VERSION
from flink_memory.llm.client import ChatRequest, ChatResult, RequestFactory
from flink_memory.summarize.prompts import Purpose, element, messages_for
from flink_memory.tokens import estimate_messages, estimate_tokens, split_text

MAX_ROUNDS = 12
_SEPARATOR = 2  # ",\n" between array elements


class ReductionStalled(RuntimeError):
    """Summaries stopped getting shorter: the model returns outputs as long as its inputs."""


def _text_key(entry: dict[str, Any]) -> str:
    return "text" if "text" in entry else "summary"


def _cost(entry: dict[str, Any]) -> int:
    return estimate_tokens(element(entry)) + _SEPARATOR


def _split_entry(entry: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Split one entry's text so every part's element fits `limit`; deterministic."""
    key = _text_key(entry)
    frame = _cost({**entry, key: "", "part": 999, "of": 999})
    budget = max(8, limit - frame)
    while True:
        pieces = split_text(entry[key], budget)
        parts = [{**entry, key: piece, "part": k + 1, "of": len(pieces)} for k, piece in enumerate(pieces)]
        if all(_cost(p) <= limit for p in parts) or budget <= 8:
            return parts
        budget = max(8, budget // 2)  # JSON escaping made some part larger than its raw estimate


def frame_tokens(purpose: Purpose) -> int:
    return estimate_messages(messages_for(purpose, []))


@dataclass
class ReduceJob:
    purpose: Purpose
    entries: list[dict[str, Any]]
    round: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    attempts: int = 0
    retry_at_ms: int = 0
    models: list[str] = field(default_factory=list)

    # --- planning ------------------------------------------------------------------------------------

    @property
    def _round_purpose(self) -> Purpose:
        return "part" if self.purpose == "batch" else self.purpose

    def _plan(self, factory: RequestFactory) -> tuple[bool, list[list[dict[str, Any]]]]:
        frame = max(frame_tokens(self.purpose), frame_tokens(self._round_purpose))
        limit = factory.budget.input_tokens - frame
        expanded: list[dict[str, Any]] = []
        for entry in self.entries:
            expanded.extend([entry] if _cost(entry) <= limit else _split_entry(entry, limit))
        if len(expanded) == len(self.entries) and sum(_cost(e) for e in expanded) <= limit:
            return True, [expanded]
        groups: list[list[dict[str, Any]]] = [[]]
        used = 0
        for entry in expanded:
            cost = _cost(entry)
            if groups[-1] and used + cost > limit:
                groups.append([])
                used = 0
            groups[-1].append(entry)
            used += cost
        return False, groups

    def requests(self, factory: RequestFactory) -> list[ChatRequest]:
        """The calls of the current round, in order."""
        final, groups = self._plan(factory)
        if final:
            return [factory.build(messages_for(self.purpose, [element(e) for e in groups[0]]),
                                  prompt_version=SUMMARY_PROMPT_VERSION)]
        short = min(factory.max_output_tokens, max(16, factory.budget.input_tokens // 4))
        return [
            factory.build(messages_for(self._round_purpose, [element(e) for e in group]),
                          prompt_version=SUMMARY_PROMPT_VERSION, max_tokens=short)
            for group in groups
        ]

    def advance(self, factory: RequestFactory, results: list[ChatResult]) -> str | None:
        """Apply the results of the current round; the final text once done, else None."""
        final, groups = self._plan(factory)
        if len(results) != len(groups):
            raise ValueError(f"round {self.round} expects {len(groups)} results, got {len(results)}")
        for result in results:
            self.calls += 0 if result.from_journal else 1
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens
            if result.model not in self.models:
                self.models.append(result.model)
        if final:
            return results[0].text
        self.round += 1
        if self.round >= MAX_ROUNDS:
            raise ReductionStalled(f"{self.purpose} summary did not converge in {MAX_ROUNDS} rounds")
        self.entries = [_condensed(group, result.text) for group, result in zip(groups, results)]
        return None

    # --- state ---------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "purpose": self.purpose,
            "entries": self.entries,
            "round": self.round,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "calls": self.calls,
            "attempts": self.attempts,
            "retry_at_ms": self.retry_at_ms,
            "models": self.models,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> ReduceJob:
        return cls(**data)


def _condensed(group: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A group's summary as an entry of the next round, with the ids and time range it stands for."""
    ids = [str(e.get("id")) for e in group]
    covers = ids[0] if len(set(ids)) == 1 else f"{ids[0]} .. {ids[-1]} ({len(ids)} entries)"
    starts = [e.get("ts") or e.get("from") for e in group if e.get("ts") or e.get("from")]
    ends = [e.get("ts") or e.get("to") for e in group if e.get("ts") or e.get("to")]
    return {"id": covers, "from": min(starts) if starts else None, "to": max(ends) if ends else None,
            "summary": text}
