"""The merger's revisions: a node that replaces another takes its place, and what was merged from it is made again.

A batch summarized again after a retraction names the node it replaces. In the frontier the new node swaps in;
under a merge, that merge is made again from its children (the new one replaces it, `merge-L2-000003-r1`),
and so on up, then the global. While a batch is being summarized again its node is held: the sweep keeps it,
its siblings and the merges above them until the replacement arrives, however long the calls take.
"""

from __future__ import annotations

from flink_memory.ids import NodeId
from flink_memory.records import SummaryNode
from flink_memory.stages.calls import Effects
from flink_memory.stages.merger_state import MERGES, NODES, ParentJob, StoredNode, merge_job
from flink_memory.state import StateTransaction
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import SummaryTree


def _swap(child_ids: list[str], old_id: str, new: SummaryNode) -> list[str]:
    """The children after `new` replaced `old_id` (an empty replacement leaves no child)."""
    return [new.node_id if c == old_id else c for c in child_ids if c != old_id or new.item_count]


class TreeRevisions:
    """The merger's revisions, a part the core holds: replacing a node where it stands, holding nodes being made
    again. It changes the tree and its state and answers what the core does next: place a node in the frontier,
    or run a merge (made again); `merge_target` is the length asked of a merge's summary."""

    def __init__(self, merge_target: int) -> None:
        self.merge_target = merge_target

    def supersede(self, state: StateTransaction, tree: SummaryTree, old_id: str, new: SummaryNode, newest: int,
                  effects: Effects) -> SummaryNode | ParentJob | None:
        """`new` replaces `old_id` where it stands: in the frontier, or under a merge that is made again (the
        job returned); a node returned joins the frontier as a new one."""
        old = state.entry(NODES, old_id)
        if old is None:  # never written (a batch that took changes before it left) or sealed long ago:
            effects.counts["replacements_unplaced"] += 1  # nothing in state to recompute, keep the new one
            return new if new.item_count else None
        state.put(NODES, old_id, None)
        if old.parent is None:  # a frontier node: swap it in place (an empty one leaves the frontier)
            if new.item_count:
                tree.swap(old_id, new.node_id)
                state.put(NODES, new.node_id, StoredNode(node=new, newest_ms=newest))
            else:
                tree.drop(old_id)
            return None
        state.put(NODES, new.node_id, StoredNode(node=new, parent=old.parent, newest_ms=newest))
        running = state.entry(MERGES, old.parent)
        if running is not None:  # the parent is still being made: make it from the new children instead
            return self._rebuild(state, running, _swap(running.child_ids, old_id, new))
        parent = state.entry(NODES, old.parent)
        if parent is None:
            effects.counts["replacements_unplaced"] += 1
            return None
        revision = state.entry(MERGES, parent.running_revision) if parent.running_revision is not None else None
        if revision is not None:  # a revision of the parent is being made: it takes this change too
            return self._rebuild(state, revision, _swap(revision.child_ids, old_id, new))
        job = ParentJob(node_id=str(NodeId.parse(old.parent).next_revision()), level=parent.node.level,
                        children=[], job=ReduceJob(purpose="merge", entries=[]), replaces=[old.parent])
        state.put(NODES, old.parent, parent.model_copy(update={"running_revision": job.node_id}))
        return self._rebuild(state, job, _swap(parent.node.children, old_id, new))

    def _rebuild(self, state: StateTransaction, job: ParentJob, child_ids: list[str]) -> ParentJob:
        """The merge to make (again) from these children, in this order (empty ones left out)."""
        children = [stored.node for i in child_ids if (stored := state.entry(NODES, i)) is not None
                    and stored.node.item_count]
        for child in children:
            entry = state.entry(NODES, child.node_id)
            state.put(NODES, child.node_id, entry.model_copy(update={"parent": job.node_id}))
        return merge_job(job.node_id, job.level, children, self.merge_target, job.replaces)

    def hold(self, state: StateTransaction, node_ids: list[str]) -> None:
        """Nodes being made again are held: until their replacements arrive, the sweep keeps them, their
        siblings and the merges above them, however long the calls take."""
        for node_id in node_ids:
            stored = state.entry(NODES, node_id)
            if stored is not None and not stored.held:
                state.put(NODES, node_id, stored.model_copy(update={"held": True}))
