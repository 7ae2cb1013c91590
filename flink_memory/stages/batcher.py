"""The batcher stage: memory units in, one batch summary node per batch out, per agent in batch order.

Batches close by count or tokens, at a scale the agent's own first batch report decides (`BatchScale`): a
boundary depends on the input alone, never on when a call ended, so a rerun on the same journal asks the
same requests. On an unbounded input a partial batch also closes `batching.flush_after_s`
after its first unit; on a bounded one it closes when the input ends, never because the job is slow.

Changes: a retracted unit leaves the buffer; or the pending batch it is in, whose summary job is rebuilt and
which then leaves as the revision it would have become had it left first (`batch-000007-r1`); or, when its
batch was already sent, that batch is summarized again from its remaining units and the new node replaces
the old one (stages.batch_revisions, which also seals sent batches after `memory.editable_for`).

Each unit is a store row from the moment it is accepted until it is retracted or dropped (flink_memory.memory_log):
its rows and the batch nodes go, numbered in the order they were decided, into the agent's batcher log
(flink_memory.memory_log.LogEntry), which the store follows.
"""

from __future__ import annotations

from typing import Any

from flink_memory.config import Config
from flink_memory.ids import NodeId
from flink_memory.memory_log import (
    Base,
    Lineage,
    Snapshot,
    UnitRows,
    accepted,
    dropped,
    forgotten,
    log_entry,
)
from flink_memory.records import MemoryUnit
from flink_memory.requests import RequestFactory
from flink_memory.stages.batch_revisions import BatchNodes, BatchRevisions, lineage_of, next_revision
from flink_memory.stages.batcher_state import (
    BATCHES,
    BUFFER,
    DONE,
    HOMES,
    META,
    SCALE,
    SCHEMA,
    UNITS,
    BatcherMeta,
    BatchScale,
    DoneBatch,
    PendingBatch,
    StoredUnit,
    UnitHome,
)
from flink_memory.stages.calls import Effects, Finished, Timing, drive
from flink_memory.stages.channels import MEMORY_LOG
from flink_memory.stages.messages import ForgetAgent, HoldNodes, Rebase, Retract, StageMessage
from flink_memory.stages.protocol import Culprit, internal_dead_letter
from flink_memory.state import StateTransaction
from flink_memory.state import seq_key as _key
from flink_memory.summarize.batching import BatchBuffer, ClosedBatch, unit_entry
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.rooms import Rooms


class BatcherCore:
    schema = SCHEMA

    def __init__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> None:
        self.config = config
        self.factory = factory
        self.limits = Rooms.from_config(config, factory.budget).batch
        self.timing = Timing.from_config(config)
        self.nodes = BatchNodes(config)
        self.revisions = BatchRevisions(factory, self.timing, self.nodes)
        self.flush_ms = None if bounded else int(config.batching.flush_after_s * 1000)
        self.lineage = Lineage(history=config.job.history, branch=config.job.branch)
        calibration = factory.budget.counter.calibration
        self.initial = calibration.initial  # the estimate's upper bound: what a batch packs at before a report
        self.scale_of = calibration.scale_of  # a reported ratio as a scale (margin, steps: settings, not learned)
        self.learns = not factory.budget.counter.exact  # an exact tokenizer has nothing to wait for

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, message: StageMessage, finished: Finished, now_ms: int) -> Effects:
        buffer, meta = self._load(state)
        effects = self._rebase(state, meta, Effects())
        if isinstance(message, Rebase):  # (done above; the merger's log too)
            effects.out.append(message)
            return self._finish(state, buffer, meta, effects, now_ms)
        if isinstance(message, ForgetAgent):
            self._forget(state, buffer, meta, effects)
            return self._finish(state, buffer, meta, effects, now_ms)
        if isinstance(message, Retract):
            self._retract(state, buffer, meta, message.units, finished, now_ms, effects)
            return self._finish(state, buffer, meta, effects, now_ms)
        if not isinstance(message, MemoryUnit):
            raise TypeError(f"the batcher takes memory units, retractions and forgets, not {type(message).__name__}")
        unit = message
        meta.ended = False
        seq = buffer.next_seq
        state.put(UNITS, _key(seq), StoredUnit(unit=unit, arrived_ms=now_ms))
        state.put(HOMES, unit.unit_id, UnitHome(seq=seq, arrived_ms=now_ms))
        effects.counts["units_in"] += 1
        _log_rows(meta, effects, [accepted(unit)])  # searchable now, before its batch is summarized
        scale = self._scale(state)
        summarized = self._release(state, buffer, meta, scale, finished, now_ms, effects)
        for batch in self._pack(state, buffer, meta, scale, unit_entry(unit), now_ms):
            # (only a batch summarized now can let batches leave: the others wait for a wake)
            self._drive(state, batch, finished, now_ms, effects, scale)
            summarized = summarized or batch.text is not None
        return self._finish(state, buffer, meta, effects, now_ms, send=summarized)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        buffer, meta = self._load(state)
        effects = self._rebase(state, meta, Effects())
        scale = self._scale(state)
        self._release(state, buffer, meta, scale, finished, now_ms, effects)
        for _, batch in state.items(BATCHES):
            if batch.text is None:
                self._drive(state, batch, finished, now_ms, effects, scale)
        self._release(state, buffer, meta, scale, finished, now_ms, effects)  # (a report that came just now)
        due = self._flush_due(buffer, meta)
        if buffer.count and due is not None and now_ms >= due and not buffer.held:
            if (flushed := self._close(state, meta, scale, buffer.take())) is not None:
                self._drive(state, flushed, finished, now_ms, effects, scale)
        for seq in list(meta.resummarizing):
            self.revisions.resummarize(state, meta, state.entry(DONE, _key(seq)), finished, now_ms, effects)
        self.revisions.sweep(state, meta, now_ms)
        return self._finish(state, buffer, meta, effects, now_ms)

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        _, meta = self._load(state)
        meta.ended = True
        state.set(META, meta)
        return self.on_wake(state, finished, now_ms)

    def evict(self, state: StateTransaction, reason: str, culprit: Culprit | None = None) -> Effects:
        """Buffered units and unsummarized batches of this agent become dead letters, and so does the record
        the activation brought (any of them may be the culprit); the rest goes on.

        A batch being summarized again (after a change) gives up too: its remaining units become dead
        letters and an empty node replaces it, so no retracted text stays live and no failing job stays."""
        buffer, meta = self._load(state)
        effects = self._rebase(state, meta, Effects())
        gone: list[MemoryUnit] = []
        for seq in list(meta.resummarizing):
            meta.resummarizing.remove(seq)
            done = state.entry(DONE, _key(seq))
            if done is None:
                continue
            for unit in done.units:
                state.put(HOMES, unit.unit_id, None)
            revision, replaces = next_revision(done)
            _drop(meta, effects, done.units, reason)
            self.nodes.send(meta, effects, self.nodes.make(state.key, seq, revision, [], "", None, replaces))
            state.put(DONE, _key(seq), None)
        for key, stored in state.items(UNITS):
            gone.append(stored.unit)
            state.put(UNITS, key, None)
            state.put(HOMES, stored.unit.unit_id, None)
        for key, batch in state.items(BATCHES):
            if batch.text is None:  # it leaves as an empty node, replacing whatever a first attempt wrote
                for unit in batch.units:
                    gone.append(unit)
                    state.put(HOMES, unit.unit_id, None)
                state.put(BATCHES, key, batch.model_copy(update={"units": [], "text": "",
                                                                 "revision": batch.revision + 1}))
        buffer.take()
        if (scale := self._scale(state)).awaiting is not None:  # (the batch it awaited left unsummarized)
            state.set(SCALE, scale.model_copy(update={"awaiting": None}))
        _drop(meta, effects, gone, reason)
        self._send_ready(state, meta, effects)
        if culprit is not None and (brought := culprit.dead_letter(reason, state.key)) is not None:
            effects.dead_letters.append(brought)
        return self._finish(state, buffer, meta, effects, 0)

    # --- batches -------------------------------------------------------------------------------------

    def _release(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, scale: BatchScale,
                 finished: Finished, now_ms: int, effects: Effects) -> bool:
        """Units held for the agent's first batch report are packed once it has come (or once the batch they
        waited for is gone); True when a batch this closed is already summarized (a journal hit)."""
        if not buffer.held or self._opening(scale) is None:
            return False
        entries = [None if (stored := state.entry(UNITS, _key(seq))) is None else unit_entry(stored.unit)
                   for seq in range(buffer.first, buffer.next_seq)]
        opened_at = buffer.unpack()
        if opened_at is not None:  # (what holding cost: the first held unit waited that long)
            effects.counts["first_report_wait_ms"] += max(0, now_ms - opened_at)
        summarized = False
        for entry in entries:
            for batch in self._pack(state, buffer, meta, scale, entry, now_ms):
                self._drive(state, batch, finished, now_ms, effects, scale)
                summarized = summarized or batch.text is not None
        if buffer.count and opened_at is not None:  # (the units left over arrived that long ago)
            buffer.opened_at_ms = min(opened_at, buffer.opened_at_ms or opened_at)
        return summarized

    def _scale(self, state: StateTransaction) -> BatchScale:
        return state.get(SCALE) or BatchScale()

    def _opening(self, scale: BatchScale) -> float | None:
        """The scale a batch opened now packs at: the agent's learned one; the upper bound for its first
        batch; None (hold its units) while the first batch's report is awaited."""
        if not self.learns:
            return self.initial
        if scale.scale is not None:
            return scale.scale
        return self.initial if scale.awaiting is None else None

    def _pack(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, scale: BatchScale,
              entry: dict[str, Any] | None, now_ms: int) -> list[PendingBatch]:
        """One entry (None: a gap) into the open batch; returns the batches this closes."""
        closed = []
        if entry is not None and not buffer.fits(entry, self.limits, self.factory.budget):
            closed.append(self._close(state, meta, scale, buffer.take()))
        taken = buffer.put(entry, self.limits, now_ms, self.factory.budget, self._opening(scale))
        if taken is not None:
            closed.append(self._close(state, meta, scale, taken))
        return [batch for batch in closed if batch is not None]

    def _close(self, state: StateTransaction, meta: BatcherMeta, scale: BatchScale,
               taken: ClosedBatch) -> PendingBatch | None:
        """A decided boundary: the batch goes to be summarized; the agent's first one is awaited."""
        batch = self._open_batch(state, meta, taken)
        if batch is not None and self.learns and scale.scale is None and scale.awaiting is None:
            scale.awaiting = batch.seq
            state.set(SCALE, scale)
        return batch

    def _learn(self, state: StateTransaction, scale: BatchScale, batch: PendingBatch) -> None:
        """The awaited batch's first round has reported: later batches pack at what it taught (the upper
        bound when the provider reports no usage)."""
        if scale.awaiting != batch.seq or scale.scale is not None:
            return
        if batch.job.own_ratio is not None:
            scale.scale = self.scale_of(batch.job.own_ratio)
        elif batch.text is not None:
            scale.scale = self.initial
        else:
            return
        scale.awaiting = None
        state.set(SCALE, scale)

    def _load(self, state: StateTransaction) -> tuple[BatchBuffer, BatcherMeta]:
        return state.get(BUFFER) or BatchBuffer(), state.get(META) or BatcherMeta()

    def _rebase(self, state: StateTransaction, meta: BatcherMeta, effects: Effects) -> Effects:
        """The first activation of an agent in this job's branch (a fresh start, or any restore) opens the branch
        of its log: an entry with where the log stood and the units this batcher holds of the agent (each with
        the batch node covering it), so the store can drop what an abandoned branch applied after that point,
        and a new store needs nothing written before."""
        if not self.lineage.branch or meta.branch == self.lineage.branch:
            return effects
        base = Base(branch=meta.branch, seq=meta.log_seq)
        held: list[tuple[MemoryUnit, str | None]] = [(stored.unit, None) for _, stored in state.items(UNITS)]
        held += [(unit, None) for _, batch in state.items(BATCHES) for unit in batch.units]
        held += [(unit, done.live) for _, done in state.items(DONE) for unit in done.units]
        meta.history, meta.branch = meta.history or self.lineage.history, self.lineage.branch
        meta.log_seq += 1
        effects.emit(MEMORY_LOG, log_entry("batcher", state.key, meta.log_seq, lineage_of(meta), base=base,
                                           snapshot=Snapshot(units=held)))
        return effects

    def _flush_due(self, buffer: BatchBuffer, meta: BatcherMeta) -> int | None:
        """When the open batch must close: now at the end of input, after the timeout on unbounded input."""
        if meta.ended:
            return 0
        if self.flush_ms is None or buffer.opened_at_ms is None:
            return None
        return buffer.opened_at_ms + self.flush_ms

    def _open_batch(self, state: StateTransaction, meta: BatcherMeta, taken: ClosedBatch) -> PendingBatch | None:
        units, arrivals = [], []
        for seq in taken.seqs:
            stored = state.entry(UNITS, _key(seq))
            if stored is not None:  # (a unit retracted while buffered left a gap)
                units.append(stored.unit)
                arrivals.append(stored.arrived_ms)
                state.put(UNITS, _key(seq), None)
        if not units:
            return None
        batch = self._pending(meta.next_batch, units, taken.scale)
        for i, unit in enumerate(units):
            if arrivals[i] is None:
                home = state.entry(HOMES, unit.unit_id)
                arrivals[i] = home.arrived_ms if home else 0
            state.put(HOMES, unit.unit_id, UnitHome(batch=batch.seq, arrived_ms=arrivals[i]))
        batch.newest_ms = max(arrivals)
        meta.next_batch += 1
        state.put(BATCHES, _key(batch.seq), batch)
        return batch

    def _pending(self, seq: int, units: list[MemoryUnit], scale: float | None = None) -> PendingBatch:
        stamps = sorted(u.ts for u in units if u.ts)
        return PendingBatch(seq=seq, units=units, first_ts=stamps[0] if stamps else None,
                            last_ts=stamps[-1] if stamps else None, job=self._job(units, scale))

    def _job(self, units: list[MemoryUnit], scale: float | None = None) -> ReduceJob:
        """The batch's summary job, packed at the scale its units were batched with (None: the upper bound)."""
        return ReduceJob(purpose="batch", entries=[unit_entry(u) for u in units],
                         target_tokens=self.limits.target_tokens, scale=scale)

    def _drive(self, state: StateTransaction, batch: PendingBatch, finished: Finished, now_ms: int,
               effects: Effects, scale: BatchScale) -> None:
        progress = drive(batch.job, self.factory, finished, now_ms, self.timing.retry)
        effects.track(progress, batch.job)
        if progress.state == "done":
            batch.text = progress.value
        state.put(BATCHES, _key(batch.seq), batch)
        self._learn(state, scale, batch)

    def _send_ready(self, state: StateTransaction, meta: BatcherMeta, effects: Effects, now_ms: int = 0) -> None:
        """Finished batches leave in batch order, so the tree downstream sees a stable chronology."""
        while meta.next_emit < meta.next_batch:
            batch = state.entry(BATCHES, _key(meta.next_emit))
            if batch is None:  # every unit of it was retracted before it was summarized
                meta.next_emit += 1
                continue
            if batch.text is None:
                break
            # (a replay may have left any earlier revision in a store written ahead of the changelog)
            replaces = [str(NodeId.batch(batch.seq, r)) for r in range(batch.revision)]
            node = self.nodes.make(state.key, batch.seq, batch.revision, batch.units, batch.text,
                                   batch.job if batch.units else None, replaces)
            self.nodes.send(meta, effects, node)
            effects.counts["batches"] += 1 if batch.units else 0
            state.put(BATCHES, _key(batch.seq), None)
            if batch.units:
                newest = batch.newest_ms
                if newest is None:
                    newest = max((state.entry(HOMES, u.unit_id) or UnitHome()).arrived_ms for u in batch.units)
                state.put(DONE, _key(batch.seq), DoneBatch(seq=batch.seq, units=batch.units, live=node.node_id,
                                                           revision=batch.revision, newest_ms=newest or now_ms))
            if meta.next_sweep_ms is None:
                meta.next_sweep_ms = self.timing.next_sweep_ms(now_ms)
            meta.next_emit += 1

    # --- changes -------------------------------------------------------------------------------------

    def _retract(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, unit_ids: list[str],
                 finished: Finished, now_ms: int, effects: Effects) -> None:
        """Take units out wherever they are; batches already sent are summarized again without them."""
        scale = self._scale(state)
        touched_pending: set[int] = set()
        touched_done: set[int] = set()
        gone: list[str] = []  # (their rows leave the store at once)
        for unit_id in unit_ids:
            home = state.entry(HOMES, unit_id)
            if home is None:
                effects.counts["retractions_unknown"] += 1
                continue
            state.put(HOMES, unit_id, None)
            effects.counts["units_retracted"] += 1
            gone.append(unit_id)
            if home.batch is None:
                state.put(UNITS, _key(home.seq), None)
                continue
            for name, touched in ((BATCHES, touched_pending), (DONE, touched_done)):  # pending, else sent
                batch = state.entry(name, _key(home.batch))
                if batch is not None:
                    batch.units = [u for u in batch.units if u.unit_id != unit_id]
                    state.put(name, _key(home.batch), batch)
                    touched.add(home.batch)
                    break
        _log_rows(meta, effects, dropped(state.key, gone))
        for seq in sorted(touched_pending):  # (the call in flight for the old content is ignored)
            pending = state.entry(BATCHES, _key(seq))
            rebuilt = self._pending(seq, pending.units, pending.job.scale)
            rebuilt.revision = pending.revision + 1
            if not pending.units:  # it leaves as an empty node, as a sent batch with no unit left does
                rebuilt.text = ""
                state.put(BATCHES, _key(seq), rebuilt)
                if scale.awaiting == seq:  # (the awaited batch is gone: the next one closed tells)
                    scale.awaiting = None
                    state.set(SCALE, scale)
                continue
            state.put(BATCHES, _key(seq), rebuilt)
            self._drive(state, rebuilt, finished, now_ms, effects, scale)
        self._release(state, buffer, meta, scale, finished, now_ms, effects)  # (the units a gone batch held)
        for seq in sorted(touched_done):
            done = state.entry(DONE, _key(seq))
            done.job = self._job(done.units, scale.scale or self.initial) if done.units else None
            # one more for this change (one retraction message); a revision running in state from release
            # 0.2.0 (no target kept) already stands for one
            done.target = max(done.target, done.revision + (1 if seq in meta.resummarizing else 0)) + 1
            if seq not in meta.resummarizing:
                meta.resummarizing.append(seq)
                effects.out.append(HoldNodes(node_ids=[done.live]))
            self.revisions.resummarize(state, meta, done, finished, now_ms, effects)
        self._send_ready(state, meta, effects, now_ms)

    def _forget(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, effects: Effects) -> None:
        """Everything of the agent goes; batch numbers go on, so no node id is ever used twice."""
        for name in (UNITS, BATCHES, HOMES, DONE):
            state.clear_map(name)
        state.set(SCALE, None)
        buffer.take()
        meta.next_emit, meta.resummarizing, meta.ended, meta.next_sweep_ms = meta.next_batch, [], False, None
        _log_rows(meta, effects, [forgotten(state.key)])
        effects.out.append(ForgetAgent())

    # --- the end of an activation ------------------------------------------------------------------

    def _finish(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, effects: Effects,
                now_ms: int, *, send: bool = True) -> Effects:
        if send:
            self._send_ready(state, meta, effects, now_ms)
        due = self._flush_due(buffer, meta)
        if buffer.count and due is not None and not buffer.held:  # (held: the awaited call's end wakes it)
            effects.wake(max(due, now_ms))
        effects.sweep(meta.next_sweep_ms)
        state.set(BUFFER, buffer if buffer.count or buffer.first else None)
        state.set(META, meta)
        return effects


def _log_rows(meta: BatcherMeta, effects: Effects, messages: list[UnitRows]) -> None:
    """Unit rows, numbered, into the agent's batcher log (and from there, at once, the store), in the order of
    the batch nodes this batcher logs."""
    for message in messages:
        meta.log_seq += 1
        numbered = {"seq": meta.log_seq, "history": meta.history, "branch": meta.branch}
        effects.emit(MEMORY_LOG, log_entry("batcher", message.agent_id, meta.log_seq, lineage_of(meta),
                                           units=message.model_copy(update=numbered)))


def _drop(meta: BatcherMeta, effects: Effects, units: list[MemoryUnit], reason: str) -> None:
    """Units evicted: dead letters, and out of the store."""
    for unit in units:
        effects.dead_letters.append(internal_dead_letter(unit.model_dump_json(), reason, unit.agent_id, unit.source_id))
    if units:
        _log_rows(meta, effects, dropped(units[0].agent_id, [unit.unit_id for unit in units]))
