"""The batcher's revisions of emitted batches: summarized again after a change, until they are sealed.

A retraction that reaches a batch already emitted has the batch summarized again from its remaining units; the
new node replaces the live one (`batch-000007-r1` replaces `batch-000007`; with no unit left, an empty node
does). A batch's revision counts the changes that reached it, so batch ids never depend on when calls end.
Emitted batches keep their units for `memory.editable_for` after their newest unit, then only the summary
stays.
"""

from __future__ import annotations

from collections.abc import Callable

from flink_memory.ids import NodeId
from flink_memory.records import SummaryNode
from flink_memory.requests import RequestFactory
from flink_memory.stages.batcher_state import DONE, HOMES, BatcherMeta, DoneBatch
from flink_memory.stages.calls import Effects, Finished, Timing, drive
from flink_memory.state import StateTransaction
from flink_memory.state import seq_key as _key


def next_revision(done: DoneBatch) -> tuple[int, list[str]]:
    """The revision an emitted batch is made into, and what it replaces: the live node and every revision
    between (which the first attempt of a replay may have written)."""
    revision = max(done.target, done.revision + 1)
    between = (str(NodeId.batch(done.seq, r)) for r in range(done.revision + 1, revision))
    return revision, [done.live, *between]


class BatchRevisions:
    """The batcher core's revisions of emitted batches (a part of BatcherCore): it builds and sends nodes
    through the core."""

    factory: RequestFactory
    timing: Timing
    _node: Callable[..., SummaryNode]  # (agent_id, seq, revision, units, text, job, replaces): a batch node
    _out: Callable[[BatcherMeta, Effects, SummaryNode], None]  # a node to the merger and the batcher log

    def _resummarize(self, state: StateTransaction, meta: BatcherMeta, done: DoneBatch, finished: Finished,
                     now_ms: int, effects: Effects) -> None:
        """Summarize an emitted batch again from its remaining units; the new node replaces the live one."""
        text = ""
        if done.job is not None:
            progress = drive(done.job, self.factory, finished, now_ms, self.timing.retry)
            effects.track(progress, done.job)
            if progress.state != "done":
                state.put(DONE, _key(done.seq), done)
                return
            text = progress.value
        revision, replaces = next_revision(done)
        node = self._node(state.key, done.seq, revision, done.units, text, done.job, replaces=replaces)
        self._out(meta, effects, node)
        effects.counts["batches_revised"] += 1
        meta.resummarizing.remove(done.seq)
        if done.units:
            state.put(DONE, _key(done.seq), done.model_copy(update={"live": node.node_id, "revision": revision,
                                                                     "job": None, "target": 0}))
        else:
            state.put(DONE, _key(done.seq), None)

    def _sweep(self, state: StateTransaction, meta: BatcherMeta, now_ms: int) -> None:
        """Emitted batches whose newest unit is older than memory.editable_for keep only their summary."""
        if not self.timing.sweep_due(meta.next_sweep_ms, now_ms):
            return
        for key, done in state.items(DONE):
            if now_ms - done.newest_ms >= self.timing.editable_ms and done.job is None:
                for unit in done.units:
                    state.put(HOMES, unit.unit_id, None)
                state.put(DONE, key, None)
        meta.next_sweep_ms = self.timing.next_sweep_ms(now_ms) if state.keys(DONE) else None
