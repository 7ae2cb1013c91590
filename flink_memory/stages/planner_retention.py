"""How long the planner remembers what it accepted: records stay editable for `memory.editable_for`, then are
sealed (an update or a deletion is refused with the reason), and after as long again their ids are forgotten;
a stored plan is kept as long as a record stays editable. A sweep every tenth of `memory.editable_for` does
it, not every record.
"""

from __future__ import annotations

from flink_memory.stages.calls import Effects, Timing
from flink_memory.stages.planner_state import CLOCK, PLANS, SOURCES, PlannerClock, SourceEntry
from flink_memory.state import StateTransaction


class SourceRetention:
    """The planner's retention of accepted records and plans, a part the core holds."""

    def __init__(self, timing: Timing, editable_for_s: float) -> None:
        self.timing, self.editable_for_s = timing, editable_for_s  # (memory.editable_for, as the reason shows it)

    def sealed(self, source: SourceEntry, now_ms: int) -> bool:
        return source.sealed or (source.accepted_ms > 0 and now_ms - source.accepted_ms >= self.timing.editable_ms)

    def sealed_reason(self, record_id: str) -> str:
        return (f"sealed: record {record_id!r} was accepted more than memory.editable_for "
                f"({self.editable_for_s:.0f} s) ago, or by release 0.1.0; its text has left state, so "
                "it can no longer be updated or deleted")

    def remember(self, state: StateTransaction, now_ms: int, effects: Effects) -> None:
        """Something was stored that must expire: make sure a sweep is scheduled."""
        if state.get(CLOCK) is None:
            state.set(CLOCK, PlannerClock(next_sweep_ms=self.timing.next_sweep_ms(now_ms)))
        effects.sweep(state.get(CLOCK).next_sweep_ms)

    def sweep(self, state: StateTransaction, now_ms: int, effects: Effects) -> None:
        """Seal records older than memory.editable_for, forget ids twice as old and plans as old; schedule the
        next sweep while anything is left. Runs every tenth of memory.editable_for, not on every record."""
        clock = state.get(CLOCK)
        if clock is None or clock.next_sweep_ms is None:
            return
        if now_ms >= clock.next_sweep_ms:
            for record_id in state.keys(SOURCES):
                source = state.entry(SOURCES, record_id)
                age = now_ms - source.accepted_ms
                if not source.accepted_ms:  # (no acceptance time known: its age counts from now)
                    state.put(SOURCES, record_id, source.model_copy(update={"accepted_ms": now_ms}))
                elif age >= 2 * self.timing.editable_ms or not source.digest:
                    state.put(SOURCES, record_id, None)
                elif age >= self.timing.editable_ms and not source.sealed:
                    state.put(SOURCES, record_id, source.model_copy(update={"sealed": True, "units": []}))
            for input_digest in state.keys(PLANS):
                plan = state.entry(PLANS, input_digest)
                if not plan.stored_ms:
                    state.put(PLANS, input_digest, plan.model_copy(update={"stored_ms": now_ms}))
                elif now_ms - plan.stored_ms >= self.timing.editable_ms:
                    state.put(PLANS, input_digest, None)
            if not state.keys(SOURCES) and not state.keys(PLANS):
                state.set(CLOCK, None)
                return
            clock.next_sweep_ms = self.timing.next_sweep_ms(now_ms)
            state.set(CLOCK, clock)
        effects.sweep(clock.next_sweep_ms)
