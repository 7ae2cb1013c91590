"""The job's stages without Flink: the topology run in memory, on a fake clock, with calls answered by a function.

`LocalPipeline` parses lines, keys them by agent and runs the stages of flink_memory.topology through the
activation driver the Flink shell uses (flink_memory.stages.driver), carrying out effects as the shell does
(flink_memory.stages.runner) and ending the input as it does (`Driver.end_of_input`). `answer(request)` answers
each call at once (a ChatResult, or an exception to hold as the call's error); a key is woken again until
nothing is left in flight, and time jumps to the next deadline only when asked (`advance`) or when the end of
input waits out a backoff. What the stages emit is kept per channel, as the typed messages they emitted.
Faults are not counted: an error of ours (or of a drill, `job.inject_failure`, applied around each core as the
shell does) is raised to the caller as it is. For tests, notebooks and tools that want the pipeline's decisions
in milliseconds.

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
from flink_memory.records import ChunkManifest, DeadLetter, parse_line
from flink_memory.requests import ChatRequest, ChatResult, RequestFactory
from flink_memory.stages.calls import Effects, Finished
from flink_memory.stages.channels import DEAD_LETTERS, MANIFESTS, MEMORY_LOG, Channel
from flink_memory.stages.drills import StageDrill
from flink_memory.stages.driver import END_ROUNDS, Driver, Waits
from flink_memory.stages.messages import StageMessage
from flink_memory.stages.protocol import StageCore
from flink_memory.stages.runner import carry_out
from flink_memory.state import MemoryState, Migration, StateTransaction
from flink_memory.topology import CHANNELS, STAGES, StageSpec

Answer = Callable[[ChatRequest], ChatResult]


@dataclass
class LocalStage:
    """One stage of the pipeline: its core, its keyed state in memory and the driver that runs it."""

    name: str
    core: StageCore
    state: MemoryState = field(default_factory=MemoryState)
    migration: Migration | None = None
    drill: StageDrill | None = None  # job.inject_failure, around the core (stages.drills)
    ran: set[str] = field(default_factory=set)  # keys it ran (as the shell arms each key's end-of-input rounds)

    def __post_init__(self) -> None:
        if self.drill is not None:
            self.core = self.drill.around(self.core)
        self.driver = Driver(self.core, self.name, migration=self.migration)

    def keys(self) -> list[str]:
        """The keys whose input can end here: the ones it ran and the ones with state (e.g. restored)."""
        return sorted(self.ran | {k for k, _ in self.state.values} | {k for k, _ in self.state.maps})

    def run(self, key: str, call: Callable[[StateTransaction], Effects]) -> Effects:
        """Any call on the key's state (e.g. a core's `evict`), committed when it returns."""
        self.state.current_key = key
        return self.driver.transact(self.state, key, call)

    def activate(self, key: str, message: StageMessage | None, finished: Finished, now_ms: int) -> Effects:
        """A message (END: the end of input) or a wake-up (None), as the shell runs it."""
        if self.drill is not None:
            self.drill.before(key, message)
        self.state.current_key = key
        self.ran.add(key)
        effects = self.driver.activate(self.state, key, message, finished, now_ms)
        if self.drill is not None:
            self.drill.results(effects)
        return effects


class _StageRunner:
    """The runner of one stage's activations (flink_memory.stages.runner.Runner) in a LocalPipeline."""

    def __init__(self, pipeline: LocalPipeline, index: int, spec: StageSpec) -> None:
        self.pipeline, self.index, self.spec = pipeline, index, spec

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

    def emit(self, key: str, channel: Channel[Any], message: Any) -> None:
        if channel not in self.spec.channels:  # (in Flink, a side output nobody reads: lost)
            raise ValueError(f"stage {self.spec.name} emitted on {channel.name!r}, which its StageSpec does not name")
        self.pipeline.emitted[channel.name].append(message)
        if isinstance(message, LogEntry) and message.units is not None:
            self.pipeline.rows.append(message.units)


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
        # what the stages (and the parser: dead letters) emitted, per channel, in the order emitted
        self.emitted: dict[str, list[Any]] = {channel.name: [] for channel in CHANNELS}
        self.rows: list[UnitRows] = []  # the unit rows of the memory log, in the order they were logged
        self.stages = [LocalStage(spec.name, spec.core(config, self.factory, bounded=bounded),
                                  migration=spec.migration, drill=StageDrill(config.job.inject_failure, spec.name))
                       for spec in STAGES]
        self._runners = [_StageRunner(self, index, spec) for index, spec in enumerate(STAGES)]
        # how the end of input waits here: calls are answered when started, and a backoff moves the fake clock
        self._waits = Waits(wait=lambda digests, timeout_s: None, sleep=self._sleep, now_ms=lambda: self.now,
                            max_s=float("inf"))
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
        """The end of a bounded input, run by the rules the shell runs it by (`Driver.end_of_input`): each stage
        runs the end-of-input rounds on every key it ran, and a key that is done tells the next stage; nothing
        else wakes a key. Here the stages take turns, as the final watermark reaches them: the next one gets its
        END messages once this one's rounds are over, then runs its own rounds."""
        told: list[str] = []
        for index, stage in enumerate(self.stages):
            ended = [key for key in told if self._end(index, key, 0)]  # (END from the stage before: round 0)
            for round_ in range(END_ROUNDS):
                ended += [key for key in stage.keys() if self._end(index, key, round_)]
            told = ended
        return self

    # --- the runner ----------------------------------------------------------------------------------

    def _deliver(self, index: int, key: str, message: StageMessage | None = None) -> Effects:
        """A message (END: the end of input) or a wake-up (None) for one stage's key, its effects carried out
        (which may activate the next stage: the effects returned are this activation's own)."""
        effects = self.stages[index].activate(key, message, self.finished, self.now)
        carry_out(self._runners[index], key, effects)
        return effects

    def _end(self, index: int, key: str, round_: int) -> bool:
        """Round `round_` of the key's end of input at one stage; whether the key is done (END to the next)."""
        done = self.stages[index].driver.end_of_input(key, round_, lambda message: self._deliver(index, key, message),
                                                      self._waits)
        return done and index + 1 < len(self.stages)

    def _sleep(self, seconds: float) -> None:
        self.now += round(seconds * 1000)

    def _activate(self, index: int, key: str, call: Callable[[StateTransaction], Effects]) -> None:
        """Any call on a stage's state for one key, its effects carried out (e.g. a core's `evict`)."""
        carry_out(self._runners[index], key, self.stages[index].run(key, call))

    # --- reading -------------------------------------------------------------------------------------

    @property
    def dead_letters(self) -> list[DeadLetter]:
        return self.emitted[DEAD_LETTERS.name]

    @property
    def manifests(self) -> list[ChunkManifest]:
        return self.emitted[MANIFESTS.name]

    @property
    def log(self) -> list[LogEntry]:
        """The memory log, in the order it was written."""
        return self.emitted[MEMORY_LOG.name]

    def nodes(self, kind: str) -> list[dict[str, Any]]:
        return [n for n in self.summaries if n["kind"] == kind]

    def current(self, agent: str) -> dict[str, Any] | None:
        """The agent's latest global summary (None before the first)."""
        globals_ = [n for n in self.nodes("global") if n["agent_id"] == agent]
        return max(globals_, key=lambda n: n["version"]) if globals_ else None

    def calls(self, kind: str | None = None) -> int:
        """Calls sent (of one request kind: batch, merge, global, plan...)."""
        return sum(1 for r in self.sent if kind is None or r.kind == kind)
