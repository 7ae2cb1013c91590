"""The messages between stages: one tagged union, each message crossing a Flink boundary as (tag, JSON)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from stagekit import Pipeline, cfg
from test_driver import NODE, UNIT, counting
from test_stages import item

from flink_memory.records import RECORD_KINDS, parse_line
from flink_memory.stages.driver import Driver
from flink_memory.stages.messages import END, ForgetAgent, HoldNodes, Retract, from_wire, kind_of, to_wire
from flink_memory.stages.planner import PlannerCore

MESSAGES = [
    parse_line(json.dumps(item("a", 1))),
    parse_line(json.dumps({"agent_id": "a", "id": "m1", "deleted": True})),
    parse_line(json.dumps({"agent_id": "a", "forget": True})),
    UNIT,
    NODE,
    Retract(units=["m1"], reason="record m1 deleted"),
    ForgetAgent(),
    HoldNodes(node_ids=["batch-000001"]),
    END,
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_crosses_a_boundary_as_its_tag_and_its_json_and_comes_back_equal(message):
    tag, body = to_wire(message)
    assert tag == kind_of(message) and from_wire(tag, body) == message


def test_tags_name_one_model_each_and_an_input_records_tag_is_its_kind():
    tags = [kind_of(m) for m in MESSAGES]
    assert len(set(tags)) == len(tags)
    assert tags[:3] == ["item", "deletion", "forget"] and set(tags[:3]) <= set(RECORD_KINDS)


def test_a_message_that_does_not_parse_is_an_error_of_ours_raised_first_then_a_dead_letter():
    with pytest.raises(ValueError, match="no stage message is tagged 'units'"):
        from_wire("units", "{}")
    body = json.dumps({"agent_id": "a", "unit_id": "u1"})  # (no text: not a unit)
    with pytest.raises(ValidationError) as raised:
        from_wire("unit", body)
    seen, count = counting()
    driver = Driver(PlannerCore(cfg(), Pipeline(cfg()).factory), "planner", count)
    with pytest.raises(ValidationError):
        driver.unreadable("a", "unit", body, raised.value)
    effects = driver.unreadable("a", "unit", body, raised.value)  # the same message after a restart
    (dead,) = effects.dead_letters
    assert (dead.raw, dead.stage, dead.agent_id) == (body, "internal", "a") and "'unit' message" in dead.reason
    assert effects.counts["internal_errors"] == 1 and list(seen.values()) == [2]
