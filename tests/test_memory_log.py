"""Memory units reach the store when the batcher accepts them, and leave it when they are retracted, evicted
or forgotten; a sealed unit stays. On the stage cores (tests/stagekit.py) and on a real store."""

import pytest
from stagekit import Pipeline, cfg, keeping_answer, live

from flink_memory.memory_log import UnitRows
from flink_memory.stages.channels import MEMORY_LOG
from flink_memory.store import open_store


def item(agent, i, fact=None):
    return {"agent_id": agent, "id": f"m{i}", "text": fact or f"Fact{i} of {agent}: Person{i} paid {i} EUR."}


def run(*settings, bounded=False):
    return Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2", "batching.flush_after_s=60", *settings),
                    keeping_answer, bounded=bounded)


def test_a_unit_is_a_store_row_as_soon_as_the_batcher_accepts_it():
    pipeline = run().feed(item("a", 0), item("b", 0)).settle()
    assert pipeline.summaries == []  # no batch is full and none timed out: nothing is summarized yet
    assert pipeline.stored_units("a") == {"m0": "Fact0 of a: Person0 paid 0 EUR."}
    assert set(pipeline.stored_units("b")) == {"m0"}
    pipeline.feed(item("a", 1), item("a", 2)).settle()  # a full batch: summarized, the rows stay
    assert [n["children"] for n in pipeline.nodes("batch")] == [["m0", "m1", "m2"]]
    assert set(pipeline.stored_units("a")) == {"m0", "m1", "m2"}


@pytest.mark.parametrize("summarized", [False, True])
def test_an_update_and_a_deletion_replace_and_remove_the_row(summarized):
    pipeline = run().feed(item("a", 0), item("a", 1))
    if summarized:
        pipeline.feed(item("a", 2)).settle()
    pipeline.feed(item("a", 0, fact="Person0 paid 999 EUR, corrected."), {"agent_id": "a", "id": "m1", "deleted": True})
    pipeline.settle().advance(61)
    units = pipeline.stored_units("a")
    assert units["m0"] == "Person0 paid 999 EUR, corrected." and "m1" not in units
    assert set(units) == {u for n in live(pipeline.summaries) if n["kind"] == "batch" for u in n["children"]}


def test_a_forget_removes_every_unit_before_or_after_its_batch_and_later_ones_stay():
    pipeline = run().feed(*[item("a", i) for i in range(4)], item("b", 0)).settle()  # m0-m2 summarized, m3 buffered
    pipeline.feed({"agent_id": "a", "forget": True}).settle()
    assert pipeline.stored_units("a") == {} and set(pipeline.stored_units("b")) == {"m0"}
    pipeline.feed(item("a", 7)).settle()
    assert set(pipeline.stored_units("a")) == {"m7"}


def test_a_sealed_unit_stays_searchable_and_an_evicted_one_leaves():
    pipeline = run("memory.editable_for=100").feed(*[item("a", i) for i in range(3)]).settle().advance(101)
    pipeline.feed({"agent_id": "a", "id": "m1", "deleted": True}).settle()  # refused: sealed
    assert set(pipeline.stored_units("a")) == {"m0", "m1", "m2"}
    pipeline.feed(item("a", 5)).settle()
    batcher = pipeline.stages[1]
    effects = batcher.run("a", lambda st: batcher.core.evict(st, "internal error"))
    assert [d.record_id for d in effects.dead_letters] == ["m5"]
    logged = effects.side.get(MEMORY_LOG, [])
    pipeline.rows.extend(e.units for e in logged if e.units)
    assert set(pipeline.stored_units("a")) == {"m0", "m1", "m2"}


def test_rows_applied_to_a_store_are_recalled_before_their_batch_is_summarized(tmp_path):
    pipeline = run("batching.max_items=10").feed(item("a", 0, fact="I adopted a beagle puppy and named it Rex."),
                                                 item("a", 1))
    pipeline.feed(item("a", 1, fact="Rent is 900 EUR a month.")).settle()
    assert pipeline.summaries == []
    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        for rows in pipeline.rows:
            rows.apply(store)
        (hit,) = store.recall("a", "beagle puppy", k=3)
        assert (hit.kind, hit.node_id, hit.covered_by) == ("unit", "m0", None)
        assert [u.text for u, _ in store.units("a")][1] == "Rent is 900 EUR a month."
        UnitRows(agent_id="a", forget=True).apply(store)
        assert store.units("a") == [] and store.recall("a", "beagle") == []
