"""Node ids: every format formats and parses back the same; names stored in state and on the wire stay."""

from __future__ import annotations

import json

import pytest

from flink_memory.ids import NodeId, UnitId
from flink_memory.records import SummaryNode
from flink_memory.stages.batcher_state import BatcherMeta
from flink_memory.stages.merger_state import StoredNode
from flink_memory.stages.messages import HoldNodes, from_wire, to_wire
from flink_memory.state_layout import dump_model, load_model
from flink_memory.summarize.tree import Slot, SummaryTree

WRITTEN = ["batch-000007", "batch-000007-r1", "batch-000007-r12", "batch-1234567", "merge-L2-000003",
           "merge-L2-000003-r2", "merge-L11-000001", "global-v000012", "global-v1000000"]


@pytest.mark.parametrize("text", WRITTEN)
def test_every_written_id_parses_back_the_same(text: str) -> None:
    assert str(NodeId.parse(text)) == text


def test_formats() -> None:
    assert str(NodeId.batch(7)) == "batch-000007" and str(NodeId.batch(7, 1)) == "batch-000007-r1"
    assert str(NodeId.merge(2, 3)) == "merge-L2-000003" and str(NodeId.merge(2, 3, 2)) == "merge-L2-000003-r2"
    assert str(NodeId.global_summary(12)) == "global-v000012"


def test_parse_fields() -> None:
    assert NodeId.parse("batch-000007-r1") == NodeId("batch", 7, 1, 1)
    assert NodeId.parse("merge-L2-000003-r2") == NodeId("merge", 3, 2, 2)
    assert NodeId.parse("global-v000012") == NodeId("global", 12, None, 0)
    node = NodeId.parse("merge-L3-000004-r5")
    assert (node.kind, node.level, node.number, node.revision) == ("merge", 3, 4, 5)


def test_revisions() -> None:
    batch = NodeId.parse("batch-000007")
    assert str(batch.next_revision()) == "batch-000007-r1"
    assert str(batch.next_revision().next_revision()) == "batch-000007-r2"
    assert NodeId.parse("merge-L2-000003-r2").base == NodeId.merge(2, 3)
    assert batch.base == batch and str(batch.revised(3)) == "batch-000007-r3"
    assert NodeId.parse("batch-000007-r3").revised(0) == batch
    with pytest.raises(ValueError):
        NodeId.global_summary(1).next_revision()


@pytest.mark.parametrize("text", [
    "", "batch", "batch-7", "batch-0000007", "batch-000007-r", "batch-000007-r01", "batch-000007-r0",
    "merge-000003", "merge-L02-000003", "global-000012", "global-v000012-r1", "n", "batch-1b", "m1"])
def test_text_that_is_no_node_id_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a node id"):
        NodeId.parse(text)


def test_swap_and_drop_keep_the_frontier_in_order() -> None:
    tree = SummaryTree(levels=[[Slot(node_id=i, ready=True) for i in ("batch-000001", "batch-000002",
                                                                      "batch-000003")]])
    tree.swap("batch-000002", "batch-000002-r1")
    assert tree.frontier() == ["batch-000001", "batch-000002-r1", "batch-000003"]
    tree.drop("batch-000001")
    assert tree.frontier() == ["batch-000002-r1", "batch-000003"]
    tree.restore_level([Slot(node_id="merge-L2-000001", ready=False)])
    assert not tree.settled() and tree.frontier() == ["batch-000002-r1", "batch-000003"]


def test_stored_names_stay() -> None:
    """Checkpointed state keeps the names it was written with; a message crosses a Flink boundary by its tag."""
    meta = load_model(BatcherMeta, '{"v":2,"revising":[4]}')
    assert meta.resummarizing == [4] and '"revising":[4]' in dump_model(meta)
    tree = load_model(SummaryTree, '{"v":2,"revised":{"batch-000001":2}}')
    assert tree.latest_revision == {"batch-000001": 2} and '"revised":{"batch-000001":2}' in dump_model(tree)
    assert tree.live_batch_ids() == []
    node = SummaryNode(agent_id="a", node_id="merge-L2-000001", kind="merge", level=2, children=[], text="t",
                       item_count=1, model="m")
    stored = StoredNode(node=node, running_revision="merge-L2-000001-r1")
    assert '"revising":"merge-L2-000001-r1"' in dump_model(stored)
    assert load_model(StoredNode, dump_model(stored)) == stored
    tag, wire = to_wire(HoldNodes(node_ids=["batch-000001"]))
    assert tag == "hold" and from_wire(tag, wire) == HoldNodes(node_ids=["batch-000001"])


@pytest.mark.parametrize(("text", "record", "part"), [("m1", "m1", None), ("c7#0", "c7", 0), ("c7#12", "c7", 12),
                                                      ("a#b", "a#b", None), ("x#1#2", "x#1", 2)])
def test_unit_ids_name_one_record_and_format_back(text: str, record: str, part: int | None) -> None:
    unit = UnitId.parse(text)
    assert (unit.record, unit.part) == (record, part) and str(unit) == text
    assert UnitId.names_a_part(text) == (part is not None)


def test_a_record_id_that_would_name_a_part_is_refused_by_the_record_and_by_the_api_pattern() -> None:
    import re

    from flink_memory.ids import RECORD_ID_PATTERN
    from flink_memory.records import DeadLetter, parse_line

    for record_id, accepted in [("m1", True), ("c7#b", True), ("7", True), ("c7#0", False), ("#3", False)]:
        parsed = parse_line(json.dumps({"agent_id": "a", "id": record_id, "text": "x"}))
        assert (not isinstance(parsed, DeadLetter)) == accepted, record_id
        assert (re.fullmatch(RECORD_ID_PATTERN, record_id) is not None) == accepted, record_id
