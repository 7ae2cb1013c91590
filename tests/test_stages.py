"""The stage cores without Flink: planner, batcher and merger driven like the job drives them (stagekit)."""

import json
import math

import pytest
from stagekit import Pipeline, cfg, hold_plans, summary_answer

from flink_memory.migrations import encode_state
from flink_memory.records import MemoryUnit
from flink_memory.requests import ContextOverflow, LLMCallError
from flink_memory.stages.protocol import Culprit
from flink_memory.state import MemoryState, StateTransaction
from flink_memory.state_layout import StateVersionError


def item(agent, i, text=None, ts=None):
    record = {"agent_id": agent, "id": f"m{i}", "text": text or f"Fact {i} of {agent}: Person{i} paid {i} EUR."}
    if ts:
        record["ts"] = ts
    return record


def conversation(agent, name, turns=14):
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"[{name}] turn {t}: " + "we discuss the plan in detail " * 6})
        messages.append({"role": "assistant", "content": f"reply {t}: " + "noted, with numbers 12 and 7 " * 6})
    return {"agent_id": agent, "id": f"conv-{name}", "messages": messages}


def planner_answer(ends_every=3):
    """Summaries as usual; planning windows get a boundary every `ends_every` exchanges."""

    def answer(request):
        if request.kind != "plan":
            return summary_answer(request)
        last = int(request.messages[1][1].split(":")[0].split(" to ")[1])
        first = int(request.messages[1][1].split(" ")[1])
        ends = list(range(first + ends_every - 1, last, ends_every)) + [last]
        return summary_answer(request).__class__(text=json.dumps({"ends": ends}), prompt_tokens=10,
                                                 completion_tokens=5, model="fake")

    return answer


PLANNED = ("chunking.max_chunk_tokens=400",)


# --- planner ---------------------------------------------------------------------------------------------


def test_units_leave_in_input_order_behind_a_conversation_being_planned():
    calls = []

    def slow_planner(request):
        calls.append(request.kind)
        return planner_answer()(request)

    pipeline = Pipeline(cfg(*PLANNED, "batching.max_items=100"), slow_planner)
    pipeline.feed(item("a", 0), conversation("a", "x"), item("a", 1)).end()
    (batch,) = pipeline.nodes("batch")
    assert batch["children"][0] == "m0" and batch["children"][-1] == "m1"
    assert [c for c in batch["children"] if c.startswith("conv-x#")] == [
        f"conv-x#{k}" for k in range(len(batch["children"]) - 2)]
    (manifest,) = pipeline.manifests
    assert manifest.method == "semantic" and calls.count("plan") == 1


def test_a_duplicate_is_a_dead_letter_and_a_stored_plan_is_reused_without_a_call():
    pipeline = Pipeline(cfg(*PLANNED), planner_answer())
    pipeline.feed(conversation("a", "x"), item("a", 0)).settle()
    plans = pipeline.calls("plan")
    pipeline.feed(conversation("a", "x"), item("a", 0)).settle()
    assert [d.stage for d in pipeline.dead_letters] == ["duplicate", "duplicate"]
    same_text = dict(conversation("a", "x"), id="conv-copy")  # same exchanges under another id: plan reused
    pipeline.feed(same_text).end()
    assert pipeline.calls("plan") == plans
    assert [m.method for m in pipeline.manifests] == ["semantic", "semantic"]


def test_invalid_planner_output_falls_back_to_fixed_chunks_with_the_reason():
    pipeline = Pipeline(cfg(*PLANNED), lambda r: summary_answer(r) if r.kind != "plan" else summary_answer(r))
    pipeline.feed(conversation("a", "x")).end()
    (manifest,) = pipeline.manifests
    assert manifest.method == "fallback" and "invalid planner output" in manifest.reason
    assert len(pipeline.batch_units()["a"]) == len(manifest.chunks)


def test_under_raise_a_failing_planner_dead_letters_the_record_and_a_resend_is_planned_again():
    failing = {"on": True}

    def answer(request):
        if request.kind == "plan" and failing["on"]:
            raise LLMCallError("provider down")
        return planner_answer()(request)

    pipeline = Pipeline(cfg(*PLANNED, "chunking.on_planner_failure=raise"), answer)
    pipeline.feed(conversation("a", "x"), item("a", 1)).settle()
    (dead,) = pipeline.dead_letters
    assert dead.stage == "plan" and "provider down" in dead.reason
    failing["on"] = False
    pipeline.feed(conversation("a", "x")).end()  # sent again: planned, not "already accepted"
    assert len(pipeline.dead_letters) == 1
    assert [m.method for m in pipeline.manifests] == ["semantic"]
    assert "m1" in pipeline.batch_units()["a"]


def test_a_tampered_stored_plan_fails_closed():
    pipeline = Pipeline(cfg(*PLANNED), planner_answer())
    pipeline.feed(conversation("a", "x")).settle()
    state = pipeline.stages[0].state
    plans = state.maps[("a", "plans")]
    digest = next(iter(plans))
    stored = json.loads(plans[digest])
    manifest = json.loads(stored["manifest"])
    manifest["boundaries"][0] += 1
    plans[digest] = json.dumps({**stored, "manifest": json.dumps(manifest)})
    pipeline.feed(dict(conversation("a", "x"), id="conv-again")).end()
    assert [d.stage for d in pipeline.dead_letters] == ["plan"]
    assert "failed verification" in pipeline.dead_letters[0].reason


# --- batcher ---------------------------------------------------------------------------------------------


def test_bounded_input_closes_batches_by_count_and_the_tail_at_the_end_only():
    pipeline = Pipeline(cfg("batching.max_items=4", "batching.flush_after_s=1"))
    pipeline.feed(*[item("a", i) for i in range(10)]).settle()
    assert [len(b["children"]) for b in pipeline.nodes("batch")] == [4, 4]
    pipeline.advance(3600)  # no timeout on a bounded input: the tail waits for the end
    assert len(pipeline.nodes("batch")) == 2
    pipeline.end()
    assert [len(b["children"]) for b in pipeline.nodes("batch")] == [4, 4, 2]


def test_unbounded_input_closes_a_partial_batch_after_the_timeout():
    pipeline = Pipeline(cfg("batching.max_items=4", "batching.flush_after_s=30"), bounded=False)
    pipeline.feed(*[item("a", i) for i in range(3)]).settle()
    pipeline.advance(29)
    assert pipeline.nodes("batch") == []
    pipeline.advance(2)
    assert [b["children"] for b in pipeline.nodes("batch")] == [["m0", "m1", "m2"]]


def test_batches_leave_in_order_when_a_later_call_finishes_first():
    held = []

    def answer(request):
        if "Person0 " in request.messages[1][1] and not held:
            held.append(request)
            raise LLMCallError("slow first batch")  # retried after a backoff
        return summary_answer(request)

    pipeline = Pipeline(cfg("batching.max_items=2"), answer)
    pipeline.feed(*[item("a", i) for i in range(4)]).settle()
    assert pipeline.nodes("batch") == []  # batch 2 is done, but batch 1 is not: nothing leaves yet
    pipeline.end()
    assert [b["node_id"] for b in pipeline.nodes("batch")] == ["batch-000001", "batch-000002"]
    assert all(b["text"].startswith("Summary") for b in pipeline.summaries)


def test_provider_faults_during_the_end_of_input_are_retried_never_summarized():
    """The in-memory runner ends its input by the shell's rules alone (Driver.end_of_input): with two calls in
    three failing, every unit is still batched and the global covers them all."""
    state = {"n": 0}

    def flaky(request):
        state["n"] += 1
        if state["n"] % 3:
            raise LLMCallError("HTTP 503")
        return summary_answer(request)

    pipeline = Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2"), flaky)
    pipeline.feed(*[item("a", i) for i in range(10)]).end()
    assert sorted(u for units in pipeline.batch_units().values() for u in units) == sorted(f"m{i}" for i in range(10))
    assert all(n["text"].startswith("Summary") for n in pipeline.summaries)
    assert pipeline.current("a")["item_count"] == 10
    assert pipeline.current("a")["item_count"] == 10


def test_a_length_refusal_is_repacked_and_nothing_is_lost():
    seen = {"refused": 0}

    def small_window(request):
        if len(request.messages[1][1]) > 3000:  # a provider whose real window is smaller than configured
            seen["refused"] += 1
            raise ContextOverflow("exceeds the available context size")
        return summary_answer(request)

    pipeline = Pipeline(cfg("batching.max_items=50"), small_window)
    pipeline.feed(*[item("a", i, text=f"Fact {i}: " + "detail " * 30) for i in range(20)]).end()
    assert seen["refused"] >= 1
    assert len(pipeline.batch_units()["a"]) == 20


def test_adding_a_unit_writes_one_entry_not_the_whole_buffer():
    pipeline = Pipeline(cfg("batching.max_items=1000", "llm.context_window=100000"))
    written = []
    backend = pipeline.stages[1].state
    original = backend.write_entry

    def counting(name, key, raw):
        written.append(len(raw or ""))
        original(name, key, raw)

    backend.write_entry = counting
    pipeline.feed(*[item("a", i) for i in range(200)]).settle()
    # per input: the unit and where it is (for retractions), however many are buffered
    assert len(written) == 2 * 200 and max(written) < 400


def test_a_unit_that_closes_no_batch_reads_no_pending_batch():
    """Batches leave when one is summarized (a wake); a state read per unit would cost a JVM call each."""
    pipeline = Pipeline(cfg("batching.max_items=2"))
    pipeline.feed(item("a", 0), item("a", 1))  # batch 1 is closed and in flight
    backend = pipeline.stages[1].state
    reads, original = [], backend.read_entry
    backend.read_entry = lambda name, key: reads.append(name) or original(name, key)
    pipeline.feed(item("a", 2))
    assert reads == []
    pipeline.settle()
    assert [b["children"] for b in pipeline.nodes("batch")] == [["m0", "m1"]]


# --- merger ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("per_agent", "max_items", "fan_in"), [(40, 25, 8), (200, 5, 4), (7, 50, 8)])
def test_a_bounded_input_costs_batches_merges_and_one_global_per_agent(per_agent, max_items, fan_in):
    pipeline = Pipeline(cfg(f"batching.max_items={max_items}", f"summarization.fan_in={fan_in}"))
    pipeline.feed(*[item(a, i) for i in range(per_agent) for a in ("a", "b", "c")]).end()
    batches = math.ceil(per_agent / max_items)
    assert pipeline.calls("batch") == 3 * batches
    assert pipeline.calls("merge") == len(pipeline.nodes("merge"))
    assert pipeline.calls("merge") <= 3 * math.ceil(batches / (fan_in - 1))
    assert pipeline.calls("global") == (3 if batches > 1 else 0)  # one node is its own global
    for agent in "abc":
        assert pipeline.current(agent)["item_count"] == per_agent
        assert [n["version"] for n in pipeline.nodes("global") if n["agent_id"] == agent] == [1]


def test_unbounded_globals_refresh_at_most_once_per_interval_and_once_more_at_the_end():
    pipeline = Pipeline(cfg("batching.max_items=2", "summarization.fan_in=8", "summarization.global_refresh_s=60"),
                        bounded=False)
    for minute in range(5):
        pipeline.feed(*[item("a", 10 * minute + i) for i in range(4)]).settle().advance(20)
    refreshes = len(pipeline.nodes("global"))
    assert 1 <= refreshes <= math.ceil(5 * 20 / 60)
    pipeline.end()
    assert len(pipeline.nodes("global")) == refreshes + 1
    assert pipeline.current("a")["item_count"] == 20


def test_no_global_while_a_merge_that_changes_the_frontier_runs():
    held = {"merge": True}

    def answer(request):
        if request.kind == "merge" and held["merge"]:
            raise LLMCallError("busy")
        return summary_answer(request)

    pipeline = Pipeline(cfg("batching.max_items=1", "summarization.fan_in=2", "summarization.global_refresh_s=0"),
                        answer, bounded=False)
    pipeline.feed(item("a", 0), item("a", 1)).settle()
    # the first batch alone was the memory for a moment; then the merge of both is pending: no global of them
    assert [n["children"] for n in pipeline.nodes("global")] == [["batch-000001"]]
    held["merge"] = False
    pipeline.advance(10)
    assert [n["children"] for n in pipeline.nodes("global")] == [["batch-000001"], ["merge-L2-000001"]]


def test_depth_single_gives_a_global_from_the_batch_summaries():
    pipeline = Pipeline(cfg("batching.max_items=2", "summarization.depth=single"))
    pipeline.feed(*[item("a", i) for i in range(6)]).end()
    assert pipeline.nodes("merge") == []
    assert pipeline.current("a")["children"] == ["batch-000001", "batch-000002", "batch-000003"]


# --- state -----------------------------------------------------------------------------------------------


def test_a_state_of_an_unknown_version_is_refused():
    pipeline = Pipeline(cfg("batching.max_items=5"))
    pipeline.feed(item("a", 0)).settle()
    backend = pipeline.stages[1].state
    backend.values[("a", "batcher_buffer")] = backend.values[("a", "batcher_buffer")].replace('"v":2', '"v":3')
    with pytest.raises(StateVersionError, match="version 3"):
        pipeline.feed(item("a", 1))


def test_release_0_1_0_state_is_migrated_and_its_work_finishes():
    """Each stage's version-1 values (one JSON list or object per stage) become typed entries on first use."""
    config = cfg("batching.max_items=3", "summarization.fan_in=2", *PLANNED)
    pipeline = Pipeline(config, planner_answer())
    convo = conversation("a", "old")
    planner, batcher, merger = (stage.state for stage in pipeline.stages)
    unit = {"agent_id": "a", "unit_id": "m9", "source_id": "m9", "text": "Fact 9 of a.", "ts": None, "oversized": False}
    planner.values[("a", "queue")] = encode_state([{"payload": json.dumps({**convo, "kind": "conversation",
                                                                          "ts": None, "metadata": {}}),
                                                    "job": None}])
    batcher.values[("a", "buffer")] = encode_state({"units": [unit], "tokens": 12, "opened_at_ms": 5})
    batcher.values[("a", "pending")] = encode_state({"next_seq": 3, "batches": []})
    node = {"agent_id": "a", "node_id": "batch-000001", "kind": "batch", "level": 1, "children": ["m1"],
            "text": "Summary: old", "item_count": 1, "model": "m"}
    merger.values[("a", "tree")] = encode_state({"agent_id": "a", "levels": [[{"node": node, "job": None}]],
                                                 "merges_per_level": [], "global_version": 0,
                                                 "global_children": []})
    merger.values[("a", "jobs")] = encode_state({"merges": [], "global": None, "last_global_ms": 0})
    pipeline.end()
    assert not any(name in ("queue", "buffer", "pending", "tree", "jobs") for (_, name) in
                   list(planner.values) + list(batcher.values) + list(merger.values))
    units = pipeline.batch_units()["a"]
    assert units[0] == "m9" and any(u.startswith("conv-old#") for u in units)
    assert pipeline.nodes("batch")[0]["node_id"] == "batch-000003"  # numbering goes on from release 0.1.0
    assert pipeline.current("a")["item_count"] == 1 + len(units)


def test_an_activation_that_raises_leaves_the_state_as_it_was():
    state = MemoryState()
    state.current_key = "a"
    from flink_memory.stages.batcher import BatcherCore

    core = BatcherCore(cfg("batching.max_items=2"), Pipeline(cfg()).factory)
    tx = StateTransaction(core.schema, state, "a")
    core.on_input(tx, MemoryUnit(agent_id="a", unit_id="u", source_id="u", text="t"), {}, 0)
    assert state.values == {} and state.maps == {}  # nothing reaches the backend before commit
    tx.commit()
    assert state.values and state.maps


def test_a_tampered_plan_in_progress_fails_closed():
    """A conversation whose planning is under way when the state is altered: never used, a dead letter."""
    pipeline = Pipeline(cfg(*PLANNED, "chunking.planner_window_tokens=300"), planner_answer())
    pipeline.answer = _raiser  # the first window fails: the plan waits in state for its retry
    pipeline.feed(conversation("a", "x", turns=30))
    queue = pipeline.stages[0].state.maps[("a", "planner_queue")]
    (key,) = queue
    entry = json.loads(queue[key])
    entry["job"]["accepted"] = [0]
    queue[key] = json.dumps(entry)
    pipeline.answer = planner_answer()
    pipeline.advance(600)
    (dead,) = pipeline.dead_letters
    assert dead.stage == "plan" and "plan in progress failed verification" in dead.reason
    assert pipeline.manifests == []


def _raiser(request):
    raise LLMCallError("provider down for now")


def test_every_retention_mode_traces_a_global_to_its_batches_through_written_nodes():
    for retention in ("all", "batch_and_global"):
        pipeline = Pipeline(cfg("batching.max_items=2", "summarization.fan_in=2",
                                f"summarization.retention={retention}"))
        pipeline.feed(*[item("a", i) for i in range(9)]).end()
        written = {n["node_id"]: n for n in pipeline.summaries}
        reached, frontier = set(), [pipeline.current("a")["node_id"]]
        while frontier:
            node = written[frontier.pop()]
            for child in node["children"]:
                if node["kind"] != "batch":
                    assert child in written, (retention, child)
                    frontier.append(child)
            if node["kind"] == "batch":
                reached.add(node["node_id"])
        assert reached == {n["node_id"] for n in pipeline.nodes("batch")}, retention


def test_an_error_on_a_queued_record_is_blamed_on_it_and_evicting_it_spares_the_others():
    """The poison waits behind a conversation being planned; the record that wakes the queue is innocent."""
    from flink_memory.stages.calls import RecordFault

    pipeline = Pipeline(cfg(*PLANNED, "batching.max_items=100", "job.inject_failure=record:a/m1"), planner_answer())
    in_flight = hold_plans(pipeline)
    pipeline.feed(conversation("a", "x"), item("a", 1), item("a", 2))  # m1 and m2 queue behind the plan
    in_flight.held.clear()
    with pytest.raises(RecordFault) as caught:
        pipeline.feed(item("a", 3))  # the drain reaches m1
    assert json.loads(caught.value.payload)["id"] == "m1" and caught.value.seq is not None
    planner = pipeline.stages[0]  # what the shell does when the error comes again: exactly m1 goes
    effects = planner.run("a", lambda st: planner.core.evict(st, "internal error", Culprit(seq=caught.value.seq)))
    assert [d.record_id for d in effects.dead_letters] == ["m1"]
    pipeline.feed(item("a", 3)).end()  # the activation again: m3 is handled, and so is everything queued
    units = pipeline.batch_units()["a"]
    assert "m1" not in units and {"m2", "m3"} <= set(units) and any(u.startswith("conv-x#") for u in units)
    assert [d.record_id for d in pipeline.dead_letters] == []  # (the eviction's went to the shell)
