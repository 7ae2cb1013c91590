"""The chunk-planner stage: records in, memory units and manifests out, per agent and in input order.

A record behind a conversation that is still being planned waits in the agent's queue, so units leave in
input order and batch membership never depends on LLM timing. Plans that cost a call are kept by input
digest with their verified manifests, so a compatible retry reuses them.

Memory that changes: every accepted record is remembered by id with its content digest and unit ids. The
same id with identical content is a re-delivery (a `duplicate` dead letter, no unit, no call); with other
content it is an update: the old units are retracted and the record is planned again in full (its
manifest names the input it replaces). A deletion retracts a record's units; forgetting drops the agent.
A record stays editable for `memory.editable_for`; then it is sealed (changes are refused), and after as
long again its id is forgotten (stages.planner_retention).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from flink_memory.chunking.exchanges import InvalidPlan, materialize
from flink_memory.chunking.manifest import (
    ManifestMismatch,
    PolicyChanged,
    as_update,
    load_verified,
    manifest_json,
    verify_chunks,
)
from flink_memory.chunking.plans import ChunkPlanner, PlanJob, PlanTask, Prepared, Routed, prepare
from flink_memory.config import Config
from flink_memory.digests import digest
from flink_memory.records import (
    RECORD_KINDS,
    Content,
    Conversation,
    DeadLetter,
    Deletion,
    Forget,
    InputRecord,
    MemoryUnit,
    record_from_json,
)
from flink_memory.requests import RequestFactory
from flink_memory.stages.calls import Effects, Finished, RecordFault, Timing, drive
from flink_memory.stages.channels import MANIFESTS
from flink_memory.stages.messages import ForgetAgent, Retract, StageMessage, text_of
from flink_memory.stages.planner_retention import SourceRetention
from flink_memory.stages.planner_state import (
    CLOCK,
    HEAD,
    PLANS,
    QUEUE,
    SCHEMA,
    SOURCES,
    PlanEntry,
    QueuedRecord,
    QueueHead,
    SourceEntry,
    plan_progress,
)
from flink_memory.stages.protocol import Culprit, internal_dead_letter
from flink_memory.state import StateTransaction, seq_key
from flink_memory.state_layout import StateVersionError
from flink_memory.summarize.rooms import Rooms


def _raw(record: InputRecord) -> str:
    return json.dumps(record.model_dump(mode="json"), ensure_ascii=False)


def _dead(record: InputRecord, reason: str, stage: str) -> DeadLetter:
    return DeadLetter(raw=_raw(record), reason=reason, stage=stage, agent_id=record.agent_id,  # type: ignore[arg-type]
                      record_id=getattr(record, "id", None))


def item_digest(record: InputRecord) -> str:
    """Content digest of a record that needs no plan (what a re-delivery is compared by)."""
    return digest(record.model_dump(mode="json", exclude={"ts", "metadata"}))


class PlannerCore:
    schema = SCHEMA

    def __init__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> None:
        """`bounded` is the stages' common signature; the planner has no timeouts to skip."""
        self.config = config
        self.planner = ChunkPlanner(config, factory, Rooms.from_config(config, factory.budget).batch_item_room)
        self.timing = Timing.from_config(config)
        self.retention = SourceRetention(self.timing, config.memory.editable_for)
        self.raise_on_failure = config.chunking.on_planner_failure == "raise"
        self.inspect: Callable[[InputRecord], None] | None = None

    def inspect_with(self, inspect: Callable[[InputRecord], None]) -> None:
        """Have `inspect` see each record just before it is handled (a runner's drill: stages.drills); an error
        it raises is blamed on that record."""
        self.inspect = inspect

    # --- activations ---------------------------------------------------------------------------------

    def on_input(self, state: StateTransaction, message: StageMessage, finished: Finished, now_ms: int) -> Effects:
        if not isinstance(message, tuple(RECORD_KINDS.values())):
            raise TypeError(f"the planner takes input records, not {type(message).__name__}")
        payload = text_of(message)  # (the queue keeps records as text)
        head = self._head(state)
        if head.first == head.next:  # nothing waits before it: handle it at once, queue it only if it must wait
            effects = Effects()
            entry = QueuedRecord(payload=payload)
            if self._guarded(state, entry, None, finished, now_ms, effects, message):
                self.retention.sweep(state, now_ms, effects)
                return effects
            state.put(QUEUE, seq_key(head.next), entry)
            head.next += 1
            state.set(HEAD, head)
            return effects
        state.put(QUEUE, seq_key(head.next), QueuedRecord(payload=payload))
        head.next += 1
        return self._drain(state, head, finished, now_ms)

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        return self._drain(state, self._head(state), finished, now_ms)

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        return self.on_wake(state, finished, now_ms)

    def evict(self, state: StateTransaction, reason: str, culprit: Culprit | None = None) -> Effects:
        """The culprit becomes a dead letter (an error of ours kept repeating on it); the records around it go
        on. A queued one (`seq`; with neither seq nor payload, the head) leaves the queue, and an update it
        was making is undone: the version before stays. A record the activation brought was not queued yet."""
        culprit = culprit or Culprit()
        effects = Effects()
        if culprit.seq is None and culprit.message is not None:
            record_id = getattr(culprit.message, "id", None)
            effects.dead_letters.append(culprit.dead_letter(reason, state.key, record_id))  # type: ignore[arg-type]
            return effects
        head = self._head(state)
        seq = head.first if culprit.seq is None else culprit.seq
        entry = state.entry(QUEUE, seq_key(seq)) if head.first <= seq < head.next else None
        if entry is not None:
            record = record_from_json(json.loads(entry.payload))
            effects.dead_letters.append(internal_dead_letter(_raw(record), reason, record.agent_id,
                                                             getattr(record, "id", None)))
            if entry.checked:  # accepted in an earlier activation, while its plan was being made
                state.put(SOURCES, record.id, entry.previous)
            state.put(QUEUE, seq_key(seq), None)
        while head.first < head.next and state.entry(QUEUE, seq_key(head.first)) is None:
            head.first += 1
        state.set(HEAD, head if head.first < head.next else None)
        return effects

    def _head(self, state: StateTransaction) -> QueueHead:
        return state.get(HEAD) or QueueHead()

    def _drain(self, state: StateTransaction, head: QueueHead, finished: Finished, now_ms: int) -> Effects:
        effects = Effects()
        while head.first < head.next:
            entry = state.entry(QUEUE, seq_key(head.first))
            if entry is None:  # (a record dead-lettered out of the middle of the queue)
                head.first += 1
                continue
            if not self._guarded(state, entry, head.first, finished, now_ms, effects):
                state.put(QUEUE, seq_key(head.first), entry)
                break
            state.put(QUEUE, seq_key(head.first), None)
            head.first += 1
        state.set(HEAD, head if head.first < head.next else None)
        self.retention.sweep(state, now_ms, effects)
        return effects

    # --- one record ----------------------------------------------------------------------------------

    def _guarded(self, state: StateTransaction, entry: QueuedRecord, seq: int | None, finished: Finished,
                 now_ms: int, effects: Effects, record: InputRecord | None = None) -> bool:
        """`_handle`, with an error of ours blamed on this record (see RecordFault)."""
        try:
            return self._handle(state, entry, finished, now_ms, effects, record)
        except StateVersionError:  # state this release cannot read: the job stops with the reason
            raise
        except Exception as exc:
            raise RecordFault(entry.payload, seq, exc) from exc

    def _handle(self, state: StateTransaction, entry: QueuedRecord, finished: Finished, now_ms: int,
                effects: Effects, record: InputRecord | None = None) -> bool:
        """Handle the record at the head of the queue (`record`: the entry's, when the caller has it parsed);
        False while it waits for the planner."""
        record = record or record_from_json(json.loads(entry.payload))
        if self.inspect is not None:
            self.inspect(record)
        if isinstance(record, Forget):
            self._forget(state, effects)
            return True
        if isinstance(record, Deletion):
            self._delete(state, record, now_ms, effects)
            return True
        if not self.planner.needs_llm(record):
            routed = self.planner.route(record)
            content = routed.manifest.input_digest if routed.manifest else item_digest(record)
            if self._accept(state, record, content, entry, now_ms, effects):
                self._send_units(state, record, routed, entry, now_ms, effects, content=content)
            return True
        assert isinstance(record, Conversation)
        prepared = prepare(record)
        if not entry.checked:
            stored = state.entry(PLANS, prepared.input_digest)
            reused = self._reuse(record, prepared, stored.manifest) if stored is not None else None
            if isinstance(reused, DeadLetter):
                effects.dead_letters.append(reused)
                effects.counts["manifest_verification_failures"] += 1
                return True
            if not self._accept(state, record, prepared.input_digest, entry, now_ms, effects):
                return True
            if reused is not None:
                effects.counts["plans_reused"] += 1
                self._send_units(state, record, reused, entry, now_ms, effects, store=False)
                return True
            entry.checked = True
        if entry.job is not None and entry.job_digest != self.job_digest(entry.job, prepared):
            effects.dead_letters.append(_dead(record, "the chunk plan in progress failed verification (tampered or "
                                                      "corrupt state), not used", "plan"))
            effects.counts["manifest_verification_failures"] += 1
            state.put(SOURCES, record.id, entry.previous)
            return True
        job = entry.job or PlanJob()
        entry.job = job
        try:
            progress = drive(job, PlanTask(self.planner, prepared), finished, now_ms, self.timing.retry)
        except InvalidPlan as exc:
            return self._failed(state, record, prepared, f"invalid planner output: {exc}", entry, now_ms, effects)
        entry.job_digest = self.job_digest(job, prepared)
        effects.track(progress, job)
        if progress.state == "done":
            effects.counts["plans_made"] += 1
            routed = self.planner.finish(record, prepared, progress.value, "semantic", calls=job.calls)
            self._send_units(state, record, routed, entry, now_ms, effects)
            return True
        if progress.state == "failed":
            return self._failed(state, record, prepared, f"planner call failed: {progress.error}", entry, now_ms,
                                effects)
        return False

    def job_digest(self, job: PlanJob, prepared: Prepared) -> str:
        """Seals a plan in progress to its input and policy: state that does not match is never used."""
        return digest({"input": prepared.input_digest, "policy": self.planner.fingerprint,
                       "job": plan_progress(job)})

    def _failed(self, state: StateTransaction, record: Conversation, prepared: Prepared, reason: str,
                entry: QueuedRecord, now_ms: int, effects: Effects) -> bool:
        """`chunking.on_planner_failure`: fixed chunks with the reason, or a dead letter (`raise`).

        A record refused under `raise` is not accepted (an update leaves the previous version in place), so
        the same record sent again is planned again.
        """
        if self.raise_on_failure:
            effects.dead_letters.append(_dead(record, reason, "plan"))
            state.put(SOURCES, record.id, entry.previous)
            return True
        effects.counts["plan_fallbacks"] += 1
        calls = entry.job.calls if entry.job else 0
        self._send_units(state, record, self.planner.fallback(record, prepared, reason, calls), entry, now_ms, effects)
        return True

    def _accept(self, state: StateTransaction, record: Content, input_digest: str | None, entry: QueuedRecord,
                now_ms: int, effects: Effects) -> bool:
        """Remember the record's content. An id seen with identical content is a re-delivery (a dead letter
        `duplicate`); with other content, an update of the version it remembers (unless that is sealed)."""
        content = input_digest or item_digest(record)
        previous = self._source(state, record.id)
        if previous is not None and previous.digest == content:
            effects.dead_letters.append(_dead(record, "duplicate: this id was already accepted with identical "
                                                      "content", "duplicate"))
            return False
        if previous is not None and self.retention.sealed(previous, now_ms):
            effects.dead_letters.append(_dead(record, self.retention.sealed_reason(record.id), "change"))
            return False
        entry.previous = previous
        state.put(SOURCES, record.id, SourceEntry(digest=content, accepted_ms=now_ms))
        self.retention.remember(state, now_ms, effects)
        return True

    def _delete(self, state: StateTransaction, record: Deletion, now_ms: int, effects: Effects) -> None:
        previous = self._source(state, record.id)
        if previous is None:
            effects.dead_letters.append(_dead(record, f"unknown id: agent {record.agent_id} has no accepted record "
                                                      f"{record.id!r} to delete (never sent, already deleted, or "
                                                      "sealed long ago)", "change"))
            return
        if self.retention.sealed(previous, now_ms):
            effects.dead_letters.append(_dead(record, self.retention.sealed_reason(record.id), "change"))
            return
        effects.out.append(Retract(units=previous.units, reason=f"record {record.id} deleted"))
        effects.counts["deletions"] += 1
        state.put(SOURCES, record.id, None)

    def _forget(self, state: StateTransaction, effects: Effects) -> None:
        """Everything accepted before the forget goes; records queued behind it are newer input and stay."""
        for name in (SOURCES, PLANS):
            state.clear_map(name)
        state.set(CLOCK, None)
        effects.out.append(ForgetAgent())
        effects.counts["agents_forgotten"] += 1

    def _source(self, state: StateTransaction, record_id: str) -> SourceEntry | None:
        source = state.entry(SOURCES, record_id)
        return source if source is not None and source.digest else None

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

    def _send_units(self, state: StateTransaction, record: Content, routed: Routed, entry: QueuedRecord,
                    now_ms: int, effects: Effects, store: bool = True, content: str | None = None) -> None:
        previous = entry.previous
        if previous is not None and self.retention.sealed(previous, now_ms):  # sealed while the update was planned:
            reason = self.retention.sealed_reason(record.id) + " (it was sealed while this update was planned)"
            effects.dead_letters.append(_dead(record, reason, "change"))
            state.put(SOURCES, record.id, previous)  # the old version stays what this id stands for
            return
        if previous is not None:  # an update: the old version's units leave before the new ones arrive
            effects.out.append(Retract(units=previous.units, reason=f"record {record.id} updated"))
            effects.counts["updates"] += 1
        manifest = routed.manifest
        if manifest is not None:
            if store and manifest.method in ("semantic", "fallback"):  # the ones that cost a call
                state.put(PLANS, manifest.input_digest, PlanEntry(manifest=manifest_json(manifest), stored_ms=now_ms))
            if previous is not None:
                manifest = as_update(manifest, previous.digest, "update: the record was sent again with other "
                                                                "content, so it was planned again in full")
            effects.emit(MANIFESTS, manifest)
        units = [unit["unit_id"] for unit in routed.units]
        if content is None:  # (the content digest `_accept` compared, when the caller has it)
            content = manifest.input_digest if routed.manifest else item_digest(record)
        state.put(SOURCES, record.id, SourceEntry(digest=content, units=units, accepted_ms=now_ms))
        effects.out.extend(MemoryUnit.model_validate(unit) for unit in routed.units)

