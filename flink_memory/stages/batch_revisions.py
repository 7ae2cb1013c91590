"""The batcher's revisions of sent batches: summarized again after a change, until they are sealed.

A retraction that reaches a batch already sent has the batch summarized again from its remaining units; the
new node replaces the live one (`batch-000007-r1` replaces `batch-000007`; with no unit left, an empty node
does). A batch's revision counts the changes that reached it, so batch ids never depend on when calls end.
Emitted batches keep their units for `memory.editable_for` after their newest unit, then only the summary
stays.
"""

from __future__ import annotations

from flink_memory.config import Config
from flink_memory.ids import NodeId
from flink_memory.memory_log import Lineage, log_entry
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.requests import RequestFactory
from flink_memory.stages.batcher_state import DONE, HOMES, BatcherMeta, DoneBatch
from flink_memory.stages.calls import Effects, Finished, Timing, drive
from flink_memory.stages.channels import MEMORY_LOG
from flink_memory.state import StateTransaction
from flink_memory.state import seq_key as _key
from flink_memory.summarize.reduce import ReduceJob


def next_revision(done: DoneBatch) -> tuple[int, list[str]]:
    """The revision a sent batch is made into, and what it replaces: the live node and every revision
    between (which the first attempt of a replay may have written)."""
    revision = max(done.target, done.revision + 1)
    between = (str(NodeId.batch(done.seq, r)) for r in range(done.revision + 1, revision))
    return revision, [done.live, *between]


def lineage_of(meta: BatcherMeta) -> Lineage:
    """The history the agent's batcher log is written in."""
    return Lineage(history=meta.history, branch=meta.branch)


class BatchNodes:
    """How the batcher makes a batch node and sends it: to the merger, and as retention keeps it, into the
    agent's batcher log."""

    def __init__(self, config: Config) -> None:
        self.model = config.llm.model  # (a node made without a call: an empty revision)
        self.logged = config.summarization.retention != "global_only"  # (the merger writes the same nodes)

    def make(self, agent_id: str, seq: int, revision: int, units: list[MemoryUnit], text: str,
             job: ReduceJob | None, replaces: list[str] | None = None) -> SummaryNode:
        stamps = sorted(u.ts for u in units if u.ts)
        return SummaryNode(
            agent_id=agent_id, node_id=str(NodeId.batch(seq, revision)), kind="batch", level=1,
            children=[u.unit_id for u in units], text=text, item_count=len(units),
            first_ts=stamps[0] if stamps else None, last_ts=stamps[-1] if stamps else None,
            model=",".join(job.models) if job and job.models else self.model,
            prompt_tokens=job.prompt_tokens if job else 0, completion_tokens=job.completion_tokens if job else 0,
            truncated=job.truncated if job else False, replaces=replaces or [],
        )

    def send(self, meta: BatcherMeta, effects: Effects, node: SummaryNode) -> None:
        effects.out.append(node)
        if self.logged:
            meta.log_seq += 1
            effects.emit(MEMORY_LOG, log_entry("batcher", node.agent_id, meta.log_seq, lineage_of(meta), node=node))


class BatchRevisions:
    """The batcher's revisions of sent batches, a part the core holds: it summarizes a batch again and seals
    old ones; `nodes` makes and sends what it writes."""

    def __init__(self, factory: RequestFactory, timing: Timing, nodes: BatchNodes) -> None:
        self.factory, self.timing, self.nodes = factory, timing, nodes

    def resummarize(self, state: StateTransaction, meta: BatcherMeta, done: DoneBatch, finished: Finished,
                    now_ms: int, effects: Effects) -> None:
        """Summarize a sent batch again from its remaining units; the new node replaces the live one."""
        text = ""
        if done.job is not None:
            progress = drive(done.job, self.factory, finished, now_ms, self.timing.retry)
            effects.track(progress, done.job)
            if progress.state != "done":
                state.put(DONE, _key(done.seq), done)
                return
            text = progress.value
        revision, replaces = next_revision(done)
        node = self.nodes.make(state.key, done.seq, revision, done.units, text, done.job, replaces=replaces)
        self.nodes.send(meta, effects, node)
        effects.counts["batches_revised"] += 1
        meta.resummarizing.remove(done.seq)
        if done.units:
            state.put(DONE, _key(done.seq), done.model_copy(update={"live": node.node_id, "revision": revision,
                                                                     "job": None, "target": 0}))
        else:
            state.put(DONE, _key(done.seq), None)

    def sweep(self, state: StateTransaction, meta: BatcherMeta, now_ms: int) -> None:
        """Emitted batches whose newest unit is older than memory.editable_for keep only their summary."""
        if not self.timing.sweep_due(meta.next_sweep_ms, now_ms):
            return
        for key, done in state.items(DONE):
            if now_ms - done.newest_ms >= self.timing.editable_ms and done.job is None:
                for unit in done.units:
                    state.put(HOMES, unit.unit_id, None)
                state.put(DONE, key, None)
        meta.next_sweep_ms = self.timing.next_sweep_ms(now_ms) if state.keys(DONE) else None
