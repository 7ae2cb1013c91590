"""The PyFlink shell: it runs any stage core through the activation driver, starts calls, sets timers.

Every decision is in the stage cores (`flink_memory.stages`), and how a core is run (state, faults, the end
of input) is in `stages.driver`; this module only maps them onto PyFlink. A key is woken by a
processing-time timer when its calls are expected to be done or a deadline of its core is due; a key with
work left also holds a timer on a coarse recheck grid, so a key restored from a checkpoint resumes even if
no input reaches it. At the end of a bounded input, one event-time timer per end-of-input round fires at the
final watermark, so every key runs round 0 before any key runs round 1 (and so on).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from pyflink.common import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from flink_memory.config import Config
from flink_memory.flink.metrics import REPORT_EVERY_S, CallMeter, Tally
from flink_memory.flink.state_backend import FlinkState
from flink_memory.llm.runtime import acquire_runtime, release_runtime
from flink_memory.records import DeadLetter, InputRecord, parse_line
from flink_memory.requests import ChatRequest
from flink_memory.stages.calls import Effects
from flink_memory.stages.channels import DEAD_LETTERS, Channel
from flink_memory.stages.drills import StageDrill
from flink_memory.stages.driver import END_ROUNDS, Driver, Waits
from flink_memory.stages.messages import END, EndOfInput, StageMessage, from_wire, kind_of, to_wire
from flink_memory.stages.runner import carry_out
from flink_memory.topology import StageSpec

log = logging.getLogger(__name__)

# Between the keyed stages: (agent, tag, JSON), a message of flink_memory.stages.messages
KEYED = Types.TUPLE([Types.STRING(), Types.STRING(), Types.STRING()])
_TAGS: dict[str, OutputTag] = {}

_LONG_MAX = 2**63 - 1
END_TIMERS = [_LONG_MAX - 64 + i for i in range(END_ROUNDS)]  # event time of each end-of-input round
_FAULTS: Counter[str] = Counter()  # faults seen by this interpreter, when no journal remembers them
# PyFlink's thread mode sets the root logger to DEBUG and hands every record to the JVM: the HTTP clients'
# per-request debug lines cost more than the requests (a fifth of the Python time in the throughput benchmark)
CHATTY_LOGGERS = ("openai", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3")


def output_tag(channel: Channel[Any]) -> OutputTag:
    """The side output of a channel (flink_memory.topology.CHANNELS), one per name: its messages as the lines
    the channel writes (`Channel.dump`), Flink's type system carrying strings."""
    if channel.name not in _TAGS:
        _TAGS[channel.name] = OutputTag(channel.name, Types.STRING())
    return _TAGS[channel.name]


DEAD_LETTER_TAG = output_tag(DEAD_LETTERS)


def _quiet_chatty_loggers() -> None:
    """Warnings and errors of the HTTP clients still reach the TaskManager log; their debug lines do not."""
    for name in CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:  # (a level set on purpose, e.g. to debug a provider, is kept)
            logger.setLevel(logging.WARNING)
    ours = logging.getLogger("flink_memory")
    if ours.level == logging.NOTSET and logging.getLogger().level < logging.INFO:
        ours.setLevel(logging.INFO)


def _now_ms() -> int:
    """Processing time, read in Python: Flink's is the same wall clock, and asking it is a call into the JVM."""
    return time.time_ns() // 1_000_000


def _count_fault(fault: str) -> int:
    """Without a journal, this interpreter remembers faults (thread mode keeps it across restarts)."""
    _FAULTS[fault] += 1
    return _FAULTS[fault]


class ParseRecords(ProcessFunction):
    """Raw lines to keyed records; anything invalid goes to dead-letters with its reason."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.tally = Tally(runtime_context.get_metrics_group().add_group("flink_memory"))

    def close(self) -> None:
        if getattr(self, "tally", None) is not None:
            self.tally.flush()

    def parse(self, value: Any) -> InputRecord | DeadLetter:
        """One input element to a record or a dead letter (a JSON line here; subclasses read other shapes)."""
        return parse_line(value)

    def process_element(self, value: Any, ctx: ProcessFunction.Context):
        # (records read are Flink's own numRecordsIn of this operator, counted exactly on the Java side: a
        # Tally here would reach Flink only with a later record, never on a quiet followed input)
        record = self.parse(value)
        if isinstance(record, DeadLetter):
            self.tally.add("dead_letters")
            yield DEAD_LETTER_TAG, DEAD_LETTERS.dump(record)
            return
        yield record.agent_id, kind_of(record), record.model_dump_json()


class StageFunction(KeyedProcessFunction):
    """One stage of flink_memory.topology as a keyed function; input and output are (agent, tag, JSON).

    The stage's core is made in each subtask from `spec.core`, with the stage's drill around it
    (stages.drills); `spec.name` names the stage in logs, metrics and `job.inject_failure`. It carries out
    effects as every runner does (flink_memory.stages.runner): this class is the runner of its activations."""

    def __init__(self, spec: StageSpec, config_json: str, output_dir: str | None = None,
                 bounded: bool = False, *, keyed_output: bool = True) -> None:
        self.spec = spec
        self.stage = spec.name
        self.config_json = config_json
        self.output_dir = output_dir
        self.bounded = bounded
        self.keyed_output = keyed_output  # (agent, tag, JSON) for the next stage, or the JSON alone (the last)

    def open(self, runtime_context: RuntimeContext) -> None:
        _quiet_chatty_loggers()
        self.config = Config.model_validate_json(self.config_json)
        self.runtime = acquire_runtime(self.config, self.output_dir)
        self.pool = self.runtime.pool
        journal = self.runtime.client.journal
        self.drill = StageDrill(self.config.job.inject_failure, self.stage)
        core = self.drill.around(self.spec.core(self.config, self.runtime.factory, bounded=self.bounded))
        self.driver = Driver(core, self.stage, journal.count_fault if journal is not None else _count_fault,
                             self.spec.migration)
        schema = self.driver.schema
        values = {name: runtime_context.get_state(ValueStateDescriptor(name, Types.STRING()))
                  for name in schema.values}
        maps = {name: runtime_context.get_map_state(MapStateDescriptor(name, Types.STRING(), Types.STRING()))
                for name in schema.maps}
        self.state = FlinkState(values, maps, schema.read_once)
        self.recheck_ms = max(1000, int(self.config.job.recheck_s * 1000))
        wait_s = self.config.llm.timeout_s * (self.config.llm.max_retries + 1)
        self.waits = Waits(wait=self._wait, sleep=self._sleep, now_ms=_now_ms, max_s=wait_s)
        # per key: the calls it waits for and its core's next deadline (a timer before either is skipped)
        self.pending: dict[str, tuple[list[str], int | None]] = {}
        self.armed: set[str] = set()  # agents whose end-of-input timers this subtask has registered
        self.timers: dict[str, set[int]] = {}  # per agent, times of timers registered and not yet due
        group = runtime_context.get_metrics_group().add_group("flink_memory")
        self.tally = Tally(group)
        self.meter = CallMeter(self.tally, group.distribution("llm_latency_ms"))
        # levels as counters moved by the difference on every activation: a Python gauge would be called back
        # by the metrics thread, which in thread mode can run after the interpreter closed (a JVM crash)
        self.levels: dict[str, int] = {}
        self.timer_service: Any = None  # (of the activation being carried out, at `now`)
        self.now = 0
        self.outputs: list[Any] = []  # (what it sends, yielded when it returns)

    def close(self) -> None:
        if getattr(self, "tally", None) is not None:
            self.tally.flush()
        if getattr(self, "runtime", None) is not None:
            release_runtime(self.config, self.output_dir, self.stage)
            self.runtime = None

    # --- activations ---------------------------------------------------------------------------------

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, tag, body = value  # (keyed by value[0]: asking Flink for the key would be a call into the JVM)
        outputs: list[Any] = []
        try:
            message = from_wire(tag, body)
        except ValueError as exc:  # (pydantic's ValidationError is one)
            effects = self.driver.unreadable(key, tag, body, exc)  # (only dead letters: the key's calls go on)
            self._account(effects)
            for dead in effects.dead_letters:
                yield DEAD_LETTER_TAG, DEAD_LETTERS.dump(dead)
            return
        if isinstance(message, EndOfInput):  # the stage before has finished this agent's input: so has this one
            self._end_of_input(ctx, key, 0, outputs)
        else:
            self._run(ctx, key, message, outputs)
        yield from outputs

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        key = ctx.get_current_key()
        outputs: list[Any] = []
        if timestamp not in END_TIMERS:
            waiting, deadline = self.pending.get(key, ([], None))
            if waiting and not self.pool.any_done(waiting) and (deadline is None or timestamp < deadline):
                now = _now_ms()
                self._set_timer(ctx.timer_service(), key, self.pool.wake_at_ms(waiting, now), now)  # early: nothing yet
                self._report_calls()
                return
            self._run(ctx, key, None, outputs)
            yield from outputs
            return
        self._end_of_input(ctx, key, END_TIMERS.index(timestamp), outputs)
        yield from outputs

    def _end_of_input(self, ctx: Any, key: str, round_: int, outputs: list[Any]) -> None:
        """One round of the key's end of input (stages.driver), and END on to the next stage once it is done."""
        done = self.driver.end_of_input(key, round_, lambda message: self._run(ctx, key, message, outputs),
                                        self.waits)
        if done and self.keyed_output:
            outputs.append((key, *to_wire(END)))

    def _run(self, ctx: Any, key: str, message: StageMessage | None, outputs: list[Any]) -> Effects:
        """Run the core once for the current key (a message, or None: a wake-up) and carry out its effects;
        returns them."""
        now = _now_ms()
        self.drill.before(key, message)  # (a drill: the job restarts)
        self.state.key = key
        effects = self.driver.activate(self.state, key, message, self.pool.finished(), now)
        self._account(effects)  # (before the pool forgets the results: an injected failure keeps them)
        self.timer_service, self.outputs, self.now = ctx.timer_service(), outputs, now
        carry_out(self, key, effects)
        self._level("pending_keys", len(self.pending))
        self._report_calls()
        return effects

    # --- the runner of its activations (flink_memory.stages.runner.Runner) ---------------------------

    def start(self, requests: list[ChatRequest]) -> None:
        for request in requests:
            self.pool.submit(request)
        self.meter.submitted(requests)

    def forget(self, digests: list[str]) -> None:
        self.pool.forget(digests)

    def wake(self, key: str, effects: Effects) -> None:
        self.pending.pop(key, None)
        if not effects.idle:
            self.pending[key] = ([r.digest for r in effects.waiting], effects.wake_at_ms)
        self._schedule(self.timer_service, key, effects, self.now)

    def send(self, key: str, message: StageMessage) -> None:
        self.outputs.append((key, *to_wire(message)) if self.keyed_output else message.model_dump_json())

    def emit(self, key: str, channel: Channel[Any], message: Any) -> None:
        self.outputs.append((output_tag(channel), channel.dump(message)))

    # --- waiting at the end of input -----------------------------------------------------------------

    def _wait(self, digests: list[str], timeout_s: float) -> None:
        """Wait for calls, reporting the ones that end meanwhile (every REPORT_EVERY_S)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            self.pool.wait(digests, timeout_s=max(0.0, min(REPORT_EVERY_S, left)))
            self._report_calls(force=True)
            if left <= REPORT_EVERY_S or self.pool.all_done(digests):
                return

    def _sleep(self, seconds: float) -> None:
        """Sleep out a backoff, reporting the calls that end meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(REPORT_EVERY_S, left))
            self._report_calls(force=True)

    # --- timers and metrics --------------------------------------------------------------------------

    def _schedule(self, timers: Any, key: str, effects: Effects, now: int) -> None:
        if key not in self.armed:  # the end-of-input rounds, once per key and subtask (Flink keeps one per time)
            for ts in END_TIMERS:
                timers.register_event_time_timer(ts)
            self.armed.add(key)
        if effects.sweep_at_ms is not None:  # housekeeping (sealing old state): its own, rare timer
            self._set_timer(timers, key, effects.sweep_at_ms, now)
        if effects.idle:
            return
        at = effects.wake_at_ms
        if effects.waiting:
            poll = self.pool.wake_at_ms([r.digest for r in effects.waiting], now)
            at = poll if at is None else min(at, poll)
        self._set_timer(timers, key, at if at is not None else now + self.recheck_ms, now)
        # a key with work left also holds the next recheck grid point: a restored key resumes even without
        # input, and a deadline computed under an older config is looked at again
        self._set_timer(timers, key, now - now % self.recheck_ms + self.recheck_ms, now)

    def _set_timer(self, timers: Any, key: str, at_ms: int, now: int) -> None:
        """Register a processing-time timer, unless this key already holds one at that time (Flink keeps one
        per key and time anyway: this saves the call into the JVM on every record)."""
        at_ms = max(at_ms, 1)
        times = self.timers.setdefault(key, set())
        if at_ms in times and at_ms > now:
            return
        times.difference_update([t for t in times if t <= now])
        times.add(at_ms)
        timers.register_processing_time_timer(at_ms)

    def _level(self, name: str, value: int) -> None:
        """A counter that tracks a current value (calls in flight, agents pending) in this subtask."""
        delta = value - self.levels.get(name, 0)
        if delta:
            self.levels[name] = value
            self._count(name, delta)
            if value == 0:  # the subtask may go quiet now: what it counted must not wait for more input
                self.tally.flush()

    def _count(self, name: str, n: int = 1) -> None:
        self.tally.add(name, n)

    def _report_calls(self, force: bool = False) -> None:
        """Count the calls that ended (the meter looks at most every METRIC_FLUSH_S unless forced) and hand
        the counters to Flink when forced: a stage blocked on calls calls nothing else that would."""
        self.meter.sync(self.pool.finished(), force)
        self._level("llm_in_flight", self.meter.open_calls)
        if force:
            self.tally.flush()

    def _account(self, effects: Effects) -> None:
        self.meter.consumed(effects.results, effects.consumed)
        self.drill.results(effects)
        if effects.rejections:
            self._count("llm_context_rejections", effects.rejections)
            log.warning("%s: %d request(s) refused for their length, re-packed smaller", self.stage,
                        effects.rejections)
        for error in effects.failures:
            self._count("llm_failures")
            log.warning("%s: provider failed, retrying later: %s", self.stage, error)
        for name, n in effects.counts.items():
            self._count(name, n)
        if (waited := effects.counts.get("first_report_wait_ms")) and self.runtime is not None:
            self.runtime.client.stats.add(first_report_wait_ms=waited, max_first_report_wait_ms=waited)
        if effects.dead_letters:  # (with the parser's, every dead letter of the job)
            self._count("dead_letters", len(effects.dead_letters))
