"""The batcher stage: memory units in, one batch summary node per batch out, per agent in batch order.

Batches close by count or tokens. On an unbounded input a partial batch also closes `batching.flush_after_s`
after its first unit; on a bounded one it closes when the input ends, never because the job is slow.
"""

from __future__ import annotations

from flink_memory.config import Config
from flink_memory.llm.client import RequestFactory
from flink_memory.records import DeadLetter, MemoryUnit, SummaryNode
from flink_memory.stages.calls import Effects, Finished, RetryPolicy, drive
from flink_memory.state import StateModel, StateSchema, StateTransaction, decode_state
from flink_memory.summarize.batching import BatchBuffer, BatchLimits, unit_entry
from flink_memory.summarize.reduce import ReduceJob

BUFFER, UNITS, META, BATCHES = "batcher_buffer", "batcher_units", "batcher_meta", "batcher_batches"
LEGACY_BUFFER, LEGACY_PENDING = "buffer", "pending"


class BatcherMeta(StateModel):
    next_batch: int = 1  # sequence number of the next batch (node id batch-NNNNNN)
    next_emit: int = 1  # batches leave in order: the next one to emit
    ended: bool = False  # the input ended: close what is open, do not wait for timeouts


class PendingBatch(StateModel):
    seq: int
    units: list[str]
    first_ts: str | None = None
    last_ts: str | None = None
    job: ReduceJob
    text: str | None = None  # set once summarized; the node leaves when the batches before it have


def _key(seq: int) -> str:
    return f"{seq:012d}"


class StoredUnit(StateModel):
    unit: MemoryUnit


class BatcherCore:
    schema = StateSchema(values={BUFFER: BatchBuffer, META: BatcherMeta},
                         maps={UNITS: StoredUnit, BATCHES: PendingBatch},
                         legacy_values=(LEGACY_BUFFER, LEGACY_PENDING))

    def __init__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> None:
        self.config = config
        self.factory = factory
        self.limits = BatchLimits.from_config(config, factory.budget)
        self.retry = RetryPolicy(config.llm.retry_backoff_s, config.llm.retry_backoff_max_s)
        self.flush_ms = None if bounded else int(config.batching.flush_after_s * 1000)

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, payload: str, finished: Finished, now_ms: int) -> Effects:
        unit = MemoryUnit.model_validate_json(payload)
        buffer, meta = self._load(state)
        meta.ended = False
        state.put(UNITS, _key(buffer.next_seq), StoredUnit(unit=unit))
        effects = Effects()
        effects.counts["units_in"] += 1
        opened = [self._open_batch(state, meta, taken) for taken in
                  buffer.add(unit_entry(unit), self.limits, now_ms, self.factory.budget)]
        for batch in opened:
            self._drive(state, batch, finished, now_ms, effects)
        return self._finish(state, buffer, meta, effects, now_ms)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        buffer, meta = self._load(state)
        effects = Effects()
        due = self._flush_due(buffer, meta)
        if buffer.count and due is not None and now_ms >= due:
            self._open_batch(state, meta, buffer.take())
        for _, batch in state.items(BATCHES):
            if batch.text is None:
                self._drive(state, batch, finished, now_ms, effects)
        self._emit(state, meta, effects)
        return self._finish(state, buffer, meta, effects, now_ms)

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        _, meta = self._load(state)
        meta.ended = True
        state.set(META, meta)
        return self.on_wake(state, finished, now_ms)

    def evict(self, state: StateTransaction, reason: str) -> Effects:
        """Buffered units and unsummarized batches of this agent become dead letters; the rest goes on."""
        effects = Effects()
        for key, stored in state.items(UNITS):
            effects.dead_letters.append(_dead_unit(stored.unit, reason))
            state.put(UNITS, key, None)
        for key, batch in state.items(BATCHES):
            if batch.text is None:
                effects.dead_letters.append(DeadLetter(raw=batch.model_dump_json(), reason=reason, stage="internal",
                                                       record_id=",".join(batch.units)))
                state.put(BATCHES, key, None)
        buffer, meta = self._load(state)
        buffer.take()
        state.set(BUFFER, buffer)
        self._emit(state, meta, effects, skip_missing=True)
        state.set(META, meta)
        return effects

    # --- helpers -------------------------------------------------------------------------------------

    def _load(self, state: StateTransaction) -> tuple[BatchBuffer, BatcherMeta]:
        buffer = state.get(BUFFER, BatchBuffer) or BatchBuffer()
        meta = state.get(META, BatcherMeta) or BatcherMeta()
        self._migrate(state, buffer, meta)
        return buffer, meta

    def _flush_due(self, buffer: BatchBuffer, meta: BatcherMeta) -> int | None:
        """When the open batch must close: now at the end of input, after the timeout on unbounded input."""
        if meta.ended:
            return 0
        if self.flush_ms is None or buffer.opened_at_ms is None:
            return None
        return buffer.opened_at_ms + self.flush_ms

    def _open_batch(self, state: StateTransaction, meta: BatcherMeta, taken: range) -> PendingBatch:
        units = []
        for seq in taken:
            units.append(state.entry(UNITS, _key(seq)).unit)
            state.put(UNITS, _key(seq), None)
        stamps = sorted(u.ts for u in units if u.ts)
        batch = PendingBatch(seq=meta.next_batch, units=[u.unit_id for u in units],
                             first_ts=stamps[0] if stamps else None, last_ts=stamps[-1] if stamps else None,
                             job=ReduceJob(purpose="batch", entries=[unit_entry(u) for u in units],
                                           target_tokens=self.limits.target_tokens))
        meta.next_batch += 1
        state.put(BATCHES, _key(batch.seq), batch)
        return batch

    def _drive(self, state: StateTransaction, batch: PendingBatch, finished: Finished, now_ms: int,
               effects: Effects) -> None:
        progress = drive(batch.job, self.factory, finished, now_ms, self.retry)
        effects.track(progress, batch.job)
        if progress.state == "done":
            batch.text = progress.value
        state.put(BATCHES, _key(batch.seq), batch)

    def _emit(self, state: StateTransaction, meta: BatcherMeta, effects: Effects, skip_missing: bool = False) -> None:
        """Finished batches leave in batch order, so the tree downstream sees a stable chronology."""
        while meta.next_emit < meta.next_batch:
            batch = state.entry(BATCHES, _key(meta.next_emit))
            if batch is None and skip_missing:
                meta.next_emit += 1
                continue
            if batch is None or batch.text is None:
                break
            job = batch.job
            node = SummaryNode(
                agent_id=state.key, node_id=f"batch-{batch.seq:06d}", kind="batch", level=1, children=batch.units,
                text=batch.text, item_count=len(batch.units), first_ts=batch.first_ts, last_ts=batch.last_ts,
                model=",".join(job.models) or self.config.llm.model, prompt_tokens=job.prompt_tokens,
                completion_tokens=job.completion_tokens, truncated=job.truncated,
            )
            effects.out.append(node.model_dump_json())
            effects.counts["batches"] += 1
            state.put(BATCHES, _key(batch.seq), None)
            meta.next_emit += 1

    def _finish(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta, effects: Effects,
                now_ms: int) -> Effects:
        self._emit(state, meta, effects)
        due = self._flush_due(buffer, meta)
        if buffer.count and due is not None:
            effects.wake(max(due, now_ms))
        state.set(BUFFER, buffer if buffer.count or buffer.first else None)
        state.set(META, meta)
        return effects

    def _migrate(self, state: StateTransaction, buffer: BatchBuffer, meta: BatcherMeta) -> None:
        """Release 0.1.0 kept the buffer and the pending batches as two JSON values: move them into the maps."""
        old_buffer = state.legacy(LEGACY_BUFFER)
        if old_buffer is not None:
            data = decode_state(old_buffer, None) or {}
            for unit in data.get("units", []):
                state.put(UNITS, _key(buffer.next_seq), StoredUnit(unit=MemoryUnit.model_validate(unit)))
                buffer.count += 1
                buffer.last = unit_entry(unit)
            buffer.tokens = int(data.get("tokens", 0))
            buffer.opened_at_ms = data.get("opened_at_ms")
            state.clear_legacy(LEGACY_BUFFER)
            state.set(BUFFER, buffer)
        old_pending = state.legacy(LEGACY_PENDING)
        if old_pending is not None:
            data = decode_state(old_pending, None) or {}
            meta.next_batch = int(data.get("next_seq", 1))
            seqs = [int(b["seq"]) for b in data.get("batches", [])]
            meta.next_emit = min(seqs) if seqs else meta.next_batch
            for old in data.get("batches", []):
                stamps = old.get("ts") or []
                state.put(BATCHES, _key(int(old["seq"])), PendingBatch(
                    seq=int(old["seq"]), units=old["units"], first_ts=stamps[0] if stamps else None,
                    last_ts=stamps[-1] if stamps else None, job=ReduceJob.model_validate(old["job"]),
                    text=old.get("text")))
            state.clear_legacy(LEGACY_PENDING)
            state.set(META, meta)


def _dead_unit(unit: MemoryUnit, reason: str) -> DeadLetter:
    return DeadLetter(raw=unit.model_dump_json(), reason=reason, stage="internal", agent_id=unit.agent_id,
                      record_id=unit.source_id)

