"""The PyFlink shell: keyed functions that move state and records in and out of the plain-Python core.

Every LLM call runs on a per-subtask thread pool (`CallPool`) and is polled from processing-time
timers, so calls of different agents overlap and a slow provider never blocks a checkpoint. State is
JSON text (versioned), so it stays readable across releases. At the end of a bounded input, event-time
timers at the final watermark flush every partial batch and finish every pending call, in phases:
all agents submit first, then each waits for its own calls, so the tail still runs concurrently.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from pyflink.common import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import KeyedProcessFunction, ProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from flink_memory.chunking.core import InvalidPlan
from flink_memory.chunking.manifest import (
    ManifestMismatch,
    PolicyChanged,
    load_verified,
    manifest_json,
    verify_chunks,
)
from flink_memory.chunking.planner import ChunkPlanner, PlanJob, Prepared, prepare
from flink_memory.config import Config
from flink_memory.llm.client import ChatResult, LLMCallError, RequestFactory
from flink_memory.llm.jobs import Outcome, now_ms, run_to_end, step, wake_times_ms
from flink_memory.llm.pool import CallPool
from flink_memory.llm.runtime import make_client, write_stats
from flink_memory.records import Conversation, DeadLetter, SummaryNode, parse_line, record_from_json
from flink_memory.state import decode_state, encode_state
from flink_memory.summarize.batching import BatchBuffer, BatchLimits, unit_entry
from flink_memory.summarize.prompts import child_target
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.tree import MergeStart, SummaryTree, merge_entry

log = logging.getLogger(__name__)

DEAD_LETTERS = OutputTag("dead-letters", Types.STRING())
MANIFESTS = OutputTag("manifests", Types.STRING())
KEYED = Types.TUPLE([Types.STRING(), Types.STRING()])

_LONG_MAX = 2**63 - 1
END_PHASES = 8  # rounds of work per agent at end of input (batch, merges, global) before a full drain
END_TIMERS = [_LONG_MAX - 64 + i for i in range(END_PHASES)]


def _fault_hook(spec: str | None, stage: str, count: int) -> None:
    """job.inject_failure = "stage:n:marker": raise once at activation n of stage (see config.py)."""
    if not spec:
        return
    name, at, marker = spec.split(":", 2)
    if name != stage or count != int(at) or os.path.exists(marker):
        return
    with open(marker, "w") as handle:
        handle.write(stage)
    raise RuntimeError(f"injected failure in {stage} at activation {count}")


class ParseRecords(ProcessFunction):
    """Raw lines to keyed records; anything invalid goes to dead-letters with its reason."""

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group().add_group("flink_memory")
        self.records_in = group.counter("records_in")
        self.dead_letters = group.counter("dead_letters")

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        self.records_in.inc()
        record = parse_line(value)
        if isinstance(record, DeadLetter):
            self.dead_letters.inc()
            yield DEAD_LETTERS, record.model_dump_json()
            return
        yield record.agent_id, record.model_dump_json()


class _Stage(KeyedProcessFunction):
    """Common plumbing: config, client, pool, metrics, timers and stats."""

    stage = "stage"

    def __init__(self, config_json: str, output_dir: str | None = None) -> None:
        self.config_json = config_json
        self.output_dir = output_dir

    def open(self, runtime_context: RuntimeContext) -> None:
        self.config = Config.model_validate_json(self.config_json)
        self.client = make_client(self.config, self.output_dir)
        self.factory = RequestFactory.from_config(self.config.llm, self.client.counter)
        self.pool = CallPool(self.client, self.config.llm.max_concurrency)
        self.poll_ms = self.config.job.poll_interval_ms
        self.recheck_ms = max(self.poll_ms, int(self.config.job.recheck_s * 1000))
        self.subtask, self.attempt = _task_identity(runtime_context)
        self.activations = 0
        self.fresh_results = 0
        group = runtime_context.get_metrics_group().add_group("flink_memory")
        self.m_calls = group.counter("llm_calls")
        self.m_failures = group.counter("llm_failures")
        self.m_retries = group.counter("llm_retries")
        self.m_journal = group.counter("journal_hits")
        self.m_prompt = group.counter("prompt_tokens")
        self.m_completion = group.counter("completion_tokens")
        self.m_latency = group.distribution("llm_latency_ms")
        self.m_rejections = group.counter("llm_context_rejections")
        self.m_truncated = group.counter("llm_truncated")
        group.gauge("llm_in_flight", lambda: self.pool.in_flight())
        self.metrics = group
        self.open_state(runtime_context)

    def open_state(self, runtime_context: RuntimeContext) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if getattr(self, "client", None) is not None:
            write_stats(self.output_dir, self.stage, self.subtask, self.attempt, self.client.stats.snapshot())
            self.pool.close(self.config.journal.drain_on_close_s if self.config.journal.path else 0.0)
            self.client.close()

    # --- helpers -------------------------------------------------------------------------------------

    def _activation(self) -> None:
        self.activations += 1
        _fault_hook(self.config.job.inject_failure, self.stage, self.activations)

    def _arm_end(self, ctx: Any) -> None:
        """(Re-)register the end-of-input timers on every activation; Flink keeps one timer per key and time.

        Not remembered in keyed state or in memory: a key restored from a checkpoint re-arms on its first
        activation whatever the restore brought back, and nothing grows with the number of agents.
        """
        for ts in END_TIMERS:
            ctx.timer_service().register_event_time_timer(ts)

    def _poll_later(self, ctx: Any, at_ms: int | None = None) -> None:
        now = ctx.timer_service().current_processing_time()
        for at in wake_times_ms(now, at_ms, self.poll_ms, self.recheck_ms):
            ctx.timer_service().register_processing_time_timer(at)

    def _account(self, outcome: Outcome) -> None:
        for result in outcome.results:
            if result.from_journal:
                self.m_journal.inc()
            else:
                self.m_calls.inc()
                self.m_latency.update(int(result.latency_s * 1000))
                self.fresh_results += 1
                _fault_hook(self.config.job.inject_failure, "call", self.fresh_results)
            self.m_prompt.inc(result.prompt_tokens)
            self.m_completion.inc(result.completion_tokens)
            if result.truncated:
                self.m_truncated.inc()
        if outcome.rejections:
            self.m_rejections.inc(outcome.rejections)
            log.warning("%s: %d request(s) refused for their length, re-packed smaller", self.stage,
                        outcome.rejections)
        if outcome.state == "failed":
            self.m_failures.inc()
            self.m_retries.inc()
            log.warning("%s: provider failed, retrying later: %s", self.stage, outcome.error)

    def _step(self, job: Any, requests: Any, advance: Any, *, block: bool, wait_once: bool = False,
              repack: Any = None) -> Outcome:
        backoff = (self.config.llm.retry_backoff_s, self.config.llm.retry_backoff_max_s)
        if block:
            value = run_to_end(job, requests, advance, self.pool, base_backoff_s=backoff[0],
                               max_backoff_s=backoff[1], on_outcome=self._account, repack=repack)
            return Outcome("done", value=value)
        outcome = step(job, requests, advance, self.pool, at_ms=now_ms(), base_backoff_s=backoff[0],
                       max_backoff_s=backoff[1], repack=repack)
        self._account(outcome)
        if wait_once and outcome.state == "pending":
            self.pool.wait(requests(), timeout_s=self.config.llm.timeout_s * (self.config.llm.max_retries + 1))
            outcome = step(job, requests, advance, self.pool, at_ms=now_ms(), base_backoff_s=backoff[0],
                           max_backoff_s=backoff[1], repack=repack)
            self._account(outcome)
        return outcome

    def _step_reduce(self, job: ReduceJob, *, block: bool, wait_once: bool = False) -> Outcome:
        """Drive a summary job; a length rejection re-packs it with a larger token scale."""
        return self._step(job, lambda: job.requests(self.factory), lambda results: job.advance(self.factory, results),
                          block=block, wait_once=wait_once, repack=lambda: job.rejected(self.factory.budget))

    @staticmethod
    def _end_phase(timestamp: int) -> int | None:
        return END_TIMERS.index(timestamp) if timestamp in END_TIMERS else None


def _task_identity(runtime_context: RuntimeContext) -> tuple[int, int]:
    """Subtask index and attempt; thread mode (PyFlink 2.3) cannot answer either, so fall back to 0."""
    try:
        return runtime_context.get_index_of_this_subtask(), runtime_context.get_attempt_number()
    except Exception:  # pemja's PyJObject lacks these getters in thread mode
        return 0, 0


def _load(state: Any, default: Any) -> Any:
    return decode_state(state.value(), default)


def _save(state: Any, data: Any) -> None:
    state.update(encode_state(data))


# ---------------------------------------------------------------------------------------------------------
# Chunk planner
# ---------------------------------------------------------------------------------------------------------


class PlanChunks(_Stage):
    """Inputs to memory units. Plans live in keyed state by input digest, with verified manifests.

    Units leave in input order per agent: a record behind a conversation that is still being planned
    waits for it, so batch membership does not depend on LLM timing.
    """

    stage = "planner"

    def open_state(self, runtime_context: RuntimeContext) -> None:
        self.planner = ChunkPlanner(self.config, self.factory)
        self.plans = runtime_context.get_map_state(MapStateDescriptor("plans", Types.STRING(), Types.STRING()))
        self.sources = runtime_context.get_map_state(MapStateDescriptor("sources", Types.STRING(), Types.STRING()))
        self.queue = runtime_context.get_state(ValueStateDescriptor("queue", Types.STRING()))
        self.m_plans = self.metrics.counter("plans_made")
        self.m_reused = self.metrics.counter("plans_reused")
        self.m_fallbacks = self.metrics.counter("plan_fallbacks")

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        self._activation()
        queue = _load(self.queue, [])
        queue.append({"payload": value[1], "job": None})
        self._arm_end(ctx)
        yield from self._drain(queue, ctx, block=False)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        self._activation()
        phase = self._end_phase(timestamp)
        queue = _load(self.queue, [])
        if phase is None:
            self._arm_end(ctx)
            yield from self._drain(queue, ctx, block=False)
        else:
            yield from self._drain(queue, ctx, block=phase == END_PHASES - 1, wait_once=phase > 0)

    def _drain(self, queue: list[dict[str, Any]], ctx: Any, *, block: bool, wait_once: bool = False):
        while queue:
            entry = queue[0]
            record = record_from_json(json.loads(entry["payload"]))
            outputs, done = self._handle(record, entry, ctx, block=block, wait_once=wait_once)
            yield from outputs
            if not done:
                break
            queue.pop(0)
        if queue:
            _save(self.queue, queue)
            job = queue[0].get("job") or {}
            self._poll_later(ctx, job.get("retry_at_ms"))
        else:
            self.queue.clear()

    def _handle(self, record: Any, entry: dict[str, Any], ctx: Any, *, block: bool, wait_once: bool):
        """Outputs for one record, and whether it is finished."""
        outputs: list[Any] = []
        if not self.planner.needs_llm(record):
            routed = self.planner.route(record)
            duplicate = self._duplicate(record, routed.manifest.input_digest if routed.manifest else None)
            if duplicate:
                return [duplicate], True
            return self._emit(record, routed, outputs), True
        prepared = prepare(record)
        if not entry.get("checked"):  # first sight of this record: verify a stored plan, catch duplicates
            stored = self.plans.get(prepared.input_digest)
            reused = self._reuse(record, prepared, stored) if stored is not None else None
            if isinstance(reused, DeadLetter):
                return [(DEAD_LETTERS, reused.model_dump_json())], True
            duplicate = self._duplicate(record, prepared.input_digest)
            if duplicate:
                return [duplicate], True
            if reused is not None:
                self.m_reused.inc()
                return self._emit(record, reused, outputs, store=False), True
            entry["checked"] = True
        job = PlanJob.from_state(entry["job"]) if entry.get("job") else PlanJob()
        holder: dict[str, Any] = {}

        def requests():
            return [self.planner.request(prepared, job)]

        def advance(results: list[ChatResult]):
            job.calls += sum(0 if r.from_journal else 1 for r in results)
            try:
                plan = self.planner.advance(prepared, job, results[0].text)
            except InvalidPlan as exc:
                holder["invalid"] = str(exc)
                return "invalid"
            return plan

        try:
            outcome = self._step(job, requests, advance, block=block, wait_once=wait_once,
                                 repack=lambda: job.rejected(self.factory.counter.scale))
        except LLMCallError as exc:  # only from blocking mode, which retries; kept for completeness
            outcome = Outcome("failed", error=exc)
        if outcome.state == "done" and outcome.value != "invalid":
            self.m_plans.inc()
            return self._emit(record, self.planner.finish(record, prepared, outcome.value, "semantic",
                                                          calls=job.calls), outputs), True
        reason = None
        if outcome.state == "done":
            reason = f"invalid planner output: {holder['invalid']}"
        elif outcome.state == "failed" and self.config.chunking.on_planner_failure == "fixed_fallback":
            reason = f"planner call failed: {outcome.error}"
        if reason is not None:
            return self._fail(record, prepared, reason, job.calls, outputs), True
        entry["job"] = job.to_state()
        return outputs, False

    def _fail(self, record: Conversation, prepared: Prepared, reason: str, calls: int, outputs: list[Any]):
        if self.config.chunking.on_planner_failure == "raise":
            dead = DeadLetter(raw=json.dumps(record.model_dump(mode="json"), ensure_ascii=False), reason=reason,
                              stage="plan", agent_id=record.agent_id, record_id=record.id)
            self.sources.put(record.id, "rejected:" + prepared.input_digest)
            return [(DEAD_LETTERS, dead.model_dump_json())]
        self.m_fallbacks.inc()
        return self._emit(record, self.planner.fallback(record, prepared, reason, calls), outputs)

    def _reuse(self, record: Conversation, prepared: Prepared, stored: str):
        """A verified stored plan, None when the policy changed, a dead letter when verification fails."""
        try:
            manifest = load_verified(stored, input_digest=prepared.input_digest,
                                     policy_fingerprint=self.planner.fingerprint)
            routed = self.planner.finish(record, prepared, manifest.boundaries, manifest.method,
                                         manifest.reason, calls=0)
            verify_chunks(manifest, [{"messages": c["messages"]} for c in _chunks_of(routed, prepared)])
        except PolicyChanged:
            return None
        except ManifestMismatch as exc:
            log.error("stored plan for %s/%s failed verification: %s", record.agent_id, record.id, exc)
            self.metrics.counter("manifest_verification_failures").inc()
            return DeadLetter(raw=json.dumps(record.model_dump(mode="json"), ensure_ascii=False),
                              reason=f"stored chunk plan failed verification, not reused: {exc}", stage="plan",
                              agent_id=record.agent_id, record_id=record.id)
        return routed

    def _duplicate(self, record: Any, input_digest: str | None):
        """A record id seen before with the same content is accounted for as a duplicate, not re-summarized."""
        key = input_digest or _item_digest(record)
        previous = self.sources.get(record.id)
        if previous is not None and previous.split(":")[-1] == key:
            dead = DeadLetter(raw=json.dumps(record.model_dump(mode="json"), ensure_ascii=False),
                              reason="duplicate: this id was already accepted with identical content",
                              stage="duplicate", agent_id=record.agent_id, record_id=record.id)
            return DEAD_LETTERS, dead.model_dump_json()
        self.sources.put(record.id, key)
        return None

    def _emit(self, record: Any, routed: Any, outputs: list[Any], store: bool = True) -> list[Any]:
        if routed.manifest is not None:
            text = manifest_json(routed.manifest)
            if store and routed.manifest.method in ("semantic", "fallback"):  # the ones that cost a call
                self.plans.put(routed.manifest.input_digest, text)
            outputs.append((MANIFESTS, text))
        for unit in routed.units:
            outputs.append((record.agent_id, json.dumps(unit, ensure_ascii=False)))
        return outputs


def _chunks_of(routed: Any, prepared: Prepared) -> list[dict[str, Any]]:
    from flink_memory.chunking import core

    boundaries = [c.end for c in routed.manifest.chunks]
    return core.materialize(prepared.messages, prepared.exchanges, boundaries, prepared.costs, 10**12)


def _item_digest(record: Any) -> str:
    from flink_memory.digests import digest

    return digest(record.model_dump(mode="json", exclude={"ts", "metadata"}))


# ---------------------------------------------------------------------------------------------------------
# Batcher
# ---------------------------------------------------------------------------------------------------------


class BatchSummaries(_Stage):
    """Buffers units per agent, closes batches by count, tokens or timeout, and summarizes each batch.

    Finished batches leave in batch order per agent, so the tree downstream sees a stable chronology.
    """

    stage = "batcher"

    def open_state(self, runtime_context: RuntimeContext) -> None:
        self.limits = BatchLimits.from_config(self.config, self.factory.budget)
        self.flush_ms = int(self.config.batching.flush_after_s * 1000)
        self.buffer = runtime_context.get_state(ValueStateDescriptor("buffer", Types.STRING()))
        self.pending = runtime_context.get_state(ValueStateDescriptor("pending", Types.STRING()))
        self.m_batches = self.metrics.counter("batches")
        self.m_units = self.metrics.counter("units_in")

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        self._activation()
        self.m_units.inc()
        unit = json.loads(value[1])
        buffer = BatchBuffer.from_state(_load(self.buffer, None))
        pending = _load(self.pending, {"next_seq": 1, "batches": []})
        was_empty = not buffer.units
        for batch in buffer.add(unit, self.limits, ctx.timer_service().current_processing_time(),
                                self.factory.budget):
            self._open_batch(pending, batch)
        if buffer.units and was_empty:
            self._poll_later(ctx, buffer.opened_at_ms + self.flush_ms)
        _save(self.buffer, buffer.to_state())
        self._arm_end(ctx)
        yield from self._advance(pending, ctx, block=False)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        self._activation()
        phase = self._end_phase(timestamp)
        if phase is None:
            self._arm_end(ctx)
        buffer = BatchBuffer.from_state(_load(self.buffer, None))
        pending = _load(self.pending, {"next_seq": 1, "batches": []})
        now = ctx.timer_service().current_processing_time()
        timed_out = buffer.units and buffer.opened_at_ms is not None and now >= buffer.opened_at_ms + self.flush_ms
        if buffer.units and (phase is not None or timed_out):
            self._open_batch(pending, buffer.take())
            _save(self.buffer, buffer.to_state())
        elif buffer.units and phase is None:
            self._poll_later(ctx, buffer.opened_at_ms + self.flush_ms)  # not due yet (or woken by the grid)
        if phase is None:
            yield from self._advance(pending, ctx, block=False)
        else:
            yield from self._advance(pending, ctx, block=phase == END_PHASES - 1, wait_once=phase > 0)

    def _open_batch(self, pending: dict[str, Any], units: list[dict[str, Any]]) -> None:
        seq = pending["next_seq"]
        pending["next_seq"] += 1
        job = ReduceJob("batch", [unit_entry(u) for u in units], target_tokens=self.limits.target_tokens)
        pending["batches"].append({
            "seq": seq,
            "units": [u["unit_id"] for u in units],
            "ts": sorted(u["ts"] for u in units if u.get("ts")),
            "job": job.to_state(),
            "text": None,
        })

    def _advance(self, pending: dict[str, Any], ctx: Any, *, block: bool, wait_once: bool = False):
        for batch in pending["batches"]:
            if batch["text"] is not None:
                continue
            job = ReduceJob.from_state(batch["job"])
            outcome = self._step_reduce(job, block=block, wait_once=wait_once)
            if outcome.state == "done":
                batch["text"] = outcome.value
            batch["job"] = job.to_state()
        agent_id = ctx.get_current_key()
        while pending["batches"] and pending["batches"][0]["text"] is not None:
            batch = pending["batches"].pop(0)
            job = batch["job"]
            node = SummaryNode(
                agent_id=agent_id, node_id=f"batch-{batch['seq']:06d}", kind="batch", level=1,
                children=batch["units"], text=batch["text"], item_count=len(batch["units"]),
                first_ts=batch["ts"][0] if batch["ts"] else None, last_ts=batch["ts"][-1] if batch["ts"] else None,
                model=",".join(job["models"]) or self.config.llm.model, prompt_tokens=job["prompt_tokens"],
                completion_tokens=job["completion_tokens"], truncated=job["truncated"],
            )
            self.m_batches.inc()
            yield agent_id, node.model_dump_json()
        _save(self.pending, pending)
        waiting = [b["job"]["retry_at_ms"] for b in pending["batches"]]
        if waiting:
            self._poll_later(ctx, min(waiting))


# ---------------------------------------------------------------------------------------------------------
# Hierarchical merger
# ---------------------------------------------------------------------------------------------------------


class MergeSummaries(_Stage):
    """Keeps each agent's summary tree, runs merges and refreshes the global summary; emits nodes."""

    stage = "merger"

    def open_state(self, runtime_context: RuntimeContext) -> None:
        self.tree_state = runtime_context.get_state(ValueStateDescriptor("tree", Types.STRING()))
        self.jobs_state = runtime_context.get_state(ValueStateDescriptor("jobs", Types.STRING()))
        self.hierarchical = self.config.summarization.depth == "hierarchical"
        self.retention = self.config.summarization.retention
        self.refresh_ms = int(self.config.summarization.global_refresh_s * 1000)
        self.fan_in = self.config.summarization.fan_in
        self.merge_target = child_target(self.factory.budget, self.fan_in)
        self.m_merges = self.metrics.counter("merges")
        self.m_globals = self.metrics.counter("globals")

    def _emit_node(self, node: SummaryNode) -> list[str]:
        keep = {"all": {"batch", "merge", "global"}, "batch_and_global": {"batch", "global"},
                "global_only": {"global"}}[self.retention]
        return [node.model_dump_json()] if node.kind in keep else []

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        self._activation()
        node = SummaryNode.model_validate_json(value[1])
        yield from self._emit_node(node)
        if not self.hierarchical:
            return
        tree, jobs = self._load(ctx)
        for start in tree.add(node.model_dump(mode="json"), self.fan_in, self.factory.budget):
            self._open_merge(jobs, start)
        self._arm_end(ctx)
        yield from self._advance(tree, jobs, ctx, block=False, final=False)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        self._activation()
        if not self.hierarchical:
            return
        tree, jobs = self._load(ctx)
        phase = self._end_phase(timestamp)
        if phase is None:
            self._arm_end(ctx)
            yield from self._advance(tree, jobs, ctx, block=False, final=False)
        else:
            yield from self._advance(tree, jobs, ctx, block=phase == END_PHASES - 1, wait_once=phase > 0,
                                     final=True)

    def _load(self, ctx: Any) -> tuple[SummaryTree, dict[str, Any]]:
        tree_data = _load(self.tree_state, None)
        tree = SummaryTree.from_state(tree_data) if tree_data else SummaryTree(ctx.get_current_key())
        jobs = _load(self.jobs_state, {"merges": [], "global": None, "last_global_ms": 0})
        return tree, jobs

    def _open_merge(self, jobs: dict[str, Any], start: MergeStart) -> None:
        job = ReduceJob("merge", [merge_entry(c) for c in start.children], target_tokens=self.merge_target)
        jobs["merges"].append({"node_id": start.node_id, "level": start.level, "children": start.children,
                               "job": job.to_state()})

    def _advance(self, tree: SummaryTree, jobs: dict[str, Any], ctx: Any, *, block: bool, final: bool,
                 wait_once: bool = False):
        agent_id = ctx.get_current_key()
        while True:
            progressed = False
            for merge in list(jobs["merges"]):
                job = ReduceJob.from_state(merge["job"])
                outcome = self._step_reduce(job, block=block, wait_once=wait_once)
                merge["job"] = job.to_state()
                if outcome.state != "done":
                    continue
                jobs["merges"].remove(merge)
                node = _parent(agent_id, merge["node_id"], "merge", merge["level"], merge["children"], outcome.value,
                               job, self.config.llm.model)
                self.m_merges.inc()
                yield from self._emit_node(node)
                for start in tree.add(node.model_dump(mode="json"), self.fan_in, self.factory.budget):
                    self._open_merge(jobs, start)
                progressed = True
            now = now_ms()
            if jobs["global"] is None and tree.needs_global() and (
                final or now - jobs["last_global_ms"] >= self.refresh_ms
            ):
                frontier = tree.frontier()
                node_id, version = tree.next_global_id()
                jobs["global"] = {"node_id": node_id, "version": version, "children": frontier,
                                  "job": ReduceJob("global", [merge_entry(c) for c in frontier]).to_state()}
            if jobs["global"] is not None:
                spec = jobs["global"]
                job = ReduceJob.from_state(spec["job"])
                if len(spec["children"]) == 1:  # one node is its own global summary: no call needed
                    outcome = Outcome("done", value=spec["children"][0]["text"])
                else:
                    outcome = self._step_reduce(job, block=block, wait_once=wait_once)
                spec["job"] = job.to_state()
                if outcome.state == "done":
                    node = _parent(agent_id, spec["node_id"], "global", 0, spec["children"], outcome.value, job,
                                   self.config.llm.model, version=spec["version"])
                    tree.global_done([c["node_id"] for c in spec["children"]], spec["version"])
                    jobs["global"] = None
                    jobs["last_global_ms"] = now
                    self.m_globals.inc()
                    yield from self._emit_node(node)
                    progressed = True
            if not progressed:
                break
        _save(self.tree_state, tree.to_state())
        _save(self.jobs_state, jobs)
        waiting = [m["job"]["retry_at_ms"] for m in jobs["merges"]]
        if jobs["global"] is not None:
            waiting.append(jobs["global"]["job"]["retry_at_ms"])
        if waiting:
            self._poll_later(ctx, min(waiting))
        elif tree.needs_global():
            self._poll_later(ctx, jobs["last_global_ms"] + self.refresh_ms)


def _parent(agent_id: str, node_id: str, kind: str, level: int, children: list[dict[str, Any]], text: str,
            job: ReduceJob, model: str, version: int | None = None) -> SummaryNode:
    firsts = [c["first_ts"] for c in children if c.get("first_ts")]
    lasts = [c["last_ts"] for c in children if c.get("last_ts")]
    if kind == "global":
        level = max(c["level"] for c in children) + 1
    return SummaryNode(
        agent_id=agent_id, node_id=node_id, kind=kind, level=level,  # type: ignore[arg-type]
        children=[c["node_id"] for c in children], text=text, item_count=sum(c["item_count"] for c in children),
        first_ts=min(firsts) if firsts else None, last_ts=max(lasts) if lasts else None,
        model=",".join(job.models) or model, prompt_tokens=job.prompt_tokens,
        completion_tokens=job.completion_tokens, version=version, truncated=job.truncated,
    )
