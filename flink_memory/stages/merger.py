"""The merger stage: batch nodes in, the agent's summary tree and its global summary out.

Merges run when a level holds `fan_in` nodes (or as many as fit one request). The global summary is a
merge of the frontier, made only while no merge that will change the frontier is running: on an unbounded
input at most once per `summarization.global_refresh_s` per agent (counted from the agent's previous
global, or from its first node), and once when the input ends; on a bounded input only at its end. Each
global replaces the one before it.

Changes recompute a path, not the memory: a node that replaces another (a batch summarized again after a
retraction) takes its place, and what was merged from it is made again (stages.merger_revisions). Merged
nodes stay in state while any batch below their parent is editable (`memory.editable_for`), so their
siblings' summaries are there to merge again; then only the frontier stays. Forgetting an agent writes an
empty global that replaces every node of the agent written before.

The store follows the agent's memory log: the merges and globals written here, numbered per agent, beside
the batcher's own log of unit rows and batch nodes (flink_memory.memory_log).
"""

from __future__ import annotations

from flink_memory.config import Config
from flink_memory.ids import NodeId
from flink_memory.memory_log import Base, Lineage, Snapshot, log_entry
from flink_memory.records import DeadLetter, SummaryNode
from flink_memory.requests import RequestFactory
from flink_memory.stages.calls import Effects, Finished, Timing, drive
from flink_memory.stages.channels import MEMORY_LOG
from flink_memory.stages.merger_revisions import TreeRevisions
from flink_memory.stages.merger_state import (
    GLOBAL,
    LOG,
    MERGES,
    NODES,
    SCHEDULE,
    SCHEMA,
    TREE,
    LogPosition,
    MergerSchedule,
    ParentJob,
    StoredNode,
    merge_job,
)
from flink_memory.stages.messages import ForgetAgent, HoldNodes, Rebase, StageMessage
from flink_memory.stages.protocol import Culprit, internal_dead_letter
from flink_memory.state import StateTransaction
from flink_memory.state_layout import dump_model
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.rooms import Rooms
from flink_memory.summarize.tree import ChildRef, SummaryTree, merge_entry

JOINED_MODEL = "none (children joined: the merge failed)"  # a merge node's model when no call made its text
KEEP = {"all": {"batch", "merge", "global"}, "batch_and_global": {"batch", "global"}, "global_only": {"global"}}


class MergerCore:
    schema = SCHEMA

    def __init__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> None:
        self.config = config
        self.factory = factory
        self.timing = Timing.from_config(config)
        self.fan_in = config.summarization.fan_in if config.summarization.depth == "hierarchical" else None
        self.keep = KEEP[config.summarization.retention]
        self.refresh_ms = None if bounded else int(config.summarization.global_refresh_s * 1000)
        self.merge_target = Rooms.from_config(config, factory.budget).child_target
        self.revisions = TreeRevisions(self.merge_target)
        self.lineage = Lineage(history=config.job.history, branch=config.job.branch)

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, message: StageMessage, finished: Finished, now_ms: int) -> Effects:
        tree, schedule = self._load(state)
        effects = self._rebase(state, Effects())
        if isinstance(message, Rebase):  # (done above)
            return self._settle(state, tree, schedule, effects)
        if isinstance(message, ForgetAgent):
            self._forget(state, tree, schedule, effects)
            return self._settle(state, tree, schedule, effects)
        if isinstance(message, HoldNodes):
            self.revisions.hold(state, message.node_ids)
            return self._settle(state, tree, schedule, effects)
        if not isinstance(message, SummaryNode):
            raise TypeError(f"the merger takes summary nodes, holds and forgets, not {type(message).__name__}")
        node = message
        schedule.ended = False
        if schedule.first_node_ms is None:
            schedule.first_node_ms = now_ms
        self._send(node, effects)
        self._arrive(state, tree, node, now_ms, finished, effects)
        return self._advance(state, tree, schedule, finished, now_ms, effects)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        tree, schedule = self._load(state)
        effects = self._rebase(state, Effects())
        self._sweep(state, tree, schedule, now_ms)
        return self._advance(state, tree, schedule, finished, now_ms, effects)

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        tree, schedule = self._load(state)
        schedule.ended = True
        return self._advance(state, tree, schedule, finished, now_ms, self._rebase(state, Effects()))

    def evict(self, state: StateTransaction, reason: str, culprit: Culprit | None = None) -> Effects:
        """Running merges, the running global and the node the activation brought become dead letters; each
        merge is made without a call from its children's texts, joined in order (condensed above if long): no
        child drops out, and a revision given up still replaces the merge it remade (retracted facts)."""
        tree, schedule = self._load(state)
        effects = self._rebase(state, Effects())
        if (pending := state.get(GLOBAL)) is not None:
            effects.dead_letters.append(_dead_job(pending, reason, state.key))
            state.set(GLOBAL, None)
        given_up = sorted((job.level, job.node_id) for _, job in state.items(MERGES))
        for _, node_id in given_up:  # lowest first, each as it is now (one below may have rebuilt it)
            job = state.entry(MERGES, node_id)
            if job is None:
                continue
            effects.dead_letters.append(_dead_job(job, reason, state.key))
            state.put(MERGES, node_id, None)
            text = "\n".join(str(entry["text"]) for entry in job.job.entries)
            # (no completion wrote this text: no count of it bounds its line in the merge above, written_bound)
            node = self._parent_node(state.key, job, "merge", text).model_copy(
                update={"model": JOINED_MODEL, "completion_tokens": 0})
            effects.counts["merges_joined"] += 1
            self._send(node, effects)
            self._arrive(state, tree, node, 0, {}, effects)
        if culprit is not None and (brought := culprit.dead_letter(reason, state.key)) is not None:
            effects.dead_letters.append(brought)
        return self._settle(state, tree, schedule, effects)

    # --- the tree ------------------------------------------------------------------------------------

    def _send(self, node: SummaryNode, effects: Effects) -> None:
        if node.kind in self.keep:
            effects.out.append(node)

    def _arrive(self, state: StateTransaction, tree: SummaryTree, node: SummaryNode, now_ms: int,
                finished: Finished, effects: Effects) -> None:
        """A finished node: it replaces the nodes it names, or joins the frontier as a new one."""
        first_arrival = tree.note_id(node.node_id)
        newest = now_ms  # a batch node's children are units, never stored here
        if node.kind != "batch":
            below = [stored.newest_ms for c in node.children if (stored := state.entry(NODES, c)) is not None]
            newest = max(below, default=now_ms)
        if node.replaces:  # (a batch names every revision a replay's first attempt may have written: the
            # ones this tree holds are swapped, or, with none, it is placed once)
            known = [old_id for old_id in node.replaces if state.entry(NODES, old_id) is not None]
            if not known and first_arrival:
                if node.item_count:
                    self._place(state, tree, node, newest, now_ms, finished, effects)
                return
            for old_id in known or node.replaces[:1]:
                then = self.revisions.supersede(state, tree, old_id, node, newest, effects)
                if isinstance(then, SummaryNode):
                    self._place(state, tree, then, newest, now_ms, finished, effects)
                elif then is not None:
                    self._run_merge(state, tree, then, finished, now_ms, effects)
            return
        self._place(state, tree, node, newest, now_ms, finished, effects)

    def _place(self, state: StateTransaction, tree: SummaryTree, node: SummaryNode, newest: int, now_ms: int,
               finished: Finished, effects: Effects) -> None:
        """A new node joins the frontier; the merges it completes start (and may finish) at once."""
        state.put(NODES, node.node_id, StoredNode(node=node, newest_ms=newest))
        self._schedule_sweep(state, now_ms)
        for start in tree.add(node, self.fan_in, self.factory.budget, lambda i: state.entry(NODES, i).node):
            children = [c for c in start.children if c.item_count]
            job = merge_job(start.node_id, start.level, children, self.merge_target)
            for child in start.children:
                stored = state.entry(NODES, child.node_id)
                state.put(NODES, child.node_id, stored.model_copy(update={"parent": start.node_id}))
            self._run_merge(state, tree, job, finished, now_ms, effects)

    def _parent_text(self, job: ParentJob, finished: Finished, now_ms: int, effects: Effects) -> str | None:
        """A merge's or global's text once made (None while its calls run). One child is its own summary and
        none an empty one: no call for either."""
        if len(job.children) <= 1:
            return job.job.entries[0]["text"] if job.children else ""
        progress = drive(job.job, self.factory, finished, now_ms, self.timing.retry)
        effects.track(progress, job.job)
        return progress.value if progress.state == "done" else None

    def _run_merge(self, state: StateTransaction, tree: SummaryTree, job: ParentJob, finished: Finished,
                   now_ms: int, effects: Effects) -> None:
        text = self._parent_text(job, finished, now_ms, effects)
        if text is None:
            state.put(MERGES, job.node_id, job)
            return
        state.put(MERGES, job.node_id, None)
        node = self._parent_node(state.key, job, "merge", text)
        effects.counts["merges"] += 1
        self._send(node, effects)
        self._arrive(state, tree, node, now_ms, finished, effects)

    def _advance(self, state: StateTransaction, tree: SummaryTree, schedule: MergerSchedule, finished: Finished,
                 now_ms: int, effects: Effects) -> Effects:
        for key in state.keys(MERGES):
            job = state.entry(MERGES, key)
            if job is not None:  # (a merge finished above may have completed the one after it)
                self._run_merge(state, tree, job, finished, now_ms, effects)
        pending = state.get(GLOBAL)
        merging = bool(state.keys(MERGES))  # (keys: the merges whose calls still run)
        if pending is None and tree.needs_global() and not (schedule.ended and merging):
            # (at the end of input the global waits for the merges running: made now, it would be made again)
            due = self._global_due(schedule)
            if due is not None and now_ms >= due:
                pending = self._start_global(state, tree)
            elif due is not None:
                effects.wake(due)
        if pending is not None:
            self._run_global(state, tree, schedule, pending, finished, now_ms, effects)
        return self._settle(state, tree, schedule, effects)

    def _settle(self, state: StateTransaction, tree: SummaryTree, schedule: MergerSchedule,
                effects: Effects) -> Effects:
        """The end of every activation: state saved, the merges and globals it wrote numbered into the
        agent's merger log."""
        state.set(TREE, tree)
        state.set(SCHEDULE, schedule)
        effects.sweep(schedule.next_sweep_ms)
        # the merges and globals it wrote (the batcher logs its own nodes)
        written = [n for n in effects.out if isinstance(n, SummaryNode) and n.kind != "batch"]
        if written:
            position = state.get(LOG) or LogPosition()
            lineage = Lineage(history=position.history, branch=position.branch)
            for node in written:
                position.seq += 1
                effects.emit(MEMORY_LOG, log_entry("merger", state.key, position.seq, lineage, node=node))
                if node.kind == "global" and self.lineage.branch:
                    position.current = node
            state.set(LOG, position)
        return effects

    def _rebase(self, state: StateTransaction, effects: Effects) -> Effects:
        """The first activation of an agent in this job's branch opens the branch of its merger log: an entry
        with where the log stood and the nodes this merger holds of the agent (as retention writes them) and its
        last global (stages.batcher.BatcherCore._rebase does the same for the batcher's log)."""
        position = state.get(LOG) or LogPosition()
        if not self.lineage.branch or position.branch == self.lineage.branch:
            return effects
        base = Base(branch=position.branch, seq=position.seq)
        held = [stored.node for _, stored in state.items(NODES) if stored.node.kind in self.keep]
        if position.current is not None and position.current.node_id not in {n.node_id for n in held}:
            held.append(position.current)
        position.history, position.branch = position.history or self.lineage.history, self.lineage.branch
        position.seq += 1
        effects.emit(MEMORY_LOG, log_entry("merger", state.key, position.seq,
                                           Lineage(history=position.history, branch=position.branch), base=base,
                                           snapshot=Snapshot(nodes=held if base.seq else [])))
        state.set(LOG, position)
        return effects

    # --- the global summary --------------------------------------------------------------------------

    def _global_due(self, schedule: MergerSchedule) -> int | None:
        """When the next global may be made: now at the end of input; on unbounded input after the refresh
        interval; never before the end on a bounded input."""
        if schedule.ended:
            return 0
        if self.refresh_ms is None:
            return None
        since = schedule.last_global_ms if schedule.last_global_ms is not None else schedule.first_node_ms
        return (since or 0) + self.refresh_ms

    def _start_global(self, state: StateTransaction, tree: SummaryTree) -> ParentJob:
        frontier = [state.entry(NODES, node_id).node for node_id in tree.frontier()]
        node_id, version = tree.next_global_id()
        return ParentJob(node_id=node_id, version=version, children=[ChildRef.of(n) for n in frontier],
                         replaces=tree.replaced_globals(),
                         job=ReduceJob(purpose="global", entries=[merge_entry(n) for n in frontier]))

    def _run_global(self, state: StateTransaction, tree: SummaryTree, schedule: MergerSchedule, pending: ParentJob,
                    finished: Finished, now_ms: int, effects: Effects) -> None:
        text = self._parent_text(pending, finished, now_ms, effects)
        if text is None:
            state.set(GLOBAL, pending)
            return
        state.set(GLOBAL, None)
        node = self._parent_node(state.key, pending, "global", text)
        if self.keep == KEEP["batch_and_global"] and pending.children:  # its merges are not written: name
            node = node.model_copy(update={"children": tree.live_batch_ids()})  # the batches it covers
        tree.global_done([c.node_id for c in pending.children], node.version or 0)
        schedule.last_global_ms = now_ms
        effects.counts["globals"] += 1
        self._send(node, effects)

    def _parent_node(self, agent_id: str, job: ParentJob, kind: str, text: str) -> SummaryNode:
        firsts = [c.first_ts for c in job.children if c.first_ts]
        lasts = [c.last_ts for c in job.children if c.last_ts]
        level = max((c.level for c in job.children), default=0) + 1 if kind == "global" else job.level
        return SummaryNode(
            agent_id=agent_id, node_id=job.node_id, kind=kind, level=level,  # type: ignore[arg-type]
            children=[c.node_id for c in job.children], text=text, item_count=sum(c.item_count for c in job.children),
            first_ts=min(firsts) if firsts else None, last_ts=max(lasts) if lasts else None,
            model=",".join(job.job.models) or self.config.llm.model, prompt_tokens=job.job.prompt_tokens,
            completion_tokens=job.job.completion_tokens, version=job.version, truncated=job.job.truncated,
            replaces=job.replaces,
        )

    # --- forgetting and bounded state ----------------------------------------------------------------

    def live_ids(self, tree: SummaryTree) -> list[str]:
        """Every node of this agent that may still be live, as kept by retention: the latest revision of each
        batch and merge since the last forget, and the latest global. An older one is already replaced by the
        node that followed it, so a forget's size follows the memory, not how often it was revised."""
        ids = [*tree.live_batch_ids(), *tree.live_merge_ids(), *tree.replaced_globals()]
        return [i for i in ids if NodeId.parse(i).kind in self.keep]

    def _forget(self, state: StateTransaction, tree: SummaryTree, schedule: MergerSchedule, effects: Effects) -> None:
        """An empty global replaces everything written before; only the id counters stay."""
        replaces = self.live_ids(tree)
        for name in (NODES, MERGES):
            state.clear_map(name)
        state.set(GLOBAL, None)
        tree.forget()
        node_id, version = tree.next_global_id()
        tree.global_done([], version)
        node = SummaryNode(agent_id=state.key, node_id=node_id, kind="global", level=1, children=[], text="",
                           item_count=0, model=self.config.llm.model, version=version, replaces=replaces)
        schedule.first_node_ms = schedule.last_global_ms = schedule.next_sweep_ms = None
        effects.counts["agents_forgotten"] += 1
        self._send(node, effects)

    def _schedule_sweep(self, state: StateTransaction, now_ms: int) -> None:
        schedule = state.get(SCHEDULE) or MergerSchedule()
        if schedule.next_sweep_ms is None:
            schedule.next_sweep_ms = self.timing.next_sweep_ms(now_ms)
            state.set(SCHEDULE, schedule)

    def _sweep(self, state: StateTransaction, tree: SummaryTree, schedule: MergerSchedule, now_ms: int) -> None:
        """Drop merged nodes whose parent has no editable batch below it any more (the frontier stays)."""
        if not self.timing.sweep_due(schedule.next_sweep_ms, now_ms):
            return
        nodes = dict(state.items(NODES))
        above_held: set[str] = set()  # merges above a batch or merge being made again: their children stay
        for stored in nodes.values():
            parent = stored.parent if stored.held or stored.running_revision is not None else None
            while parent is not None and parent not in above_held:
                above_held.add(parent)
                parent = nodes[parent].parent if parent in nodes else None
        merged = [(key, stored) for key, stored in nodes.items() if stored.parent is not None]
        for key, stored in merged:
            if stored.parent in above_held or state.entry(MERGES, stored.parent) is not None:
                continue  # (a parent still being made, or made again, may merge it again)
            parent = nodes.get(stored.parent)
            old = parent is not None and now_ms - parent.newest_ms >= self.timing.editable_ms
            if parent is None or (old and parent.running_revision is None):
                state.put(NODES, key, None)
        schedule.next_sweep_ms = self.timing.next_sweep_ms(now_ms) if merged else None

    def _load(self, state: StateTransaction) -> tuple[SummaryTree, MergerSchedule]:
        tree = state.get(TREE) or SummaryTree()
        schedule = state.get(SCHEDULE)
        if schedule is None:  # one object for the whole activation: _schedule_sweep reads it from state again
            schedule = MergerSchedule()
            state.set(SCHEDULE, schedule)
        return tree, schedule


def _dead_job(job: ParentJob, reason: str, agent_id: str) -> DeadLetter:
    return internal_dead_letter(dump_model(job), reason, agent_id, job.node_id)
