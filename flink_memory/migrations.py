"""Keyed state of release 0.1.0, moved into the current layout: every conversion of an older release in one place.

Release 0.1.0 kept each stage as a few `{"v": 1, "d": ...}` envelopes in value states, and two maps held
bare strings. A stage core knows only the current layout: the topology (flink_memory.topology) names each
stage's migration and the driver runs it on each key it loads, before the core sees the state. It reads the
old value states as text (a key without one costs a cached read in the Flink shell) and clears them once
moved; old map entries are converted as they are read (`BareEntries`), since finding them all would read
every entry of the key.

Release 0.1.0 checkpoints and savepoints are read by every 0.x release; 1.0 drops this module's release 0.1.0
part (docs/recovery.md#versioned-state).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flink_memory.chunking.plans import PlanJob, prepare
from flink_memory.ids import NodeId, UnitId
from flink_memory.records import Conversation, MemoryUnit, SummaryNode, record_from_json
from flink_memory.stages import batcher_state as batcher
from flink_memory.stages import merger_state as merger
from flink_memory.stages import planner_state as planner
from flink_memory.state import StateSchema, StateTransaction, Value, seq_key
from flink_memory.state_layout import STATE_VERSION, Codec, StateVersionError
from flink_memory.summarize.batching import BatchBuffer, unit_entry
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import ChildRef, Slot, SummaryTree

LEGACY_VERSION = 1  # the layout release 0.1.0 wrote


@dataclass(frozen=True)
class BareEntries:
    """A map whose entries release 0.1.0 kept as bare strings: those are converted as they are read, the
    others are read as the current layout stores them."""

    stored: Codec
    convert: Callable[[str], Any]

    def load(self, raw: str) -> Any:
        return self.stored.load(raw) if raw.startswith('{"v":') else self.convert(raw)

    def dump(self, value: Any) -> str:
        return self.stored.dump(value)


@dataclass(frozen=True)
class Release010:
    """How one stage's release 0.1.0 state becomes the current layout (a `flink_memory.state.Migration`)."""

    move: Callable[[Any, StateTransaction], None]  # (core, state): moves the old values, clears them
    values: tuple[str, ...] = ()  # the old value states, read as text
    entries: Mapping[str, Callable[[str], Any]] = field(default_factory=dict)  # map -> a bare string's reader

    def schema(self, current: StateSchema) -> StateSchema:
        maps = dict(current.maps)
        for name, convert in self.entries.items():
            stored = current.maps[name]
            assert stored is not None  # (a map of raw text has no older entries to convert)
            maps[name] = BareEntries(stored, convert)
        return StateSchema(values={**current.values, **dict.fromkeys(self.values)}, maps=maps,
                           read_once=frozenset(self.values))

    def migrate(self, core: Any, state: StateTransaction) -> None:
        self.move(core, state)


def encode_state(data: Any) -> str:
    """A version-1 envelope, as release 0.1.0 wrote it (what the migration tests store)."""
    return json.dumps({"v": LEGACY_VERSION, "d": data}, ensure_ascii=False)


def decode_state(raw: str | None, default: Any) -> Any:
    """The data of one version-1 value state; `default` when the key has none."""
    if raw is None:
        return default
    try:
        envelope = json.loads(raw)
    except ValueError as exc:
        raise StateVersionError(f"operator state is not JSON ({exc}); it was not written by flink-memory") from None
    if not isinstance(envelope, dict) or "v" not in envelope or "d" not in envelope:
        raise StateVersionError("operator state has no version tag; it was not written by this release's layout")
    if envelope["v"] != LEGACY_VERSION:
        raise StateVersionError(
            f"operator state version {envelope['v']!r} is not readable by this release (it reads version "
            f"{STATE_VERSION} and migrates version {LEGACY_VERSION}): restore with the release that wrote the "
            "checkpoint, or start without --restore"
        )
    return envelope["d"]


# --- the planner --------------------------------------------------------------------------------------------

LEGACY_QUEUE: Value[str] = Value("queue")


def source_entry(raw: str) -> planner.SourceEntry:
    """The content digest alone ("rejected:<digest>" for a record refused under raise, which counts as not
    accepted: an empty digest matches no content). No unit ids were kept, so such a record is sealed: an
    update or deletion of it is refused with the reason, never half-applied."""
    rejected = raw.startswith("rejected:")
    return planner.SourceEntry(digest="" if rejected else raw, sealed=not rejected)


def plan_entry(raw: str) -> planner.PlanEntry:
    """The manifest alone."""
    return planner.PlanEntry(manifest=raw)


def migrate_planner(core: Any, state: StateTransaction) -> None:
    """The queue was one list of the same fields: its records go to the end of the queue map (`core`: the
    planner's, which seals a plan in progress)."""
    raw = state.get(LEGACY_QUEUE)
    if raw is None:
        return
    head = state.get(planner.HEAD) or planner.QueueHead()
    entries = decode_state(raw, [])
    for entry in entries:
        job = PlanJob.model_validate(entry["job"]) if entry.get("job") else None
        record = record_from_json(json.loads(entry["payload"]))
        sealed = core.job_digest(job, prepare(record)) if job and isinstance(record, Conversation) else None
        state.put(planner.QUEUE, seq_key(head.next), planner.QueuedRecord(
            payload=entry["payload"], job=job, job_digest=sealed, checked=bool(entry.get("checked"))))
        head.next += 1
    if entries:
        state.set(planner.HEAD, head)
    state.set(LEGACY_QUEUE, None)

# --- the batcher --------------------------------------------------------------------------------------------

LEGACY_BUFFER: Value[str] = Value("buffer")
LEGACY_PENDING: Value[str] = Value("pending")


def migrate_batcher(core: Any, state: StateTransaction) -> None:
    """The buffer and the pending batches were two JSON values: they move into the maps."""
    old_buffer, old_pending = state.get(LEGACY_BUFFER), state.get(LEGACY_PENDING)
    if old_buffer is not None:
        buffer = state.get(batcher.BUFFER) or BatchBuffer()
        data = decode_state(old_buffer, None) or {}
        for unit in data.get("units", []):
            state.put(batcher.UNITS, seq_key(buffer.next_seq),
                      batcher.StoredUnit(unit=MemoryUnit.model_validate(unit)))
            state.put(batcher.HOMES, unit["unit_id"], batcher.UnitHome(seq=buffer.next_seq))
            buffer.count += 1
            buffer.last = unit_entry(unit)
        buffer.tokens = int(data.get("tokens", 0))
        buffer.opened_at_ms = data.get("opened_at_ms")
        state.set(LEGACY_BUFFER, None)
        state.set(batcher.BUFFER, buffer)
    if old_pending is not None:
        meta = state.get(batcher.META) or batcher.BatcherMeta()
        data = decode_state(old_pending, None) or {}
        meta.next_batch = int(data.get("next_seq", 1))
        seqs = [int(b["seq"]) for b in data.get("batches", [])]
        meta.next_emit = min(seqs) if seqs else meta.next_batch
        for old in data.get("batches", []):  # their units: ids only (the texts are in the job)
            units = [MemoryUnit(agent_id=state.key, unit_id=u, source_id=UnitId.parse(u).record, text=e["text"],
                                ts=e.get("from")) for u, e in zip(old["units"], old["job"]["entries"])]
            stamps = old.get("ts") or []
            state.put(batcher.BATCHES, seq_key(int(old["seq"])), batcher.PendingBatch(
                seq=int(old["seq"]), units=units, first_ts=stamps[0] if stamps else None,
                last_ts=stamps[-1] if stamps else None, job=ReduceJob.model_validate(old["job"]),
                text=old.get("text")))
        state.set(LEGACY_PENDING, None)
        state.set(batcher.META, meta)


# --- the merger ---------------------------------------------------------------------------------------------

LEGACY_TREE: Value[str] = Value("tree")
LEGACY_JOBS: Value[str] = Value("jobs")


def _parent_job(data: dict) -> merger.ParentJob:
    children = [ChildRef.of(SummaryNode.model_validate(c)) for c in data["children"]]
    return merger.ParentJob(node_id=data["node_id"], level=int(data.get("level", 0)), version=data.get("version"),
                            children=children, job=ReduceJob.model_validate(data["job"]))


def migrate_merger(core: Any, state: StateTransaction) -> None:
    """The tree (with node texts) and the running jobs were two JSON values."""
    old_tree, old_jobs = state.get(LEGACY_TREE), state.get(LEGACY_JOBS)
    if old_tree is not None:
        tree = state.get(merger.TREE) or SummaryTree()
        data = decode_state(old_tree, None) or {}
        for level in data.get("levels", []):
            slots = []
            for slot in level:
                if slot.get("node") is not None:
                    node = SummaryNode.model_validate(slot["node"])
                    state.put(merger.NODES, node.node_id, merger.StoredNode(node=node))
                    tree.note_id(node.node_id)
                    slots.append(Slot(node_id=node.node_id, ready=True))
                else:
                    slots.append(Slot(node_id=slot["job"], ready=False))
            tree.restore_level(slots)
        tree.unwritten = []  # (merged batches were dropped from that tree: they were all written)
        tree.merges_per_level = list(data.get("merges_per_level", []))
        # its globals named no predecessor: the next global (or a forget) replaces all of them
        tree.global_version = tree.unchained_globals = int(data.get("global_version", 0))
        tree.global_children = list(data.get("global_children", []))
        state.set(LEGACY_TREE, None)
        state.set(merger.TREE, tree)
    if old_jobs is not None:
        schedule = state.get(merger.SCHEDULE) or merger.MergerSchedule()
        data = decode_state(old_jobs, None) or {}
        for merge in data.get("merges", []):
            state.put(merger.MERGES, merge["node_id"], _parent_job(merge))
        if data.get("global"):  # it replaces every global before it (none of them named a predecessor)
            job = _parent_job(data["global"])
            state.set(merger.GLOBAL, job.model_copy(update={"replaces": [
                str(NodeId.global_summary(n)) for n in range(1, job.version or 0)]}))
        schedule.last_global_ms = data.get("last_global_ms") or None
        schedule.first_node_ms = schedule.last_global_ms
        state.set(LEGACY_JOBS, None)
        state.set(merger.SCHEDULE, schedule)


PLANNER = Release010(migrate_planner, (LEGACY_QUEUE,), {planner.SOURCES: source_entry, planner.PLANS: plan_entry})
BATCHER = Release010(migrate_batcher, (LEGACY_BUFFER, LEGACY_PENDING))
MERGER = Release010(migrate_merger, (LEGACY_TREE, LEGACY_JOBS))
