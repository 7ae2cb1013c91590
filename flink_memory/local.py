"""The job's stages without Flink: the topology run in memory, on a fake clock, with calls answered by a function.

`LocalPipeline` parses lines, keys them by agent and runs the stages of flink_memory.topology through the
activation driver the Flink shell uses (flink_memory.stages.driver), carrying out effects as the shell does
(flink_memory.stages.runner). `answer(request)` answers each call at once (a ChatResult, or an exception to
hold as the call's error); a key is woken again until nothing is left in flight, and time jumps to the next
deadline only when asked (`advance`). Faults are not counted: an error of ours (or of a drill,
`job.inject_failure`, applied around each core as the shell does) is raised to the caller as it is. For tests,
notebooks and tools that want the pipeline's decisions in milliseconds.

    pipeline = LocalPipeline(config, answer).feed(*records).end()
    pipeline.current("agent-0")   # the agent's latest global summary, as written to summaries/
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flink_memory.config import Config
from flink_memory.memory_log import LogEntry, UnitRows
from flink_memory.records import DeadLetter, parse_line
from flink_memory.requests import ChatRequest, ChatResult, RequestFactory
from flink_memory.stages.calls import MANIFESTS, MEMORY_LOG, Effects, Finished
from flink_memory.stages.drills import StageDrill
from flink_memory.stages.driver import Driver
from flink_memory.stages.messages import END, StageMessage
from flink_memory.stages.protocol import StageCore
from flink_memory.stages.runner import DEAD_LETTERS, carry_out
from flink_memory.state import MemoryState, Migration, StateTransaction
from flink_memory.topology import STAGES

Answer = Callable[[ChatRequest], ChatResult]


@dataclass
class LocalStage:
    """One stage of the pipeline: its core, its keyed state in memory and the driver that runs it."""

    name: str
    core: StageCore
    state: MemoryState = field(default_factory=MemoryState)
    migration: Migration | None = None
    drill: StageDrill | None = None  # job.inject_failure, around the core (stages.drills)

    def __post_init__(self) -> None:
        if self.drill is not None:
            self.core = self.drill.around(self.core)
        self.driver = Driver(self.core, self.name, migration=self.migration)

    def run(self, key: str, call: Callable[[StateTransaction], Effects]) -> Effects:
        """Any call on the key's state (e.g. a core's `evict`), committed when it returns."""
        self.state.current_key = key
        return self.driver.transact(self.state, key, call)

    def activate(self, key: str, message: StageMessage | None, finished: Finished, now_ms: int) -> Effects:
        """A message (END: the end of input) or a wake-up (None), as the shell runs it."""
        if self.drill is not None:
            self.drill.before(key, message)
        self.state.current_key = key
        effects = self.driver.activate(self.state, key, message, finished, now_ms)
        if self.drill is not None:
            self.drill.results(effects)
        return effects


class _StageRunner:
    """The runner of one stage's activations (flink_memory.stages.runner.Runner) in a LocalPipeline."""

    def __init__(self, pipeline: LocalPipeline, index: int) -> None:
        self.pipeline, self.index = pipeline, index

    def start(self, requests: list[ChatRequest]) -> None:
        pipeline = self.pipeline
        for request in requests:
            if request.digest not in pipeline.finished:
                pipeline.sent.append(request)
                try:
                    pipeline.finished[request.digest] = pipeline.answer(request)
                except Exception as exc:  # noqa: BLE001 - the call's error, as the pool would hold it
                    pipeline.finished[request.digest] = exc

    def forget(self, digests: list[str]) -> None:
        for digest in digests:
            self.pipeline.finished.pop(digest, None)

    def wake(self, key: str, effects: Effects) -> None:
        slot = (self.index, key)
        if effects.waiting:
            self.pipeline.waiting.add(slot)
        for times, at in ((self.pipeline.deadlines, effects.wake_at_ms), (self.pipeline.sweeps, effects.sweep_at_ms)):
            if at is not None:
                times[slot] = at
            else:
                times.pop(slot, None)

    def send(self, key: str, message: StageMessage) -> None:
        pipeline = self.pipeline
        if self.index + 1 < len(pipeline.stages):
            pipeline._deliver(self.index + 1, key, message)
        else:
            pipeline.summaries.append(json.loads(message.model_dump_json()))  # (as the job writes them)

    def emit(self, key: str, channel: str, payload: str) -> None:
        pipeline = self.pipeline
        if channel == DEAD_LETTERS:
            pipeline.dead_letters.append(DeadLetter.model_validate_json(payload))
        elif channel == MANIFESTS:
            pipeline.manifests.append(json.loads(payload))
        elif channel == MEMORY_LOG:
            entry = LogEntry.model_validate_json(payload)
            pipeline.log.append(entry)
            if entry.units is not None:
                pipeline.rows.append(entry.units)
        else:
            raise ValueError(f"stage {pipeline.stages[self.index].name} sent on an unknown channel {channel!r}")


class LocalPipeline:
    def __init__(self, config: Config, answer: Answer, *, bounded: bool = True,
                 factory: RequestFactory | None = None) -> None:
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
        self.stages = [LocalStage(spec.name, spec.core(config, self.factory, bounded=bounded),
                                  migration=spec.migration, drill=StageDrill(config.job.inject_failure, spec.name))
                       for spec in STAGES]
        self._runners = [_StageRunner(self, index) for index in range(len(self.stages))]
        self.deadlines: dict[tuple[int, str], int] = {}  # work: backoffs, timeouts, refreshes
        self.sweeps: dict[tuple[int, str], int] = {}  # housekeeping: sealing old state
        self.waiting: set[tuple[int, str]] = set()

    # --- feeding -------------------------------------------------------------------------------------

    def feed(self, *records: Any) -> LocalPipeline:
        """Input records (JSON lines, or dicts): parsed as the job parses them, then run through the stages."""
        for record in records:
            line = record if isinstance(record, str) else json.dumps(record)
            parsed = parse_line(line)
            if isinstance(parsed, DeadLetter):
                self.dead_letters.append(parsed)
                continue
            self._deliver(0, parsed.agent_id, parsed)
        return self

    def settle(self) -> LocalPipeline:
        """Answer every call and wake every key until nothing is in flight (deadlines in the future wait)."""
        while self.waiting:
            for index, key in sorted(self.waiting):
                self.waiting.discard((index, key))
                self._deliver(index, key)
        return self

    def advance(self, seconds: float) -> LocalPipeline:
        """Let time pass: keys whose deadline comes due are woken."""
        self.now += int(seconds * 1000)
        due = {slot for times in (self.deadlines, self.sweeps) for slot, at in times.items() if at <= self.now}
        for index, key in sorted(due):
            self.deadlines.pop((index, key), None)
            self.sweeps.pop((index, key), None)
            self._deliver(index, key)
        return self.settle()

    def end(self) -> LocalPipeline:
        """The end of a bounded input: each stage finishes each agent, then tells the next stage. (Calls are
        answered at once here, so `settle` does what the driver's end-of-input rounds do in the shell.)"""
        for index, stage in enumerate(self.stages):
            keys = {k for k, _ in stage.state.values} | {k for k, _ in stage.state.maps}
            for key in sorted(keys):
                self._deliver(index, key, END)
            while self.settle().deadlines:  # backoffs: jump to them
                self.advance(max(0, (min(self.deadlines.values()) - self.now) / 1000) + 0.001)
        return self

    # --- the runner ----------------------------------------------------------------------------------

    def _deliver(self, index: int, key: str, message: StageMessage | None = None) -> None:
        """A message (END: the end of input) or a wake-up (None) for one stage's key, its effects carried out."""
        carry_out(self._runners[index], key, self.stages[index].activate(key, message, self.finished, self.now))

    def _activate(self, index: int, key: str, call: Callable[[StateTransaction], Effects]) -> None:
        """Any call on a stage's state for one key, its effects carried out (e.g. a core's `evict`)."""
        carry_out(self._runners[index], key, self.stages[index].run(key, call))

    # --- reading -------------------------------------------------------------------------------------

    def nodes(self, kind: str) -> list[dict[str, Any]]:
        return [n for n in self.summaries if n["kind"] == kind]

    def current(self, agent: str) -> dict[str, Any] | None:
        """The agent's latest global summary (None before the first)."""
        globals_ = [n for n in self.nodes("global") if n["agent_id"] == agent]
        return max(globals_, key=lambda n: n["version"]) if globals_ else None

    def calls(self, kind: str | None = None) -> int:
        """Calls sent (of one request kind: batch, merge, global, plan...)."""
        return sum(1 for r in self.sent if kind is None or r.kind == kind)
