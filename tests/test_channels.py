"""Side channels come from the topology and carry typed messages, written to text at one boundary; the end of
input is one implementation (the driver's), which the in-memory runner calls as the Flink shell does."""

from __future__ import annotations

import pytest
from stagekit import Pipeline, cfg

from flink_memory.memory_log import Base, Lineage, LogEntry, Snapshot, UnitRows, log_entry
from flink_memory.records import ChunkManifest, MemoryUnit, SummaryNode
from flink_memory.stages.channels import DEAD_LETTERS, MANIFESTS, MEMORY_LOG
from flink_memory.stages.driver import END_ROUNDS, Driver
from flink_memory.topology import CHANNELS, STAGES

NODE = SummaryNode(agent_id="a\u00e9\"", node_id="merge-L2-000001", kind="merge", level=2, children=["batch-000001"],
                   text="Summary: \u00e9t\u00e9 \"quoted\"\n", item_count=3, model="m")
UNIT = MemoryUnit(agent_id="a\u00e9\"", unit_id="m1", source_id="m1", text="Fact 1.")
LINEAGE = Lineage(history="0h1", branch="0b2")


def item(agent: str, i: int) -> dict:
    return {"agent_id": agent, "id": f"m{i}", "text": f"Fact {i} of {agent}."}


def test_the_channels_are_the_stages_and_their_sinks_keep_their_uids():
    assert [c.name for c in CHANNELS] == ["manifests", "dead-letters", "memory-log"]  # (the order sinks are wired)
    assert [c.sink_uid for c in CHANNELS] == ["flink-memory-sink-manifests", "flink-memory-sink-dead-letters",
                                              "flink-memory-sink-memory"]  # (the savepoint contract)
    assert {c for spec in STAGES for c in spec.channels} == set(CHANNELS)
    assert all(DEAD_LETTERS in spec.channels for spec in STAGES)


def test_a_log_entry_is_written_as_the_logs_written_so_far_byte_for_byte():
    """A node's or unit rows' entry leaves its empty fields out; a branch's first entry writes them all."""
    node = log_entry("merger", NODE.agent_id, 3, LINEAGE, node=NODE)
    assert MEMORY_LOG.dump(node) == ('{"by":"merger","agent_id":"a\u00e9\\"","seq":3,"history":"0h1","branch":"0b2",'
                                     f'"node":{NODE.model_dump_json()}}}')
    rows = UnitRows(agent_id=UNIT.agent_id, seq=4, history="0h1", branch="0b2", upsert=[UNIT])
    units = log_entry("batcher", UNIT.agent_id, 4, LINEAGE, units=rows)
    assert MEMORY_LOG.dump(units) == ('{"by":"batcher","agent_id":"a\u00e9\\"","seq":4,"history":"0h1",'
                                      f'"branch":"0b2","units":{rows.model_dump_json()}}}')
    fork = log_entry("batcher", "a", 1, LINEAGE, base=Base(branch="0a", seq=2), snapshot=Snapshot(units=[(UNIT, None)]))
    assert MEMORY_LOG.dump(fork) == fork.model_dump_json() and '"node":null,"units":null' in MEMORY_LOG.dump(fork)
    for entry in (node, units, fork):
        assert MEMORY_LOG.load(MEMORY_LOG.dump(entry)) == entry


def test_the_in_memory_runner_keeps_what_the_stages_emit_as_typed_messages():
    pipeline = Pipeline(cfg("batching.max_items=2", "chunking.max_chunk_tokens=64", "chunking.semantic=false"))
    long_text = " ".join(f"Sentence {i} is about the weather of day {i}." for i in range(40))
    pipeline.feed(item("a", 0), item("a", 1), {"agent_id": "a", "id": "long", "text": long_text}, "not json").end()
    assert pipeline.log and all(isinstance(e, LogEntry) for e in pipeline.log)
    assert pipeline.manifests and all(isinstance(m, ChunkManifest) for m in pipeline.manifests)
    assert [d.stage for d in pipeline.dead_letters] == ["parse"]
    assert pipeline.rows == [e.units for e in pipeline.log if e.units is not None]
    for manifest in pipeline.manifests:  # (the manifests' own canonical JSON, read back by the model)
        assert MANIFESTS.load(MANIFESTS.dump(manifest)) == manifest


def test_a_stage_that_emits_on_a_channel_its_spec_does_not_name_is_refused():
    pipeline = Pipeline(cfg())
    planner = pipeline._runners[0]
    with pytest.raises(ValueError, match="does not name"):
        planner.emit("a", MEMORY_LOG, log_entry("batcher", "a", 1, units=UnitRows(agent_id="a")))


def test_the_in_memory_runner_ends_the_input_through_the_drivers_rounds(monkeypatch):
    rounds: list[tuple[str, int]] = []
    end_of_input = Driver.end_of_input

    def counting(self, key, index, activate, waits):
        rounds.append((self.stage, index))
        return end_of_input(self, key, index, activate, waits)

    monkeypatch.setattr(Driver, "end_of_input", counting)
    pipeline = Pipeline(cfg("batching.max_items=2")).feed(*[item("a", i) for i in range(3)]).end()
    assert pipeline.current("a")["item_count"] == 3
    for spec in STAGES:  # every round on the agent, and the END of the stage before (round 0 once more)
        ran = [index for stage, index in rounds if stage == spec.name]
        assert ran == ([0] if spec is not STAGES[0] else []) + list(range(END_ROUNDS))
