"""The merger stage: batch nodes in, the agent's summary tree and its global summary out.

Merges run when a level holds `fan_in` nodes (or as many as fit one request). The global summary is a
merge of the frontier, made only while no merge that will change the frontier is running: on an unbounded
input at most once per `summarization.global_refresh_s` per agent (counted from the agent's previous
global, or from its first node), and once when the input ends; on a bounded input only at its end.
"""

from __future__ import annotations

from flink_memory.config import Config
from flink_memory.llm.client import RequestFactory
from flink_memory.records import DeadLetter, SummaryNode
from flink_memory.stages.calls import Effects, Finished, RetryPolicy, drive
from flink_memory.state import StateModel, StateSchema, StateTransaction, decode_state
from flink_memory.summarize.prompts import child_target
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import ChildRef, Slot, SummaryTree, merge_entry

TREE, CLOCK, NODES, MERGES, GLOBAL = "merger_tree", "merger_clock", "merger_nodes", "merger_merges", "merger_global"
LEGACY_TREE, LEGACY_JOBS = "tree", "jobs"
KEEP = {"all": {"batch", "merge", "global"}, "batch_and_global": {"batch", "global"}, "global_only": {"global"}}


class Clock(StateModel):
    first_node_ms: int | None = None  # when the agent's first node arrived (the first refresh counts from it)
    last_global_ms: int | None = None
    ended: bool = False


class StoredNode(StateModel):
    node: SummaryNode


class ParentJob(StateModel):
    """A merge or global summary being made; children are referenced, their texts are in the job."""

    node_id: str
    level: int = 0
    version: int | None = None
    children: list[ChildRef]
    job: ReduceJob


class MergerCore:
    schema = StateSchema(values={TREE: SummaryTree, CLOCK: Clock, GLOBAL: ParentJob},
                         maps={NODES: StoredNode, MERGES: ParentJob}, legacy_values=(LEGACY_TREE, LEGACY_JOBS))

    def __init__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> None:
        self.config = config
        self.factory = factory
        self.retry = RetryPolicy(config.llm.retry_backoff_s, config.llm.retry_backoff_max_s)
        self.fan_in = config.summarization.fan_in if config.summarization.depth == "hierarchical" else None
        self.keep = KEEP[config.summarization.retention]
        self.refresh_ms = None if bounded else int(config.summarization.global_refresh_s * 1000)
        self.merge_target = child_target(factory.budget, config.summarization.fan_in)

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, payload: str, finished: Finished, now_ms: int) -> Effects:
        node = SummaryNode.model_validate_json(payload)
        tree, clock = self._load(state)
        clock.ended = False
        if clock.first_node_ms is None:
            clock.first_node_ms = now_ms
        effects = Effects()
        self._write(node, effects)
        self._place(state, tree, node, finished, now_ms, effects)
        return self._advance(state, tree, clock, finished, now_ms, effects)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        tree, clock = self._load(state)
        return self._advance(state, tree, clock, finished, now_ms, Effects())

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        tree, clock = self._load(state)
        clock.ended = True
        return self._advance(state, tree, clock, finished, now_ms, Effects())

    def evict(self, state: StateTransaction, reason: str) -> Effects:
        """Running merges and the running global of this agent become dead letters; the tree keeps the rest."""
        effects = Effects()
        tree, clock = self._load(state)
        running = [job for _, job in state.items(MERGES)]
        if (pending := state.get(GLOBAL, ParentJob)) is not None:
            running.append(pending)
        for job in running:
            effects.dead_letters.append(DeadLetter(raw=job.model_dump_json(), reason=reason, stage="internal",
                                                   record_id=job.node_id))
        state.clear_map(MERGES)
        state.set(GLOBAL, None)
        for slots in tree.levels:
            slots[:] = [slot for slot in slots if slot.ready]
        state.set(TREE, tree)
        return effects

    # --- the tree ------------------------------------------------------------------------------------

    def _write(self, node: SummaryNode, effects: Effects) -> None:
        if node.kind in self.keep:
            effects.out.append(node.model_dump_json())

    def _place(self, state: StateTransaction, tree: SummaryTree, node: SummaryNode, finished: Finished,
               now_ms: int, effects: Effects) -> None:
        """A finished node joins the frontier; the merges it completes start (and may finish) at once."""
        state.put(NODES, node.node_id, StoredNode(node=node))
        for start in tree.add(node, self.fan_in, self.factory.budget, lambda i: state.entry(NODES, i).node):
            job = ParentJob(node_id=start.node_id, level=start.level, children=[ChildRef.of(c) for c in start.children],
                            job=ReduceJob(purpose="merge", entries=[merge_entry(c) for c in start.children],
                                          target_tokens=self.merge_target))
            for child in start.children:
                state.put(NODES, child.node_id, None)
            self._run_merge(state, tree, job, finished, now_ms, effects)

    def _run_merge(self, state: StateTransaction, tree: SummaryTree, job: ParentJob, finished: Finished,
                   now_ms: int, effects: Effects) -> None:
        progress = drive(job.job, self.factory, finished, now_ms, self.retry)
        effects.track(progress, job.job)
        if progress.state != "done":
            state.put(MERGES, job.node_id, job)
            return
        state.put(MERGES, job.node_id, None)
        node = self._parent(state.key, job, "merge", progress.value)
        effects.counts["merges"] += 1
        self._write(node, effects)
        self._place(state, tree, node, finished, now_ms, effects)

    def _advance(self, state: StateTransaction, tree: SummaryTree, clock: Clock, finished: Finished, now_ms: int,
                 effects: Effects) -> Effects:
        for key in state.keys(MERGES):
            job = state.entry(MERGES, key)
            if job is not None:  # (a merge finished above may have completed the one after it)
                self._run_merge(state, tree, job, finished, now_ms, effects)
        pending = state.get(GLOBAL, ParentJob)
        if pending is None and tree.needs_global():
            due = self._global_due(clock)
            if due is not None and now_ms >= due:
                pending = self._start_global(state, tree)
            elif due is not None:
                effects.wake(due)
        if pending is not None:
            self._run_global(state, tree, clock, pending, finished, now_ms, effects)
        state.set(TREE, tree)
        state.set(CLOCK, clock)
        return effects

    # --- the global summary --------------------------------------------------------------------------

    def _global_due(self, clock: Clock) -> int | None:
        """When the next global may be made: now at the end of input; on unbounded input after the refresh
        interval; never before the end on a bounded input."""
        if clock.ended:
            return 0
        if self.refresh_ms is None:
            return None
        since = clock.last_global_ms if clock.last_global_ms is not None else clock.first_node_ms
        return (since or 0) + self.refresh_ms

    def _start_global(self, state: StateTransaction, tree: SummaryTree) -> ParentJob:
        frontier = [state.entry(NODES, node_id).node for node_id in tree.frontier()]
        node_id, version = tree.next_global_id()
        return ParentJob(node_id=node_id, version=version, children=[ChildRef.of(n) for n in frontier],
                         job=ReduceJob(purpose="global", entries=[merge_entry(n) for n in frontier]))

    def _run_global(self, state: StateTransaction, tree: SummaryTree, clock: Clock, pending: ParentJob,
                    finished: Finished, now_ms: int, effects: Effects) -> None:
        if len(pending.children) == 1:  # one node is its own global summary: no call needed
            text: str | None = pending.job.entries[0]["text"]
        else:
            progress = drive(pending.job, self.factory, finished, now_ms, self.retry)
            effects.track(progress, pending.job)
            text = progress.value if progress.state == "done" else None
        if text is None:
            state.set(GLOBAL, pending)
            return
        state.set(GLOBAL, None)
        node = self._parent(state.key, pending, "global", text)
        tree.global_done([c.node_id for c in pending.children], node.version or 0)
        clock.last_global_ms = now_ms
        effects.counts["globals"] += 1
        self._write(node, effects)

    def _parent(self, agent_id: str, job: ParentJob, kind: str, text: str) -> SummaryNode:
        firsts = [c.first_ts for c in job.children if c.first_ts]
        lasts = [c.last_ts for c in job.children if c.last_ts]
        level = max(c.level for c in job.children) + 1 if kind == "global" else job.level
        return SummaryNode(
            agent_id=agent_id, node_id=job.node_id, kind=kind, level=level,  # type: ignore[arg-type]
            children=[c.node_id for c in job.children], text=text, item_count=sum(c.item_count for c in job.children),
            first_ts=min(firsts) if firsts else None, last_ts=max(lasts) if lasts else None,
            model=",".join(job.job.models) or self.config.llm.model, prompt_tokens=job.job.prompt_tokens,
            completion_tokens=job.job.completion_tokens, version=job.version, truncated=job.job.truncated,
        )

    # --- state ---------------------------------------------------------------------------------------

    def _load(self, state: StateTransaction) -> tuple[SummaryTree, Clock]:
        tree = state.get(TREE, SummaryTree) or SummaryTree()
        clock = state.get(CLOCK, Clock) or Clock()
        self._migrate(state, tree, clock)
        return tree, clock

    def _migrate(self, state: StateTransaction, tree: SummaryTree, clock: Clock) -> None:
        """Release 0.1.0 kept the tree (with node texts) and the running jobs as two JSON values."""
        old_tree = state.legacy(LEGACY_TREE)
        if old_tree is not None:
            data = decode_state(old_tree, None) or {}
            for level in data.get("levels", []):
                slots = []
                for slot in level:
                    if slot.get("node") is not None:
                        node = SummaryNode.model_validate(slot["node"])
                        state.put(NODES, node.node_id, StoredNode(node=node))
                        slots.append(Slot(node_id=node.node_id, ready=True))
                    else:
                        slots.append(Slot(node_id=slot["job"], ready=False))
                tree.levels.append(slots)
            tree.merges_per_level = list(data.get("merges_per_level", []))
            tree.global_version = int(data.get("global_version", 0))
            tree.global_children = list(data.get("global_children", []))
            state.clear_legacy(LEGACY_TREE)
        old_jobs = state.legacy(LEGACY_JOBS)
        if old_jobs is not None:
            data = decode_state(old_jobs, None) or {}
            for merge in data.get("merges", []):
                state.put(MERGES, merge["node_id"], _legacy_job(merge))
            if data.get("global"):
                state.set(GLOBAL, _legacy_job(data["global"]))
            clock.last_global_ms = data.get("last_global_ms") or None
            clock.first_node_ms = clock.last_global_ms
            state.clear_legacy(LEGACY_JOBS)


def _legacy_job(data: dict) -> ParentJob:
    children = [ChildRef.of(SummaryNode.model_validate(c)) for c in data["children"]]
    return ParentJob(node_id=data["node_id"], level=int(data.get("level", 0)), version=data.get("version"),
                     children=children, job=ReduceJob.model_validate(data["job"]))

