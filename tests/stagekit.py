"""Test helpers over the in-memory runner (flink_memory.local): fake answers, held calls, a unit table.

`Pipeline` is `LocalPipeline` answering with `summary_answer` unless told otherwise, with the readings tests
use (the units of each agent's batches, the unit rows a store would hold).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from flink_memory.config import Config, load_config
from flink_memory.local import LocalPipeline
from flink_memory.requests import ChatRequest, ChatResult, RequestFactory
from flink_memory.tokens.estimate import estimate_messages


def cfg(*overrides: str) -> Config:
    return load_config(None, list(overrides), environ={})


def summary_answer(request: ChatRequest) -> ChatResult:
    """A short summary naming the request's first entry line (so tests can trace what was summarized)."""
    lines = [line for line in request.messages[-1][1].splitlines() if not line.startswith("@")]
    return ChatResult(text=f"Summary of {len(lines)}: {lines[0][:40] if lines else ''}",
                      prompt_tokens=estimate_messages(request.message_dicts()), completion_tokens=8, model="fake")


def keeping_answer(request: ChatRequest) -> ChatResult:
    """A summarizer that keeps every line it is given (so a test can see which facts a node holds)."""
    lines = [line for line in request.messages[-1][1].splitlines() if not line.startswith("@")]
    return ChatResult(text=" | ".join(lines), prompt_tokens=estimate_messages(request.message_dicts()),
                      completion_tokens=8, model="fake")


def live(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live view of a changelog: nodes no later node replaces."""
    replaced = {(n["agent_id"], old) for n in summaries for old in n.get("replaces", [])}
    return [n for n in summaries if (n["agent_id"], n["node_id"]) not in replaced]


class InFlight(dict):
    """The pool's finished calls, with the `held` ones still running (not answered yet)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    def get(self, digest: str, default: Any = None) -> Any:
        return default if digest in self.held else super().get(digest, default)


def hold_plans(pipeline: Pipeline) -> InFlight:
    """Keep every plan call in flight until `held` is cleared: the records behind it queue in the planner."""
    finished, answer = InFlight(), pipeline.answer

    def holding(request: ChatRequest) -> ChatResult:
        if request.kind == "plan":
            finished.held.add(request.digest)
        return answer(request)

    pipeline.finished, pipeline.answer = finished, holding
    return finished


class UnitTable:
    """The unit rows of a store, in memory: what UnitRows.apply writes."""

    def __init__(self) -> None:
        self.units: dict[tuple[str, str], str] = {}

    def upsert_units(self, units: list[Any]) -> int:
        self.units.update(((u.agent_id, u.unit_id), u.text) for u in units)
        return len(units)

    def delete_units(self, agent_id: str, unit_ids: list[str]) -> None:
        for uid in unit_ids:
            self.units.pop((agent_id, uid), None)

    def forget_units(self, agent_id: str) -> None:
        self.units = {key: text for key, text in self.units.items() if key[0] != agent_id}


class Pipeline(LocalPipeline):
    def __init__(self, config: Config, answer: Callable[[ChatRequest], ChatResult] = summary_answer, *,
                 bounded: bool = True, factory: RequestFactory | None = None) -> None:
        super().__init__(config, answer, bounded=bounded, factory=factory)

    def batch_units(self) -> dict[str, list[str]]:
        units: dict[str, list[str]] = defaultdict(list)
        for node in self.nodes("batch"):
            units[node["agent_id"]].extend(node["children"])
        return dict(units)

    def stored_units(self, agent: str) -> dict[str, str]:
        """The agent's unit rows a store holds after every store row so far: unit id -> text."""
        table = UnitTable()
        for rows in self.rows:
            rows.apply(table)
        return {uid: text for (owner, uid), text in table.units.items() if owner == agent}


def add(buffer: Any, entry: dict[str, Any], limits: Any, budget: Any, scale: float | None = 1.0) -> list[Any]:
    """One entry into a BatchBuffer at one scale, as the batcher packs it (stages.batcher's `_pack`)."""
    closed = []
    if not buffer.fits(entry, limits, budget):
        closed.append(buffer.take())
    if (taken := buffer.put(entry, limits, 0, budget, scale)) is not None:
        closed.append(taken)
    return closed
