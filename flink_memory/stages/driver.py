"""The activation driver: how any stage core is run for one key, by the Flink shell and by the test harness.

One activation loads the key's state (an older layout moved into the current one by the stage's migration, which
the topology hands over: flink_memory.topology),
runs the core for a record, a wake-up or the end of input, and commits the state when the core returns. The
caller carries out the effects (starts calls, sets timers, sends outputs on).

Faults: an exception of ours is raised the first time it is seen (the job restarts from its last checkpoint:
it may have been transient); when it comes again, the core evicts the culprit (it goes to dead-letters with
stage `internal`) and the job goes on. Who counts is injected: the shell counts through the journal, which
survives restarts, or in a process-wide Counter; without a counter, every exception is raised as it is.

End of input (`end_of_input`, which both runners call): each key runs END_ROUNDS rounds. Round 0 closes what is
open (`on_end`; it also runs when the stage before says the agent's input ended); each middle round wakes the
key, waits once for its calls and wakes it again (other keys' calls keep running meanwhile); the last round
drives the key until nothing is in flight or scheduled. A key whose end was seen tells the next stage as soon as
it is idle, so the next stage's end-of-input work starts while others are still finishing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from flink_memory.digests import digest_parts
from flink_memory.stages.calls import Effects, Finished, RecordFault
from flink_memory.stages.messages import END, EndOfInput, StageMessage, text_of
from flink_memory.stages.protocol import Culprit, StageCore, internal_dead_letter
from flink_memory.state import Migration, StateBackend, StateTransaction

log = logging.getLogger(__name__)

END_ROUNDS = 8  # rounds per key at the end of input (batch, merges, global) before the last one drains
MAX_EVICTIONS = 1000  # queued records one activation may dead-letter before it gives up (a loop guard)


@dataclass(frozen=True)
class Waits:
    """How the end-of-input rounds wait: for calls (a pool's `wait`), and out a backoff (`sleep`)."""

    wait: Callable[[list[str], float], None]  # (request digests, timeout in s)
    sleep: Callable[[float], None]
    now_ms: Callable[[], int]
    max_s: float  # no single wait lasts longer (a call's whole timeout with its retries)

    def until(self, at_ms: int) -> None:
        self.sleep(min(self.max_s, max(0.0, (at_ms - self.now_ms()) / 1000)))


class Driver:
    """Runs one stage core for one key at a time (the caller sets the backend's current key)."""

    def __init__(self, core: StageCore, stage: str, count_fault: Callable[[str], int] | None = None,
                 migration: Migration | None = None) -> None:
        self.core = core
        self.stage = stage  # the stage's name in logs, dead-letter reasons and fault digests
        self.count_fault = count_fault  # how often a fault was seen, this time included
        self.migration = migration
        self.schema = self.migration.schema(core.schema) if self.migration is not None else core.schema
        self.told: set[str] = set()  # keys whose end of input went to the next stage

    # --- one activation -------------------------------------------------------------------------------

    def load(self, backend: StateBackend, key: str) -> StateTransaction:
        """The key's state, in the current layout."""
        state = StateTransaction(self.schema, backend, key)
        if self.migration is not None:
            self.migration.migrate(self.core, state)
        return state

    def transact(self, backend: StateBackend, key: str, call: Callable[[StateTransaction], Effects]) -> Effects:
        """Run `call` on the key's state and commit it; an exception leaves the state as it was."""
        state = self.load(backend, key)
        effects = call(state)
        state.commit()
        return effects

    def activate(self, backend: StateBackend, key: str, message: StageMessage | None, finished: Finished,
                 now_ms: int) -> Effects:
        """Run the core once: for a message of the stage before (EndOfInput: the end of input) or a wake-up
        (None)."""
        evicted, faults = [], 0
        for _ in range(MAX_EVICTIONS):
            try:
                state = self.load(backend, key)
                effects = self._run(state, message, finished, now_ms)
                state.commit()
                break
            except Exception as exc:  # a bug of ours for a record: a restart first, then a dead letter
                if self.count_fault is None:
                    raise
                effects, again = self._fault(backend, key, exc, message)
                faults += 1
                if not again:
                    break
                evicted.extend(effects.dead_letters)  # a queued record is out: the activation runs again
        else:
            raise RuntimeError(f"{self.stage}: {MAX_EVICTIONS} records of agent {key} dead-lettered in one activation")
        effects.dead_letters[:0] = evicted
        if faults:
            effects.counts["internal_errors"] += faults
        return effects

    def unreadable(self, key: str, tag: str, body: str, exc: Exception) -> Effects:
        """A message of the stage before that does not parse (an error of ours): raised the first time (the job
        restarts from its last checkpoint), and when it comes again it alone becomes a dead letter. The core is
        not asked to evict anything: what it holds is not to blame."""
        if self.count_fault is None or self.count_fault(digest_parts([self.stage, key, tag, body])) <= 1:
            raise exc
        reason = f"internal error in the {self.stage} stage: a {tag!r} message does not parse: {exc}"
        log.error("%s: %s; dead-lettered, the job goes on", self.stage, reason)
        effects = Effects(dead_letters=[internal_dead_letter(body, reason, key)])
        effects.counts["internal_errors"] += 1
        return effects

    def _run(self, state: StateTransaction, message: StageMessage | None, finished: Finished,
             now_ms: int) -> Effects:
        if message is None:
            return self.core.on_wake(state, finished, now_ms)
        if isinstance(message, EndOfInput):
            return self.core.on_end(state, finished, now_ms)
        return self.core.on_input(state, message, finished, now_ms)

    def _fault(self, backend: StateBackend, key: str, exc: Exception,
               message: StageMessage | None) -> tuple[Effects, bool]:
        """Raise the first time; evict the culprit when it comes again. Returns the eviction's effects, and
        whether the activation must run again: a record evicted out of the stage's queue is not the one
        this activation brought, which still has to be handled."""
        held = exc if isinstance(exc, RecordFault) else None
        brought = None if message is None or isinstance(message, EndOfInput) else message
        blamed = held.payload if held is not None else (text_of(brought) if brought is not None else None)
        if held is not None and isinstance(held.cause, Exception):
            exc = held.cause
        if self.count_fault(digest_parts([self.stage, key, blamed or "wake", type(exc).__name__])) <= 1:
            log.error("%s: error for agent %s, restarting from the last checkpoint once: %r", self.stage, key, exc)
            raise exc
        reason = f"internal error in the {self.stage} stage: {type(exc).__name__}: {exc}"
        log.error("%s: %s; dead-lettered, the job goes on", self.stage, reason)
        state = self.load(backend, key)
        if held is not None and held.seq is not None:  # a record the stage holds: exactly that one
            effects = self.core.evict(state, reason, Culprit(seq=held.seq))
            if effects.dead_letters:
                state.commit()
                return effects, True
        effects = self.core.evict(state, reason, Culprit(message=brought))
        state.commit()
        return effects, False

    # --- the end of input -----------------------------------------------------------------------------

    def end_of_input(self, key: str, index: int, activate: Callable[[StageMessage | None], Effects],
                     waits: Waits) -> bool:
        """Round `index` of the key's end of input (round 0 also for an END from the stage before); `activate`
        runs the key once and carries out its effects. Returns whether to send END on to the next stage now."""
        return self.tell_next(key, self.end_round(index, activate, waits))

    def end_round(self, index: int, activate: Callable[[StageMessage | None], Effects], waits: Waits) -> Effects:
        """Round `index` (0 to END_ROUNDS - 1) of one key; `activate` runs the key once and carries out its
        effects (see the module's docstring for the rule)."""
        if index == 0:
            return activate(END)
        last = index == END_ROUNDS - 1
        effects = activate(None)
        while effects.waiting or (last and effects.wake_at_ms is not None):
            if effects.waiting:
                waits.wait([r.digest for r in effects.waiting], waits.max_s)
            else:  # a provider failure's backoff: the same policy as in any other round
                waits.until(effects.wake_at_ms)  # type: ignore[arg-type]
            effects = activate(None)
            if not last:
                break
        return effects

    def tell_next(self, key: str, effects: Effects) -> bool:
        """After an end-of-input activation: whether to send the end of input on now (once per key, when idle)."""
        if effects.idle and key not in self.told:
            self.told.add(key)
            return True
        return False
