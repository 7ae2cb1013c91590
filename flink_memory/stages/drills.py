"""Recovery drills (`job.inject_failure`), applied by a runner around a stage's core, so no core reads them.

Both runners (the Flink shell, flink_memory.flink.operators, and the in-memory one, flink_memory.local) hold one
`StageDrill` per stage: `before` runs ahead of each activation (a stage drill fails there, outside the driver's
fault policy, as a crash of the task would), `results` after it (a call drill counts fresh LLM results), and
`around` hands a record drill to a core that handles records one by one (`RecordInspected`), where an error
is blamed on the record as any error of ours is (stages.calls.RecordFault). A stage or call drill fires once:
it writes its marker file, and does not fire while the file exists (a restarted job goes on).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from flink_memory.config import Drill
from flink_memory.records import InputRecord, SummaryNode
from flink_memory.stages.calls import Effects
from flink_memory.stages.messages import StageMessage
from flink_memory.stages.protocol import StageCore

CALL_DRILL = "call"  # the drill target that counts fresh LLM results (not a stage)


@runtime_checkable
class RecordInspected(Protocol):
    """A core that handles input records one at a time (the planner, some after they waited in its queue):
    `inspect` sees each record just before it is handled."""

    def inspect_with(self, inspect: Callable[[InputRecord], None]) -> None: ...


class StageDrill:
    """The drill of one stage in one runner (a Flink subtask, or the in-memory pipeline): it counts that
    runner's activations and fresh results."""

    def __init__(self, drill: Drill | None, stage: str) -> None:
        self.drill, self.stage = drill, stage
        self.activations = 0
        self.fresh_results = 0
        self.due = False  # an `after` drill: the activation before took its node

    def around(self, core: StageCore) -> StageCore:
        """The core, with a record drill handed to it when it is the core that handles records."""
        if self.drill is not None and self.drill.record is not None and isinstance(core, RecordInspected):
            core.inspect_with(self._poison)
        return core

    def before(self, key: str, message: StageMessage | None) -> None:
        """Ahead of one activation of the stage for `key` (a message, or None: a wake-up)."""
        self.activations += 1
        drill = self.drill
        if drill is None or drill.target != self.stage:
            return
        due, self.due = self.due, drill.after is not None and isinstance(message, SummaryNode) \
            and (key, message.node_id) == drill.after
        if due if drill.after is not None else self.activations == drill.at:
            self._fire(f"injected failure in {self.stage} at activation {self.activations}")

    def results(self, effects: Effects) -> None:
        """After one activation: count its fresh LLM results (a journal's replays are not fresh)."""
        drill = self.drill
        for result in effects.results:
            if not result.from_journal:
                self.fresh_results += 1
                if drill is not None and drill.target == CALL_DRILL and self.fresh_results == drill.at:
                    self._fire(f"injected failure in call at activation {self.fresh_results}")

    def _fire(self, reason: str) -> None:
        marker = self.drill.marker if self.drill is not None else None
        if marker is None or os.path.exists(marker):
            return
        with open(marker, "w") as handle:
            handle.write(self.stage if self.drill is None or self.drill.target != CALL_DRILL else CALL_DRILL)
        raise RuntimeError(reason)

    def _poison(self, record: InputRecord) -> None:
        if self.drill is not None and (record.agent_id, getattr(record, "id", None)) == self.drill.record:
            raise RuntimeError(f"injected failure for record {record.agent_id}/{record.id} (job.inject_failure)")
