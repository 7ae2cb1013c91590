"""The chunk-planner stage: records in, memory units and manifests out, per agent and in input order.

A record behind a conversation that is still being planned waits in the agent's queue, so units leave in
input order and batch membership never depends on LLM timing. Plans that cost a call are kept by input
digest with their verified manifests, so a compatible retry reuses them; a duplicate id with identical
content is accounted for as a dead letter instead of being summarized twice.
"""

from __future__ import annotations

import json

from flink_memory.chunking.core import InvalidPlan, materialize
from flink_memory.chunking.manifest import (
    ManifestMismatch,
    PolicyChanged,
    load_verified,
    manifest_json,
    verify_chunks,
)
from flink_memory.chunking.planner import ChunkPlanner, PlanJob, PlanTask, Prepared, Routed, prepare
from flink_memory.config import Config
from flink_memory.digests import digest
from flink_memory.llm.client import RequestFactory
from flink_memory.records import Conversation, DeadLetter, InputRecord, record_from_json
from flink_memory.stages.calls import Effects, Finished, RetryPolicy, drive
from flink_memory.state import StateModel, StateSchema, StateTransaction, decode_state

HEAD, QUEUE, SOURCES, PLANS = "planner_head", "planner_queue", "sources", "plans"
LEGACY_QUEUE = "queue"


class QueueHead(StateModel):
    first: int = 0  # sequence number of the record being handled
    next: int = 0  # sequence number the next record gets


class QueuedRecord(StateModel):
    payload: str  # the record's JSON, as parsed
    checked: bool = False  # stored plan and duplicate checks done
    job: PlanJob | None = None


def _key(seq: int) -> str:
    return f"{seq:012d}"


def _dead(record: InputRecord, reason: str, stage: str) -> DeadLetter:
    return DeadLetter(raw=json.dumps(record.model_dump(mode="json"), ensure_ascii=False), reason=reason,
                      stage=stage, agent_id=record.agent_id, record_id=record.id)  # type: ignore[arg-type]


def item_digest(record: InputRecord) -> str:
    """Content digest of a record that needs no plan (what a re-delivery is compared by)."""
    return digest(record.model_dump(mode="json", exclude={"ts", "metadata"}))


class PlannerCore:
    schema = StateSchema(values={HEAD: QueueHead}, maps={QUEUE: QueuedRecord, SOURCES: None, PLANS: None},
                         legacy_values=(LEGACY_QUEUE,))

    def __init__(self, config: Config, factory: RequestFactory) -> None:
        self.config = config
        self.planner = ChunkPlanner(config, factory)
        self.retry = RetryPolicy(config.llm.retry_backoff_s, config.llm.retry_backoff_max_s)
        self.raise_on_failure = config.chunking.on_planner_failure == "raise"
        spec = config.job.inject_failure or ""
        self.poison = tuple(spec.removeprefix("record:").split("/", 1)) if spec.startswith("record:") else None

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, payload: str, finished: Finished, now_ms: int) -> Effects:
        head = self._head(state)
        state.put(QUEUE, _key(head.next), QueuedRecord(payload=payload))
        head.next += 1
        return self._drain(state, head, finished, now_ms)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        return self._drain(state, self._head(state), finished, now_ms)

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        return self.on_wake(state, finished, now_ms)

    def evict(self, state: StateTransaction, reason: str) -> Effects:
        """The record at the head of the queue becomes a dead letter (an error of ours kept repeating on it);
        the records behind it go on."""
        head = self._head(state)
        effects = Effects()
        if head.first < head.next:
            entry = state.entry(QUEUE, _key(head.first))
            record = record_from_json(json.loads(entry.payload))
            effects.dead_letters.append(_dead(record, reason, "internal"))
            state.put(QUEUE, _key(head.first), None)
            head.first += 1
        state.set(HEAD, head if head.first < head.next else None)
        return effects

    def _head(self, state: StateTransaction) -> QueueHead:
        head = state.get(HEAD, QueueHead) or QueueHead()
        legacy = state.legacy(LEGACY_QUEUE)
        if legacy is not None:  # release 0.1.0 kept the queue as one list of the same fields
            for entry in decode_state(legacy, []):
                job = PlanJob.model_validate(entry["job"]) if entry.get("job") else None
                state.put(QUEUE, _key(head.next), QueuedRecord(payload=entry["payload"],
                                                               checked=bool(entry.get("checked")), job=job))
                head.next += 1
            state.clear_legacy(LEGACY_QUEUE)
        return head

    def _drain(self, state: StateTransaction, head: QueueHead, finished: Finished, now_ms: int) -> Effects:
        effects = Effects()
        while head.first < head.next:
            entry = state.entry(QUEUE, _key(head.first))
            if not self._handle(state, entry, finished, now_ms, effects):
                state.put(QUEUE, _key(head.first), entry)
                break
            state.put(QUEUE, _key(head.first), None)
            head.first += 1
        state.set(HEAD, head if head.first < head.next else None)
        return effects

    # --- one record ----------------------------------------------------------------------------------

    def _handle(self, state: StateTransaction, entry: QueuedRecord, finished: Finished, now_ms: int,
                effects: Effects) -> bool:
        """Handle the record at the head of the queue; False while it waits for the planner."""
        record = record_from_json(json.loads(entry.payload))
        if self.poison == (record.agent_id, record.id):
            raise RuntimeError(f"injected failure for record {record.agent_id}/{record.id} (job.inject_failure)")
        if not self.planner.needs_llm(record):
            routed = self.planner.route(record)
            if not self._accept(state, record, routed.manifest.input_digest if routed.manifest else None, effects):
                return True
            self._emit(state, routed, effects)
            return True
        assert isinstance(record, Conversation)
        prepared = prepare(record)
        if not entry.checked:
            stored = state.entry(PLANS, prepared.input_digest)
            reused = self._reuse(record, prepared, stored) if stored is not None else None
            if isinstance(reused, DeadLetter):
                effects.dead_letters.append(reused)
                effects.counts["manifest_verification_failures"] += 1
                return True
            if not self._accept(state, record, prepared.input_digest, effects):
                return True
            if reused is not None:
                effects.counts["plans_reused"] += 1
                self._emit(state, reused, effects, store=False)
                return True
            entry.checked = True
        job = entry.job or PlanJob()
        entry.job = job
        try:
            progress = drive(job, PlanTask(self.planner, prepared), finished, now_ms, self.retry)
        except InvalidPlan as exc:
            return self._failed(state, record, prepared, f"invalid planner output: {exc}", job, effects)
        effects.track(progress, job)
        if progress.state == "done":
            effects.counts["plans_made"] += 1
            self._emit(state, self.planner.finish(record, prepared, progress.value, "semantic", calls=job.calls),
                       effects)
            return True
        if progress.state == "failed":
            return self._failed(state, record, prepared, f"planner call failed: {progress.error}", job, effects)
        return False

    def _failed(self, state: StateTransaction, record: Conversation, prepared: Prepared, reason: str, job: PlanJob,
                effects: Effects) -> bool:
        """`chunking.on_planner_failure`: fixed chunks with the reason, or a dead letter (`raise`).

        A record refused under `raise` is forgotten, so the same record sent again is planned again.
        """
        if self.raise_on_failure:
            effects.dead_letters.append(_dead(record, reason, "plan"))
            state.put(SOURCES, record.id, None)
            return True
        effects.counts["plan_fallbacks"] += 1
        self._emit(state, self.planner.fallback(record, prepared, reason, job.calls), effects)
        return True

    def _accept(self, state: StateTransaction, record: InputRecord, input_digest: str | None,
                effects: Effects) -> bool:
        """Remember the record's content; an id seen with identical content is a duplicate (dead letter)."""
        content = input_digest or item_digest(record)
        previous = state.entry(SOURCES, record.id)
        if previous == content:  # (release 0.1.0 marked records refused under `raise` as "rejected:...")
            effects.dead_letters.append(_dead(record, "duplicate: this id was already accepted with identical "
                                                      "content", "duplicate"))
            return False
        state.put(SOURCES, record.id, content)
        return True

    def _reuse(self, record: Conversation, prepared: Prepared, stored: str) -> Routed | DeadLetter | None:
        """A verified stored plan, None when the policy changed, a dead letter when verification fails."""
        try:
            manifest = load_verified(stored, input_digest=prepared.input_digest,
                                     policy_fingerprint=self.planner.fingerprint)
            routed = self.planner.finish(record, prepared, manifest.boundaries, manifest.method, manifest.reason,
                                         calls=0)
            assert routed.manifest is not None
            boundaries = [c.end for c in routed.manifest.chunks]
            chunks = materialize(prepared.messages, prepared.exchanges, boundaries, prepared.costs, 10**12)
            verify_chunks(manifest, [{"messages": c["messages"]} for c in chunks])
        except PolicyChanged:
            return None
        except ManifestMismatch as exc:
            return _dead(record, f"stored chunk plan failed verification, not reused: {exc}", "plan")
        return routed

    def _emit(self, state: StateTransaction, routed: Routed, effects: Effects, store: bool = True) -> None:
        if routed.manifest is not None:
            text = manifest_json(routed.manifest)
            if store and routed.manifest.method in ("semantic", "fallback"):  # the ones that cost a call
                state.put(PLANS, routed.manifest.input_digest, text)
            effects.manifests.append(text)
        effects.out.extend(json.dumps(unit, ensure_ascii=False) for unit in routed.units)

