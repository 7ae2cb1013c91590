"""The three stage cores wired like the Flink job, without Flink: millisecond tests of whole pipelines.

`Pipeline` parses lines, keys them by agent and runs planner -> batcher -> merger on `MemoryState` through
the activation driver the Flink shell uses (`flink_memory.stages.driver`): it starts the calls a core asks
for, answers them with `answer(request)` (a ChatResult, or an exception to raise as the call's error), and
wakes a key again until nothing is left in flight. Time is a fake clock that jumps to the next deadline.
Faults are not counted: an error of ours is raised to the test as it is.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flink_memory.config import Config, load_config
from flink_memory.records import DeadLetter, parse_line
from flink_memory.requests import ChatRequest, ChatResult, RequestFactory
from flink_memory.stages.batcher import BatcherCore
from flink_memory.stages.calls import Effects, Finished
from flink_memory.stages.driver import END_OF_INPUT, Driver
from flink_memory.stages.merger import MergerCore
from flink_memory.stages.planner import PlannerCore
from flink_memory.stages.protocol import StageCore
from flink_memory.stages.unit_rows import LogEntry, UnitRows
from flink_memory.state import MemoryState, StateTransaction
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


@dataclass
class Stage:
    name: str
    core: StageCore
    state: MemoryState = field(default_factory=MemoryState)

    def __post_init__(self) -> None:
        self.driver = Driver(self.core, self.name)

    def run(self, key: str, call: Callable[[StateTransaction], Effects]) -> Effects:
        """Any call on the key's state (e.g. a core's `evict`), committed when it returns."""
        self.state.current_key = key
        return self.driver.transact(self.state, key, call)

    def activate(self, key: str, payload: str | None, finished: Finished, now_ms: int) -> Effects:
        """A record, END_OF_INPUT or a wake-up (None), as the shell runs it."""
        self.state.current_key = key
        return self.driver.activate(self.state, key, payload, finished, now_ms)


class Pipeline:
    def __init__(self, config: Config, answer: Callable[[ChatRequest], ChatResult] = summary_answer, *,
                 bounded: bool = True, factory: RequestFactory | None = None) -> None:
        self.config = config
        self.answer = answer
        self.factory = factory or RequestFactory.from_config(config.llm)
        self.now = 1_000_000
        self.finished: dict[str, ChatResult | BaseException] = {}
        self.sent: list[ChatRequest] = []
        self.summaries: list[dict[str, Any]] = []
        self.manifests: list[dict[str, Any]] = []
        self.dead_letters: list[DeadLetter] = []
        self.rows: list[UnitRows] = []  # the unit rows of the memory log, in the order they were logged
        self.log: list[LogEntry] = []  # the memory log, in the order it was written
        self.stages = [Stage("planner", PlannerCore(config, self.factory)),
                       Stage("batcher", BatcherCore(config, self.factory, bounded=bounded)),
                       Stage("merger", MergerCore(config, self.factory, bounded=bounded))]
        self.deadlines: dict[tuple[int, str], int] = {}  # work: backoffs, timeouts, refreshes
        self.sweeps: dict[tuple[int, str], int] = {}  # housekeeping: sealing old state
        self.waiting: set[tuple[int, str]] = set()

    # --- feeding -------------------------------------------------------------------------------------

    def feed(self, *records: Any) -> Pipeline:
        for record in records:
            line = record if isinstance(record, str) else json.dumps(record)
            parsed = parse_line(line)
            if isinstance(parsed, DeadLetter):
                self.dead_letters.append(parsed)
                continue
            self._deliver(0, parsed.agent_id, parsed.model_dump_json())
        return self

    def settle(self) -> Pipeline:
        """Answer every call and wake every key until nothing is in flight (deadlines in the future wait)."""
        while self.waiting:
            for index, key in sorted(self.waiting):
                self.waiting.discard((index, key))
                self._deliver(index, key)
        return self

    def advance(self, seconds: float) -> Pipeline:
        """Let time pass: keys whose deadline comes due are woken."""
        self.now += int(seconds * 1000)
        due = {slot for times in (self.deadlines, self.sweeps) for slot, at in times.items() if at <= self.now}
        for index, key in sorted(due):
            self.deadlines.pop((index, key), None)
            self.sweeps.pop((index, key), None)
            self._deliver(index, key)
        return self.settle()

    def end(self) -> Pipeline:
        """The end of a bounded input: each stage finishes each agent, then tells the next stage. (Calls are
        answered at once here, so `settle` does what the driver's end-of-input rounds do in the shell.)"""
        for index, stage in enumerate(self.stages):
            keys = {k for k, _ in stage.state.values} | {k for k, _ in stage.state.maps}
            for key in sorted(keys):
                self._deliver(index, key, END_OF_INPUT)
            while self.settle().deadlines:  # backoffs: jump to them
                self.advance(max(0, (min(self.deadlines.values()) - self.now) / 1000) + 0.001)
        return self

    # --- the shell -----------------------------------------------------------------------------------

    def _deliver(self, index: int, key: str, payload: str | None = None) -> None:
        """A record, END_OF_INPUT or a wake-up (None) for one stage's key, its effects carried out."""
        self._carry(index, key, self.stages[index].activate(key, payload, self.finished, self.now))

    def _activate(self, index: int, key: str, call: Callable[[StateTransaction], Effects]) -> None:
        """Any call on a stage's state for one key, its effects carried out (e.g. a core's `evict`)."""
        self._carry(index, key, self.stages[index].run(key, call))

    def _carry(self, index: int, key: str, effects: Effects) -> None:
        for request in effects.start:
            if request.digest not in self.finished:
                self.sent.append(request)
                try:
                    self.finished[request.digest] = self.answer(request)
                except Exception as exc:  # noqa: BLE001 - the call's error, as the pool would hold it
                    self.finished[request.digest] = exc
        for digest in effects.consumed:
            self.finished.pop(digest, None)
        if effects.waiting:
            self.waiting.add((index, key))
        for times, at in ((self.deadlines, effects.wake_at_ms), (self.sweeps, effects.sweep_at_ms)):
            if at is not None:
                times[(index, key)] = at
            else:
                times.pop((index, key), None)
        self.manifests.extend(json.loads(m) for m in effects.manifests)
        self.dead_letters.extend(effects.dead_letters)
        logged = [LogEntry.model_validate_json(entry) for entry in effects.committed]
        self.log.extend(logged)
        self.rows.extend(entry.units for entry in logged if entry.units is not None)
        for payload in effects.out:
            if index + 1 < len(self.stages):
                self._deliver(index + 1, key, payload)
            else:
                self.summaries.append(json.loads(payload))

    # --- reading -------------------------------------------------------------------------------------

    def nodes(self, kind: str) -> list[dict[str, Any]]:
        return [n for n in self.summaries if n["kind"] == kind]

    def batch_units(self) -> dict[str, list[str]]:
        units: dict[str, list[str]] = defaultdict(list)
        for node in self.nodes("batch"):
            units[node["agent_id"]].extend(node["children"])
        return dict(units)

    def current(self, agent: str) -> dict[str, Any] | None:
        globals_ = [n for n in self.nodes("global") if n["agent_id"] == agent]
        return max(globals_, key=lambda n: n["version"]) if globals_ else None

    def stored_units(self, agent: str) -> dict[str, str]:
        """The agent's unit rows a store holds after every store row so far: unit id -> text."""
        table = UnitTable()
        for rows in self.rows:
            rows.apply(table)
        return {uid: text for (owner, uid), text in table.units.items() if owner == agent}

    def calls(self, kind: str | None = None) -> int:
        return sum(1 for r in self.sent if kind is None or r.kind == kind)
