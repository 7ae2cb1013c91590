"""Memory that changes, on the stage cores: updates, re-deliveries, deletions, forgetting, sealing, and what
a change costs. The summarizer keeps every line it is given, so a node's text shows which facts it holds."""

import math
from collections import Counter

import pytest
from stagekit import Pipeline, cfg, hold_plans, keeping_answer, live, summary_answer

from flink_memory.requests import LLMCallError
from flink_memory.stages.merger import JOINED_MODEL


def item(agent, i, fact=None):
    return {"agent_id": agent, "id": f"m{i}", "text": fact or f"Fact{i} of {agent}: Person{i} paid {i} EUR."}


def conversation(agent, name, turns, edit=None):
    messages = []
    for t in range(turns):
        text = f"[{name}] turn {t}: " + "we discuss the plan in detail " * 6
        if edit and t == edit[0]:
            text = edit[1]
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": f"reply {t}: " + "noted, with numbers 12 and 7 " * 6})
    return {"agent_id": agent, "id": f"conv-{name}", "messages": messages}


def live_units(pipeline, agent):
    """Units of the agent's live batch nodes, with how often each is covered."""
    return Counter(u for n in live(pipeline.summaries) if n["agent_id"] == agent and n["kind"] == "batch"
                   for u in n["children"])


def live_text(pipeline, agent):
    return "\n".join(n["text"] for n in live(pipeline.summaries) if n["agent_id"] == agent)


def run(*settings, bounded=True, answer=keeping_answer):
    return Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2", *settings), answer, bounded=bounded)


def test_an_update_supersedes_the_fact_everywhere_and_a_redelivery_costs_nothing():
    pipeline = run().feed(*[item("a", i) for i in range(7)]).end()
    calls = len(pipeline.sent)
    pipeline.feed(item("a", 0)).end()  # the same record again: accounted for, nothing else
    assert len(pipeline.sent) == calls and [d.stage for d in pipeline.dead_letters] == ["duplicate"]
    pipeline.feed(item("a", 4, fact="Fact4 of a: Person4 paid 999 EUR, corrected.")).end()
    assert live_units(pipeline, "a") == Counter(f"m{i}" for i in range(7))  # every live unit exactly once
    text = live_text(pipeline, "a")
    assert "999 EUR, corrected" in text and "paid 4 EUR" not in text
    current = pipeline.current("a")
    assert current["item_count"] == 7 and "999 EUR" in current["text"] and "paid 4 EUR" not in current["text"]
    # only the globals' versions grow; the old global is replaced too
    assert [n["node_id"] for n in live(pipeline.summaries) if n["kind"] == "global"] == [current["node_id"]]


def test_a_grown_and_edited_conversation_is_planned_again_in_full():
    answer = keeping_answer
    pipeline = Pipeline(cfg("chunking.max_chunk_tokens=400", "batching.max_items=4", "summarization.fan_in=2",
                            "chunking.semantic=false"), answer)
    pipeline.feed(conversation("a", "x", 10), item("a", 1)).end()
    (first,) = pipeline.manifests
    pipeline.feed(conversation("a", "x", 14, edit=(2, "[x] turn 2: the budget is now 61 EUR"))).end()
    update = pipeline.manifests[-1]
    assert update.replaces_input_digest == first.input_digest
    assert "planned again in full" in update.replace_reason
    units = live_units(pipeline, "a")
    assert units == Counter(["m1"] + [f"conv-x#{k}" for k in range(len(update.chunks))])
    text = live_text(pipeline, "a")
    assert "budget is now 61 EUR" in text and "[x] turn 2: we discuss" not in text and "[x] turn 13" in text


def test_a_deletion_retracts_and_an_unknown_id_is_a_dead_letter():
    pipeline = run().feed(*[item("a", i) for i in range(6)]).end()
    pipeline.feed({"agent_id": "a", "id": "m2", "deleted": True}, {"agent_id": "a", "id": "nope", "deleted": True})
    pipeline.end()
    assert live_units(pipeline, "a") == Counter(f"m{i}" for i in range(6) if i != 2)
    assert "Person2 " not in live_text(pipeline, "a") and pipeline.current("a")["item_count"] == 5
    (dead,) = pipeline.dead_letters
    assert dead.stage == "change" and dead.reason.startswith("unknown id") and dead.record_id == "nope"


def test_deleting_every_unit_of_a_batch_leaves_an_empty_replacement():
    pipeline = run().feed(*[item("a", i) for i in range(6)]).end()
    pipeline.feed(*[{"agent_id": "a", "id": f"m{i}", "deleted": True} for i in range(3)]).end()
    empty = [n for n in live(pipeline.summaries) if n["kind"] == "batch" and not n["children"]]
    assert [n["item_count"] for n in empty] == [0] and "batch-000001" in empty[0]["replaces"]
    assert pipeline.current("a")["item_count"] == 3 and "Person0 " not in pipeline.current("a")["text"]


def test_forgetting_an_agent_replaces_everything_it_had():
    pipeline = run().feed(*[item("a", i) for i in range(9)], *[item("b", i) for i in range(4)]).end()
    before = {n["node_id"] for n in live(pipeline.summaries) if n["agent_id"] == "a"}
    pipeline.feed({"agent_id": "a", "forget": True}).end()
    current = pipeline.current("a")
    assert current["text"] == "" and current["item_count"] == 0 and set(current["replaces"]) == before
    assert [n["node_id"] for n in live(pipeline.summaries) if n["agent_id"] == "a"] == [current["node_id"]]
    assert pipeline.current("b")["item_count"] == 4  # another agent is untouched
    pipeline.feed(item("a", 0)).end()  # the id is free again; new nodes get new ids
    ids = [n["node_id"] for n in pipeline.summaries if n["agent_id"] == "a"]
    assert len(ids) == len(set(ids)) and pipeline.current("a")["item_count"] == 1


@pytest.mark.parametrize("batches", [1, 8, 64, 512])
def test_an_update_costs_a_path_not_the_memory(batches):
    """One batch per item, fan-in 8: an update re-summarizes its batch, each ancestor and the global."""
    pipeline = Pipeline(cfg("batching.max_items=1", "summarization.fan_in=8"), summary_answer)
    pipeline.feed(*[item("a", i) for i in range(batches)]).end()
    before = len(pipeline.sent)
    pipeline.feed(item("a", batches // 2, fact="Fact changed: Person paid 1 EUR.")).end()
    cost = len(pipeline.sent) - before
    bound = (math.ceil(math.log(batches, 8)) if batches > 1 else 0) + 2
    assert 1 <= cost <= bound, (cost, bound)
    assert live_units(pipeline, "a") == Counter(f"m{i}" for i in range(batches))
    # the old unit's batch is replaced by an empty node, the new version is a new batch
    (emptied,) = [n for n in live(pipeline.summaries) if n["replaces"] == [f"batch-{batches // 2 + 1:06d}"]]
    assert emptied["item_count"] == 0 and emptied["text"] == ""
    (added,) = [n for n in live(pipeline.summaries) if n["children"] == [f"m{batches // 2}"]]
    assert "Fact changed" in added["text"] and pipeline.current("a")["item_count"] == batches


def test_changes_to_a_sealed_record_are_refused_and_state_stays_bounded():
    pipeline = run("memory.editable_for=100", bounded=False)
    pipeline.feed(*[item("a", i) for i in range(6)]).advance(30)
    pipeline.advance(101)
    pipeline.feed(item("a", 1, fact="too late"), {"agent_id": "a", "id": "m2", "deleted": True}).settle()
    assert [d.stage for d in pipeline.dead_letters] == ["change", "change"]
    assert all(d.reason.startswith("sealed") for d in pipeline.dead_letters)
    assert "too late" not in live_text(pipeline, "a")


def test_a_long_stream_keeps_state_per_agent_bounded():
    """Ten editable windows of input: the state of each stage stops growing after the first two."""
    pipeline = run("memory.editable_for=60", "batching.flush_after_s=5", "summarization.global_refresh_s=30",
                   bounded=False, answer=summary_answer)
    sizes = []
    for step in range(40):
        pipeline.feed(*[item("a", 10 * step + i) for i in range(10)]).settle().advance(15)
        if step in (9, 19, 39):
            sizes.append(sum(stage.state.size("a") for stage in pipeline.stages))
    assert sizes[2] <= 1.3 * sizes[0], sizes
    assert pipeline.end().current("a")["item_count"] == 400


def test_records_queued_behind_a_forget_survive_it():
    """A forget waiting behind a conversation being planned drops what came before it, not what came after."""
    pipeline = Pipeline(cfg("chunking.max_chunk_tokens=400", "batching.max_items=3", "summarization.fan_in=2"),
                        keeping_answer)
    in_flight = hold_plans(pipeline)
    pipeline.feed(item("a", 0), conversation("a", "x", 10), {"agent_id": "a", "forget": True}, item("a", 1),
                  item("a", 2))
    assert in_flight.held  # the conversation is being planned: the forget and what follows wait behind it
    in_flight.held.clear()
    pipeline.end()
    assert not pipeline.dead_letters
    assert live_units(pipeline, "a") == Counter(["m1", "m2"])
    text = live_text(pipeline, "a")
    assert "Person1 " in text and "Person2 " in text and "Person0 " not in text and "[x]" not in text


def test_deleting_everything_a_global_covered_leaves_an_empty_current_global():
    pipeline = run().feed(item("a", 0, "secret alpha"), item("a", 1, "secret beta")).end()
    assert "secret alpha" in pipeline.current("a")["text"]
    pipeline.feed({"agent_id": "a", "id": "m0", "deleted": True}, {"agent_id": "a", "id": "m1", "deleted": True}).end()
    current = pipeline.current("a")
    assert current["text"] == "" and current["item_count"] == 0
    assert "secret" not in live_text(pipeline, "a")
    pipeline.feed(item("a", 2, "fresh gamma")).end()  # memory grows again from nothing
    assert "fresh gamma" in pipeline.current("a")["text"] and pipeline.current("a")["item_count"] == 1


def test_a_revision_that_keeps_failing_gives_up_without_leaving_the_retracted_text_live():
    """An error of ours while a batch is summarized again: evicting the agent's work ends that revision too."""
    pipeline = run().feed(*[item("a", i) for i in range(3)]).end()

    def broken(request):
        raise ValueError("a bug of ours")

    pipeline.answer = broken
    with pytest.raises(ValueError):
        pipeline.feed({"agent_id": "a", "id": "m1", "deleted": True})
        pipeline.end()
    batcher = pipeline.stages[1]
    effects = batcher.run("a", lambda st: batcher.core.evict(st, "internal error"))
    assert sorted(d.record_id for d in effects.dead_letters) == ["m0", "m2"]
    for payload in effects.out:
        pipeline._deliver(2, "a", payload)  # to the merger, as the shell would
    pipeline.answer = keeping_answer
    pipeline.end()  # nothing is left failing
    assert "Person1 " not in live_text(pipeline, "a") and live_units(pipeline, "a") == Counter()
    assert pipeline.current("a")["item_count"] == 0


def test_the_first_node_of_an_agent_already_schedules_the_mergers_sweep():
    """The merger's clock is created by the first node's activation; the sweep it schedules must not be lost."""
    pipeline = run("batching.max_items=1", bounded=False).feed(item("a", 0)).settle()
    assert (2, "a") in pipeline.sweeps  # (stage index, agent)


def test_a_merge_revision_that_keeps_failing_is_joined_so_no_retracted_text_stays_live():
    """An error of ours while a merge is made again: evicting it makes the merge from its children's texts
    without a call, which still replaces the old merge (that held the retracted fact)."""
    pipeline = run().feed(*[item("a", i) for i in range(5)]).end()  # batches m0-m2 and m3-m4, one merge
    assert [n["node_id"] for n in pipeline.nodes("merge")] == ["merge-L2-000001"]

    def broken_merges(request):
        if request.kind == "merge":
            raise ValueError("a bug of ours")
        return keeping_answer(request)

    pipeline.answer = broken_merges
    with pytest.raises(ValueError):
        pipeline.feed({"agent_id": "a", "id": "m1", "deleted": True})
        pipeline.end()
    merger = pipeline.stages[2]
    pipeline._activate(2, "a", lambda st: merger.core.evict(st, "internal error"))
    assert [(d.stage, d.record_id) for d in pipeline.dead_letters] == [("internal", "merge-L2-000001-r1")]
    pipeline.answer = keeping_answer
    pipeline.end()
    assert "Person1 " not in live_text(pipeline, "a")
    assert live_units(pipeline, "a") == Counter(["m0", "m2", "m3", "m4"])
    current = pipeline.current("a")["text"]
    assert all(f"Person{i} " in current for i in (0, 2, 3, 4)) and "Person1 " not in current
    assert [n["node_id"] for n in live(pipeline.summaries) if n["model"] == JOINED_MODEL] == ["merge-L2-000001-r1"]


def test_a_new_merge_that_keeps_failing_is_joined_and_its_children_stay_in_the_memory():
    pipeline = run(answer=lambda request: (_ for _ in ()).throw(ValueError("a bug of ours"))
                   if request.kind == "merge" else keeping_answer(request))
    with pytest.raises(ValueError):
        pipeline.feed(*[item("a", i) for i in range(6)]).end()  # two full batches: their merge fails
    merger = pipeline.stages[2]
    pipeline._activate(2, "a", lambda st: merger.core.evict(st, "internal error"))
    pipeline.answer = keeping_answer
    pipeline.end()
    assert [(d.stage, d.record_id) for d in pipeline.dead_letters] == [("internal", "merge-L2-000001")]
    assert all(f"Person{i} " in pipeline.current("a")["text"] for i in range(6))
    assert pipeline.current("a")["item_count"] == 6


class Outage:
    """A provider that fails the calls of one kind while `down`."""

    def __init__(self, kind, down=False):
        self.kind, self.down = kind, down

    def __call__(self, request):
        if request.kind == self.kind and self.down:
            raise LLMCallError("provider outage")
        return keeping_answer(request)


def assert_only_m0_left(pipeline, items):
    assert "Person0 " not in live_text(pipeline, "a")
    assert live_units(pipeline, "a") == Counter(f"m{i}" for i in range(1, items))
    assert pipeline.current("a")["item_count"] == items - 1


def delete_m0_during_an_outage_past_its_seal(kind, items):
    """m0 is deleted 5 s before it seals, and calls of `kind` fail for 30 s: the merger's sweeps run meanwhile."""
    outage = Outage(kind)
    pipeline = run("memory.editable_for=100", bounded=False, answer=outage)
    pipeline.feed(*[item("a", i) for i in range(items)]).settle().advance(95)
    outage.down = True
    pipeline.feed({"agent_id": "a", "id": "m0", "deleted": True}).settle()
    pipeline.advance(30)
    outage.down = False
    return pipeline.advance(400).end()


def test_the_sweep_keeps_the_children_of_a_merge_still_being_made():
    """A merge waiting out a provider outage: a sweep meanwhile must keep its children, or a later deletion
    below it finds nothing to replace and the deleted text stays live in the merge."""
    outage = Outage("merge", down=True)
    pipeline = run("memory.editable_for=100", bounded=False, answer=outage)
    pipeline.feed(*[item("a", i) for i in range(6)]).settle()  # two batches; their merge fails and waits
    pipeline.advance(11)  # the merger's sweep runs while the merge is still being made
    pipeline.feed({"agent_id": "a", "id": "m0", "deleted": True}).settle()
    outage.down = False
    assert_only_m0_left(pipeline.advance(400).end(), 6)


def test_an_update_sealed_while_it_was_planned_is_refused_whole():
    """Accepted 5 s before its old version seals, planned for 20 s: the old version's batches were sealed
    meanwhile, so the update cannot retract them. It goes to dead-letters; the old version stays alone."""
    pipeline = run("chunking.max_chunk_tokens=400", "memory.editable_for=100", "batching.flush_after_s=5",
                   bounded=False)
    pipeline.feed(conversation("a", "x", 10)).settle().advance(6).advance(89)  # t = 95 s: still editable
    in_flight = hold_plans(pipeline)
    pipeline.feed(conversation("a", "x", 10, edit=(2, "[x] turn 2: the budget is now 61 EUR")))
    assert in_flight.held and not pipeline.dead_letters  # accepted: its plan is being made
    pipeline.now += 20_000  # the stages' sweeps run while the plan call does
    for index in (1, 2):
        core = pipeline.stages[index].core
        pipeline._activate(index, "a", lambda st, c=core: c.on_wake(st, pipeline.finished, pipeline.now))
    in_flight.held.clear()
    pipeline.settle().advance(6).advance(40)
    assert [(d.stage, d.record_id) for d in pipeline.dead_letters] == [("change", "conv-x")]
    assert "while this update was planned" in pipeline.dead_letters[0].reason
    text = live_text(pipeline, "a")
    assert "[x] turn 2: we discuss" in text and "61 EUR" not in text


def test_a_revision_that_outlasts_the_mergers_sweep_still_finds_its_place():
    """The batch's new summary waits out the outage: the merger was told the batch is being made again, so
    it keeps the batch and the merge above it until the new node arrives, and the merge is made again."""
    pipeline = delete_m0_during_an_outage_past_its_seal("batch", 6)
    assert not pipeline.dead_letters
    assert_only_m0_left(pipeline, 6)


@pytest.mark.parametrize("change", [
    [{"agent_id": "a", "id": "m1", "deleted": True}],
    [item("a", 1, fact="Fact1 of a: Person1 paid 77 EUR, corrected.")],
    [{"agent_id": "a", "id": f"m{i}", "deleted": True} for i in range(3)],  # the whole batch
])
def test_a_change_gives_the_same_nodes_whether_it_reaches_a_batch_before_or_after_its_summary(change):
    """Node ids depend on the input's order only, never on when calls end: a replay after a failure (where a
    change can reach a batch whose call the first attempt had already finished) writes the same ids, so a
    store written ahead of the changelog holds no node the replay does not write again."""
    def live_nodes(pipeline):
        return {n["node_id"]: (n["text"], n["children"]) for n in live(pipeline.summaries) if n["kind"] == "batch"}

    early = run().feed(*[item("a", i) for i in range(6)], *change).end()  # its call has not ended yet
    late = run().feed(*[item("a", i) for i in range(6)]).settle().feed(*change).end()
    assert live_nodes(early) == live_nodes(late)
    written_late = {n["node_id"]: n["text"] for n in late.summaries if n["kind"] == "batch"}
    assert all(written_late.get(n["node_id"]) == n["text"] for n in early.summaries if n["kind"] == "batch")


def _a_bug_of_ours(request):
    raise ValueError("a bug of ours")


def test_an_evicted_revision_counts_the_changes_that_reached_it():
    pipeline = run().feed(*[item("a", i) for i in range(6)]).end()
    pipeline.answer = _a_bug_of_ours
    pipeline.feed(*[{"agent_id": "a", "id": f"m{i}", "deleted": True} for i in range(2)])  # during its revision
    with pytest.raises(ValueError):
        pipeline.end()
    batcher = pipeline.stages[1]
    effects = batcher.run("a", lambda st: batcher.core.evict(st, "internal error"))
    [node] = [out.model_dump() for out in effects.out]
    assert node["node_id"] == "batch-000001-r2" and set(node["replaces"]) == {"batch-000001", "batch-000001-r1"}


def test_a_store_ahead_of_a_replay_that_evicts_keeps_no_retracted_text():
    """The first attempt writes r1 and r2, then a bug; the replay takes all three changes during one call
    and is evicted (the bug came again): its empty node must replace what the first attempt wrote."""
    def deleted(i):
        return {"agent_id": "a", "id": f"m{i}", "deleted": True}

    first = run("batching.max_items=4").feed(*[item("a", i) for i in range(8)]).end()
    first.feed(deleted(0)).settle().feed(deleted(1)).settle()
    first.answer = _a_bug_of_ours
    first.feed(deleted(2))
    with pytest.raises(ValueError):
        first.end()
    replay = run("batching.max_items=4").feed(*[item("a", i) for i in range(8)]).end()
    replay.answer = _a_bug_of_ours
    replay.feed(deleted(0), deleted(1), deleted(2))
    with pytest.raises(ValueError):
        replay.end()
    replay._activate(1, "a", lambda st: replay.stages[1].core.evict(st, "internal error"))
    replay.answer = keeping_answer
    replay.end()
    store = {n["node_id"]: n for n in first.summaries} | {n["node_id"]: n for n in replay.summaries}
    texts = [n["text"] for n in live(list(store.values())) if n["kind"] == "batch"]
    assert not any(f"Person{i} " in t for t in texts for i in range(4)), texts


def test_a_revision_running_in_state_of_the_previous_release_counts_as_a_change():
    from flink_memory.stages.batcher import DONE, _key
    from flink_memory.stages.calls import Effects

    pipeline = run().feed(*[item("a", i) for i in range(6)]).end()
    pipeline.answer = lambda request: (_ for _ in ()).throw(LLMCallError("down"))
    pipeline.feed({"agent_id": "a", "id": "m0", "deleted": True})
    batcher = pipeline.stages[1]

    def as_restored(state):  # release 0.2.0 kept no target
        done = state.entry(DONE, _key(1))
        assert done.target == 1 and done.job is not None
        state.put(DONE, _key(1), done.model_copy(update={"target": 0}))
        return Effects()

    batcher.run("a", as_restored)
    pipeline.answer = keeping_answer
    pipeline.feed({"agent_id": "a", "id": "m1", "deleted": True}).end()
    assert [n["node_id"] for n in pipeline.nodes("batch") if n["node_id"].startswith("batch-000001-")] == [
        "batch-000001-r2"]


def test_a_global_of_batch_and_global_names_only_batches_that_were_written():
    """A batch whose units were all deleted before its summary leaves as the empty node it would have become
    after it: no global may name a batch id that was never written."""
    pipeline = run("summarization.retention=batch_and_global")
    pipeline.feed(*[item("a", i) for i in range(3)], *[{"agent_id": "a", "id": f"m{i}", "deleted": True}
                                                      for i in range(3)], *[item("a", i) for i in range(3, 6)]).end()
    written = {n["node_id"]: n for n in pipeline.summaries}
    assert "batch-000001" not in written and written["batch-000001-r3"]["item_count"] == 0
    current = pipeline.current("a")
    assert set(current["children"]) <= set(written) and current["item_count"] == 3
    assert [n["node_id"] for n in live(pipeline.summaries) if n["item_count"]] == ["batch-000002", current["node_id"]]


def test_a_merge_made_again_that_outlasts_the_sweep_still_replaces_the_old_one():
    """Deeper: the batch is summarized again at once, but the merge above it waits out the outage. The merge
    it remakes, its siblings and the merges above stay until the new one arrives."""
    assert_only_m0_left(delete_m0_during_an_outage_past_its_seal("merge", 12), 12)


@pytest.mark.parametrize("retention", ["all", "batch_and_global", "global_only"])
def test_a_forget_names_the_live_nodes_not_every_revision_and_global_ever_written(retention):
    """Its size follows the memory: older revisions and globals are already replaced by what followed them."""
    pipeline = run(f"summarization.retention={retention}").feed(*[item("a", i) for i in range(7)]).end()
    for k in range(4):  # four corrections of one fact: four revisions of its batch and its merges, new globals
        pipeline.feed(item("a", 4, fact=f"Fact4 of a: Person4 paid {100 + k} EUR.")).end()
    written = {n["node_id"] for n in pipeline.summaries if n["agent_id"] == "a"}
    before = {n["node_id"] for n in live(pipeline.summaries) if n["agent_id"] == "a"}
    assert len(written) >= len(before) + 4
    pipeline.feed({"agent_id": "a", "forget": True}).end()
    current = pipeline.current("a")
    assert set(current["replaces"]) == before
    assert [n["node_id"] for n in live(pipeline.summaries) if n["agent_id"] == "a"] == [current["node_id"]]


@pytest.mark.parametrize("then", ["forget", "new input"])
def test_an_agent_restored_from_release_0_1_0_leaves_none_of_its_old_nodes_live(then):
    """Release 0.1.0 kept only the frontier (batch 5 above a merge of batches 1-4): batches missing from its
    tree were written and merged, not skipped, so a forget must still replace them. Its globals named no
    predecessor (it had no `replaces`): a forget, or the next global, replaces all of them."""
    from flink_memory.migrations import encode_state

    pipeline = run("batching.max_items=1")

    def node(node_id, kind, level, items, version=None):
        return {"agent_id": "a", "node_id": node_id, "kind": kind, "level": level, "children": [],
                "text": f"Summary {node_id}", "item_count": items, "model": "m", "version": version}

    old_globals = [node(f"global-v{v:06d}", "global", 3, 5, v) for v in (1, 2, 3)]  # in its changelog
    merger = pipeline.stages[2].state
    merger.values[("a", "tree")] = encode_state({"levels": [
        [{"node": node("batch-000005", "batch", 1, 1), "job": None}],
        [{"node": node("merge-L2-000002", "merge", 2, 4), "job": None}]],
        "merges_per_level": [0, 2], "global_version": 3, "global_children": []})
    merger.values[("a", "jobs")] = encode_state({"merges": [], "global": None, "last_global_ms": 0})
    pipeline.stages[1].state.values[("a", "pending")] = encode_state({"next_seq": 6, "batches": []})
    pipeline.feed({"agent_id": "a", "forget": True} if then == "forget" else item("a", 9)).end()
    current = pipeline.current("a")
    live_globals = [n["node_id"] for n in live(old_globals + pipeline.summaries) if n["kind"] == "global"]
    assert live_globals == [current["node_id"]] == ["global-v000004"]
    if then == "forget":
        assert all(f"batch-{n:06d}" in current["replaces"] for n in range(1, 6))


def test_a_second_forget_names_only_what_came_after_the_first():
    pipeline = run().feed(*[item("a", i) for i in range(9)]).end()
    pipeline.feed({"agent_id": "a", "forget": True}).end()
    pipeline.feed(*[item("a", i, fact=f"New fact {i}") for i in range(9)]).end()
    before = {n["node_id"] for n in live(pipeline.summaries) if n["agent_id"] == "a"}
    pipeline.feed({"agent_id": "a", "forget": True}).end()
    assert set(pipeline.current("a")["replaces"]) == before
