"""The merger's revisions: a node that replaces another takes its place, and what was merged from it is made again.

A batch summarized again after a retraction names the node it replaces. In the frontier the new node swaps in;
under a merge, that merge is made again from its children (the new one replaces it, `merge-L2-000003-r1`),
and so on up, then the global. While a batch is being summarized again its node is held: the sweep keeps it,
its siblings and the merges above them until the replacement arrives, however long the calls take.
"""

from __future__ import annotations

from collections.abc import Callable

from flink_memory.ids import NodeId
from flink_memory.records import SummaryNode
from flink_memory.stages.calls import Effects, Finished
from flink_memory.stages.merger_state import MERGES, NODES, ParentJob, StoredNode
from flink_memory.state import StateTransaction
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import SummaryTree


def _swap(child_ids: list[str], old_id: str, new: SummaryNode) -> list[str]:
    """The children after `new` replaced `old_id` (an empty replacement leaves no child)."""
    return [new.node_id if c == old_id else c for c in child_ids if c != old_id or new.item_count]


class TreeRevisions:
    """The merger core's revisions (a part of MergerCore): replacing a node where it stands, holding nodes being
    made again. It places new nodes and runs merges through the core."""

    _place: Callable[..., None]  # (state, tree, node, newest, now_ms, finished, effects): a node joins the frontier
    _run_merge: Callable[..., None]  # (state, tree, job, finished, now_ms, effects)
    _merge_job: Callable[..., ParentJob]  # (node_id, level, children, replaces)

    def _supersede(self, state: StateTransaction, tree: SummaryTree, old_id: str, new: SummaryNode, newest: int,
                   now_ms: int, finished: Finished, effects: Effects) -> None:
        """`new` replaces `old_id` where it stands: in the frontier, or under a merge that is made again."""
        old = state.entry(NODES, old_id)
        if old is None:  # never written (a batch that took changes before it left) or sealed long ago:
            effects.counts["replacements_unplaced"] += 1  # nothing in state to recompute, keep the new one
            if new.item_count:
                self._place(state, tree, new, newest, now_ms, finished, effects)
            return
        state.put(NODES, old_id, None)
        if old.parent is None:  # a frontier node: swap it in place (an empty one leaves the frontier)
            if new.item_count:
                tree.swap(old_id, new.node_id)
                state.put(NODES, new.node_id, StoredNode(node=new, newest_ms=newest))
            else:
                tree.drop(old_id)
            return
        state.put(NODES, new.node_id, StoredNode(node=new, parent=old.parent, newest_ms=newest))
        running = state.entry(MERGES, old.parent)
        if running is not None:  # the parent is still being made: make it from the new children instead
            self._rebuild(state, tree, running, _swap(running.child_ids, old_id, new), finished, now_ms, effects)
            return
        parent = state.entry(NODES, old.parent)
        if parent is None:
            effects.counts["replacements_unplaced"] += 1
            return
        revision = state.entry(MERGES, parent.running_revision) if parent.running_revision is not None else None
        if revision is not None:  # a revision of the parent is being made: it takes this change too
            self._rebuild(state, tree, revision, _swap(revision.child_ids, old_id, new), finished, now_ms, effects)
            return
        job = ParentJob(node_id=str(NodeId.parse(old.parent).next_revision()), level=parent.node.level,
                        children=[], job=ReduceJob(purpose="merge", entries=[]), replaces=[old.parent])
        state.put(NODES, old.parent, parent.model_copy(update={"running_revision": job.node_id}))
        self._rebuild(state, tree, job, _swap(parent.node.children, old_id, new), finished, now_ms, effects)

    def _rebuild(self, state: StateTransaction, tree: SummaryTree, job: ParentJob, child_ids: list[str],
                 finished: Finished, now_ms: int, effects: Effects) -> None:
        """Make a merge (again) from these children, in this order (empty ones left out)."""
        children = [stored.node for i in child_ids if (stored := state.entry(NODES, i)) is not None
                    and stored.node.item_count]
        for child in children:
            entry = state.entry(NODES, child.node_id)
            state.put(NODES, child.node_id, entry.model_copy(update={"parent": job.node_id}))
        self._run_merge(state, tree, self._merge_job(job.node_id, job.level, children, job.replaces), finished,
                        now_ms, effects)

    def _hold(self, state: StateTransaction, node_ids: list[str]) -> None:
        """Nodes being made again are held: until their replacements arrive, the sweep keeps them, their
        siblings and the merges above them, however long the calls take."""
        for node_id in node_ids:
            stored = state.entry(NODES, node_id)
            if stored is not None and not stored.held:
                state.put(NODES, node_id, stored.model_copy(update={"held": True}))
