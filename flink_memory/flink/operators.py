"""The PyFlink shell: it loads typed state, runs a stage core, starts calls, saves state and sets timers.

Every decision is in the stage cores (`flink_memory.stages`). A key is woken by a processing-time timer
when its calls are expected to be done or a deadline of its core is due; a key with work left also holds a
timer on a coarse recheck grid, so a key restored from a checkpoint resumes even if no input reaches it.

At the end of a bounded input, event-time timers at the final watermark run in phases across all keys:
every key closes what is open and starts its calls (phase 0), then each waits for its own calls and
starts the next round (the others' calls keep running meanwhile), and the last phase drives each key to
the end under the same failure policies as any other activation.

An exception of ours while handling a record is a fault: with the journal on, its first occurrence
restarts the job from the last checkpoint (it may have been transient); when it comes again, the record
(or the agent's pending work in that stage) goes to dead-letters with stage `internal`, and the job goes on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from pyflink.common import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from flink_memory.config import Config
from flink_memory.digests import digest_parts
from flink_memory.llm.runtime import acquire_runtime, release_runtime
from flink_memory.records import DeadLetter, parse_line
from flink_memory.stages.batcher import BatcherCore
from flink_memory.stages.calls import Effects, RecordFault
from flink_memory.stages.merger import MergerCore
from flink_memory.stages.planner import PlannerCore
from flink_memory.state import StateTransaction

log = logging.getLogger(__name__)

DEAD_LETTERS = OutputTag("dead-letters", Types.STRING())
MANIFESTS = OutputTag("manifests", Types.STRING())
KEYED = Types.TUPLE([Types.STRING(), Types.STRING()])

_LONG_MAX = 2**63 - 1
END_PHASES = 8  # rounds per key at the end of input (batch, merges, global) before the last one drains
END_TIMERS = [_LONG_MAX - 64 + i for i in range(END_PHASES)]
_FAULTS: Counter[str] = Counter()  # faults seen by this interpreter, when no journal remembers them
CORES = {"planner": PlannerCore, "batcher": BatcherCore, "merger": MergerCore}
# Between stages: "this agent's input has ended here" (a stage's own keyed records are JSON objects).
END_OF_INPUT = "end-of-input"
MAX_EVICTIONS = 1000  # queued records one activation may dead-letter before it gives up (a loop guard)
_EMBEDDED_STATE = "pyflink.fn_execution.datastream.embedded."  # thread mode's state classes
VALUE_CACHE_SIZE = 20_000  # cached value states per stage function (a few per agent), then started afresh
# PyFlink's thread mode sets the root logger to DEBUG and hands every record to the JVM: the HTTP clients'
# per-request debug lines cost more than the requests (a fifth of the Python time in the throughput benchmark)
CHATTY_LOGGERS = ("openai", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3")
METRIC_FLUSH_S = 0.5  # metric increments are summed in Python and handed to Flink at most this often


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


def _fault_hook(spec: str | None, stage: str, count: int) -> None:
    """job.inject_failure = "stage:n:marker": raise once at activation n of stage (see config.py)."""
    if not spec or spec.startswith("record:"):
        return
    name, at, marker = spec.split(":", 2)
    if name != stage or count != int(at) or os.path.exists(marker):
        return
    with open(marker, "w") as handle:
        handle.write(stage)
    raise RuntimeError(f"injected failure in {stage} at activation {count}")


class Tally:
    """Metric counters whose increments are summed in Python and handed to Flink every METRIC_FLUSH_S: each
    `inc` is a call into the JVM (tens of microseconds), which per record would cost more than the record."""

    def __init__(self, group: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        self.clock = clock
        self.counters: dict[str, Any] = {}
        self.pending: Counter[str] = Counter()
        self.flushed_at = clock()

    def add(self, name: str, n: int = 1) -> None:
        self.pending[name] += n
        if self.clock() - self.flushed_at >= METRIC_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        for name, n in self.pending.items():
            if n:
                if name not in self.counters:
                    self.counters[name] = self.group.counter(name)
                self.counters[name].inc(n)
        self.pending.clear()
        self.flushed_at = self.clock()


class ParseRecords(ProcessFunction):
    """Raw lines to keyed records; anything invalid goes to dead-letters with its reason."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.tally = Tally(runtime_context.get_metrics_group().add_group("flink_memory"))

    def close(self) -> None:
        if getattr(self, "tally", None) is not None:
            self.tally.flush()

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        self.tally.add("records_in")
        record = parse_line(value)
        if isinstance(record, DeadLetter):
            self.tally.add("dead_letters")
            yield DEAD_LETTERS, record.model_dump_json()
            return
        yield record.agent_id, record.model_dump_json()


class _FlinkState:
    """A StateBackend over the PyFlink states of one stage (the current key is Flink's, set in `key`).

    Value states are cached per key, write-through: every call into the JVM costs tens of microseconds and
    a stage reads its few small values on every record. The cache is as safe as the state: only this
    function writes these states, and a restored job opens a new function with an empty cache. A write of
    the value already there is skipped."""

    def __init__(self, values: dict[str, Any], maps: dict[str, Any]) -> None:
        self.values, self.maps = values, maps
        # MapState.put_all is one JVM call in thread mode; process mode's iterates a dict as pairs (broken).
        # The mode is the job's, which for operators embedded in another job need not be our config's.
        self.bulk_puts = all(type(m).__module__.startswith(_EMBEDDED_STATE) for m in maps.values())
        self.key = ""
        self.no_legacy: set[tuple[str, str]] = set()  # (state, key) known to hold no release 0.1.0 value
        self.cached: dict[tuple[str, str], str | None] = {}

    def _remember(self, slot: tuple[str, str], raw: str | None) -> None:
        if len(self.cached) >= VALUE_CACHE_SIZE:
            self.cached.clear()
        self.cached[slot] = raw

    def read(self, name: str) -> str | None:
        slot = (name, self.key)
        if slot not in self.cached:
            self._remember(slot, self.values[name].value())
        return self.cached[slot]

    def read_legacy(self, name: str, key: str) -> str | None:
        """Old values are read once per key and subtask: after that they are migrated or absent for good."""
        if (name, key) in self.no_legacy:
            return None
        raw = self.read(name)
        if raw is None:
            self.no_legacy.add((name, key))
        return raw

    def write(self, name: str, raw: str | None) -> None:
        slot = (name, self.key)
        if slot in self.cached and self.cached[slot] == raw:
            return
        if raw is None:
            self.values[name].clear()
        else:
            self.values[name].update(raw)
        self._remember(slot, raw)

    def read_entry(self, name: str, key: str) -> str | None:
        return self.maps[name].get(key)

    def write_entry(self, name: str, key: str, raw: str | None) -> None:
        if raw is None:
            self.maps[name].remove(key)
        else:
            self.maps[name].put(key, raw)

    def write_entries(self, name: str, entries: dict[str, str]) -> None:
        if self.bulk_puts and len(entries) > 1:
            self.maps[name].put_all(entries)
            return
        for key, raw in entries.items():
            self.write_entry(name, key, raw)

    def keys(self, name: str) -> list[str]:
        return list(self.maps[name].keys())


class StageFunction(KeyedProcessFunction):
    """One stage (planner, batcher or merger) as a keyed function; input and output are (agent, JSON)."""

    def __init__(self, stage: str, config_json: str, output_dir: str | None = None, bounded: bool = False, *,
                 keyed_output: bool = True) -> None:
        self.stage = stage
        self.config_json = config_json
        self.output_dir = output_dir
        self.bounded = bounded
        self.keyed_output = keyed_output  # (agent, JSON) for the next stage, or the JSON alone (the merger)

    def open(self, runtime_context: RuntimeContext) -> None:
        _quiet_chatty_loggers()
        self.config = Config.model_validate_json(self.config_json)
        self.runtime = acquire_runtime(self.config, self.output_dir)
        self.pool = self.runtime.pool
        self.core = CORES[self.stage](self.config, self.runtime.factory, bounded=self.bounded)
        schema = self.core.schema
        values = {name: runtime_context.get_state(ValueStateDescriptor(name, Types.STRING()))
                  for name in [*schema.values, *schema.legacy_values]}
        maps = {name: runtime_context.get_map_state(MapStateDescriptor(name, Types.STRING(), Types.STRING()))
                for name in schema.maps}
        self.state = _FlinkState(values, maps)
        self.recheck_ms = max(1000, int(self.config.job.recheck_s * 1000))
        self.wait_s = self.config.llm.timeout_s * (self.config.llm.max_retries + 1)
        # per key: the calls it waits for and its core's next deadline (a timer before either is skipped)
        self.pending: dict[str, tuple[list[str], int | None]] = {}
        self.signalled: set[str] = set()  # agents whose end of input went downstream
        self.armed: set[str] = set()  # agents whose end-of-input timers this subtask has registered
        self.timers: dict[str, set[int]] = {}  # per agent, times of timers registered and not yet due
        self.in_flight = 0  # calls the pending keys wait for
        self.activations = 0
        self.fresh_results = 0
        group = runtime_context.get_metrics_group().add_group("flink_memory")
        self.tally = Tally(group)
        self.m_latency = group.distribution("llm_latency_ms")
        # levels as counters moved by the difference on every activation: a Python gauge would be called back
        # by the metrics thread, which in thread mode can run after the interpreter closed (a JVM crash)
        self.levels: dict[str, int] = {}

    def close(self) -> None:
        if getattr(self, "tally", None) is not None:
            self.tally.flush()
        if getattr(self, "runtime", None) is not None:
            release_runtime(self.config, self.output_dir, self.stage)
            self.runtime = None

    # --- activations ---------------------------------------------------------------------------------

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, payload = value  # (keyed by value[0]: asking Flink for the key would be a call into the JVM)
        if payload == END_OF_INPUT:  # the stage before has finished this agent's input: so has this one
            yield from self._activate(ctx, key, lambda st, now: self.core.on_end(st, self.pool.finished(), now),
                                      ended=True)
            return
        yield from self._activate(ctx, key,
                                  lambda st, now: self.core.on_input(st, payload, self.pool.finished(), now), payload)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        key = ctx.get_current_key()
        wake = lambda st, now: self.core.on_wake(st, self.pool.finished(), now)  # noqa: E731
        if timestamp not in END_TIMERS:
            waiting, deadline = self.pending.get(key, ([], None))
            if waiting and not self.pool.any_done(waiting) and (deadline is None or timestamp < deadline):
                now = _now_ms()
                self._set_timer(ctx.timer_service(), key, self.pool.wake_at_ms(waiting, now), now)  # early: nothing yet
                return
            yield from self._activate(ctx, key, wake)
            return
        phase = END_TIMERS.index(timestamp)
        if phase == 0:
            yield from self._activate(ctx, key, lambda st, now: self.core.on_end(st, self.pool.finished(), now),
                                      ended=True)
            return
        last = phase == END_PHASES - 1
        outputs: list[Any] = []
        effects = self._run(ctx, key, wake, None, outputs)
        while effects.waiting or (last and effects.wake_at_ms is not None):
            if effects.waiting:  # other keys' calls keep running on the pool meanwhile
                self.pool.wait([r.digest for r in effects.waiting], timeout_s=self.wait_s)
            else:  # a provider failure's backoff: the same policy as in any other phase
                time.sleep(min(self.wait_s, max(0.0, effects.wake_at_ms / 1000 - time.time())))
            effects = self._run(ctx, key, wake, None, outputs)
            if not last:
                break
        self._signal_end(key, effects, outputs)
        yield from outputs

    def _activate(self, ctx: Any, key: str, call: Callable[[StateTransaction, int], Effects],
                  payload: str | None = None, ended: bool = False) -> Iterator[Any]:
        outputs: list[Any] = []
        effects = self._run(ctx, key, call, payload, outputs)
        if ended:
            self._signal_end(key, effects, outputs)
        yield from outputs

    def _signal_end(self, key: str, effects: Effects, outputs: list[Any]) -> None:
        """At the end of input, tell the next stage as soon as this agent has nothing left here, so its
        end-of-input work starts while other agents are still being finished (not after all of them)."""
        if self.keyed_output and effects.idle and key not in self.signalled:
            self.signalled.add(key)
            outputs.append((key, END_OF_INPUT))

    def _run(self, ctx: Any, key: str, call: Callable[[StateTransaction, int], Effects], payload: str | None,
             outputs: list[Any]) -> Effects:
        """Run the core once for the current key and carry out its effects; returns them."""
        self.activations += 1
        timers = ctx.timer_service()
        now = _now_ms()
        _fault_hook(self.config.job.inject_failure, self.stage, self.activations)  # a crash drill: restarts
        self.state.key = key
        evicted: list[DeadLetter] = []
        for _ in range(MAX_EVICTIONS):
            state = StateTransaction(self.core.schema, self.state, key)
            try:
                effects = call(state, now)
                state.commit()
                break
            except Exception as exc:  # a bug of ours for a record: a restart first, then a dead letter
                effects, again = self._fault(key, exc, payload)
                if not again:
                    break
                evicted.extend(effects.dead_letters)  # a queued record is out: the activation runs again
        else:
            raise RuntimeError(f"{self.stage}: {MAX_EVICTIONS} records of agent {key} dead-lettered in one activation")
        effects.dead_letters[:0] = evicted
        for request in effects.start:
            self.pool.submit(request)
        self.pool.forget(effects.consumed)
        self._account(effects)
        self.in_flight -= len(self.pending.pop(key, ([], None))[0])
        if not effects.idle:
            self.pending[key] = ([r.digest for r in effects.waiting], effects.wake_at_ms)
            self.in_flight += len(effects.waiting)
        self._level("pending_keys", len(self.pending))
        self._level("llm_in_flight", self.in_flight)
        self._schedule(timers, key, effects, now)
        outputs.extend((key, out) if self.keyed_output else out for out in effects.out)
        outputs.extend((MANIFESTS, manifest) for manifest in effects.manifests)
        outputs.extend((DEAD_LETTERS, dead.model_dump_json()) for dead in effects.dead_letters)
        return effects

    # --- faults --------------------------------------------------------------------------------------

    def _fault(self, key: str, exc: Exception, payload: str | None) -> tuple[Effects, bool]:
        """Raise the first time (the job restarts from its checkpoint); dead-letter it when it comes again.

        Returns the eviction's effects, and whether the activation must run again: a record dead-lettered out
        of the planner's queue is not the one this activation brought, which still has to be handled."""
        held = exc if isinstance(exc, RecordFault) else None
        culprit = held.payload if held is not None else payload
        if held is not None and isinstance(held.cause, Exception):
            exc = held.cause
        fault = digest_parts([self.stage, key, culprit or "wake", type(exc).__name__])
        journal = self.runtime.client.journal
        if journal is not None:
            seen = journal.count_fault(fault)
        else:  # without a journal, this interpreter remembers (thread mode keeps it across restarts)
            _FAULTS[fault] += 1
            seen = _FAULTS[fault]
        if seen <= 1:
            log.error("%s: error for agent %s, restarting from the last checkpoint once: %r", self.stage, key, exc)
            raise exc
        reason = f"internal error in the {self.stage} stage: {type(exc).__name__}: {exc}"
        log.error("%s: %s; dead-lettered, the job goes on", self.stage, reason)
        self._count("internal_errors")
        state = StateTransaction(self.core.schema, self.state, key)
        if held is not None and held.seq is not None:  # a record in the planner's queue: exactly that one
            effects = self.core.evict(state, reason, held.seq)
            if effects.dead_letters:
                state.commit()
                return effects, True
        if payload is not None and self.stage == "planner":  # the record this activation brought
            record = json.loads(payload)
            return Effects(dead_letters=[DeadLetter(raw=payload, reason=reason, stage="internal", agent_id=key,
                                                    record_id=record.get("id"))]), False
        effects = self.core.evict(state, reason)
        state.commit()
        if payload is not None:
            effects.dead_letters.append(DeadLetter(raw=payload, reason=reason, stage="internal", agent_id=key))
        return effects, False

    # --- timers and metrics --------------------------------------------------------------------------

    def _schedule(self, timers: Any, key: str, effects: Effects, now: int) -> None:
        if key not in self.armed:  # the end-of-input phases, once per key and subtask (Flink keeps one per time)
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

    def _account(self, effects: Effects) -> None:
        for result in effects.results:
            if result.from_journal:
                self._count("journal_hits")
            else:
                self._count("llm_calls")
                self._count(f"llm_calls_{result.kind or 'other'}")
                self.m_latency.update(int(result.latency_s * 1000))
                self.fresh_results += 1
                _fault_hook(self.config.job.inject_failure, "call", self.fresh_results)
            self._count("prompt_tokens", result.prompt_tokens)
            self._count("completion_tokens", result.completion_tokens)
            if result.truncated:
                self._count("llm_truncated")
        if effects.rejections:
            self._count("llm_context_rejections", effects.rejections)
            log.warning("%s: %d request(s) refused for their length, re-packed smaller", self.stage,
                        effects.rejections)
        for error in effects.failures:
            self._count("llm_failures")
            log.warning("%s: provider failed, retrying later: %s", self.stage, error)
        for name, n in effects.counts.items():
            self._count(name, n)
        if effects.dead_letters:  # (with the parser's, every dead letter of the job)
            self._count("dead_letters", len(effects.dead_letters))
