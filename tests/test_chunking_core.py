"""Chunk plans and materialization without Flink: properties, routing, windows, manifests."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flink_memory.chunking.exchanges import (
    InvalidPlan,
    enforce_budget,
    exchange_costs,
    fixed_plan,
    group_exchanges,
    materialize,
    validate_plan,
)
from flink_memory.chunking.manifest import ManifestMismatch, PolicyChanged, load_verified, manifest_json
from flink_memory.chunking.plans import ChunkPlanner, PlanJob, prepare
from flink_memory.config import load_config
from flink_memory.records import Conversation, MemoryItem, TrustedConversation
from flink_memory.requests import RequestFactory
from flink_memory.summarize.rooms import batch_item_room
from flink_memory.tokens.estimate import estimate_messages

messages_st = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                           "content": st.text(max_size=120)}),
    min_size=1, max_size=30,
)
answers_st = st.one_of(
    st.lists(st.integers(min_value=-3, max_value=40), max_size=12),
    st.lists(st.integers(min_value=0, max_value=30), max_size=12).map(sorted),
    st.lists(st.one_of(st.integers(0, 30), st.floats(0, 30), st.text(max_size=3), st.booleans()), max_size=6),
    st.none(), st.text(max_size=10),
)


@settings(max_examples=400, deadline=None)
@given(messages_st, answers_st, st.integers(min_value=8, max_value=200))
def test_plan_is_rejected_or_chunks_partition_the_exchanges(messages, answer, budget):
    exchanges = group_exchanges(messages)
    costs = exchange_costs(messages, exchanges)
    try:
        boundaries = validate_plan(answer, len(exchanges))
    except InvalidPlan:
        return
    boundaries = enforce_budget(boundaries, costs, budget)
    chunks = materialize(messages, exchanges, boundaries, costs, budget)
    rebuilt = [m for c in chunks for m in c["messages"]]
    assert rebuilt == messages and all(a is b for a, b in zip(rebuilt, messages))  # same objects, same order
    starts = {a for a, _ in exchanges}
    offset = 0
    for chunk in chunks:
        assert offset in starts  # every chunk begins at an exchange: no user exchange is split
        offset += len(chunk["messages"])
        exchange_count = chunk["end"] - chunk["start"] + 1
        assert chunk["oversized"] == (chunk["tokens"] > budget)
        if chunk["oversized"]:
            assert exchange_count == 1  # only a lone exchange may exceed the budget, kept whole


@settings(max_examples=200, deadline=None)
@given(messages_st, st.integers(min_value=8, max_value=200))
def test_fixed_plan_is_always_valid(messages, budget):
    exchanges = group_exchanges(messages)
    plan = fixed_plan(exchange_costs(messages, exchanges), budget)
    assert validate_plan(plan, len(exchanges)) == plan


@pytest.mark.parametrize(
    ("answer", "reason"),
    [([5, 2, 9], "strictly increasing"), ([0, 0, 9], "strictly increasing"), ([-1, 9], "out of range"),
     ([3, 12], "out of range"), ([1.0, 9], "not an integer"), (["3", 9], "not an integer"), ([3, 5], "final"),
     ([], "empty"), (list(range(50)), "end indices for"), ({"ends": [9], "x": 1}, "single key"), ("9", "list"),
     ([True, 9], "not an integer")],
)
def test_invalid_answers_say_why(answer, reason):
    with pytest.raises(InvalidPlan, match=reason):
        validate_plan(answer, 10)


def test_leading_system_message_joins_the_first_exchange():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    assert group_exchanges(msgs) == [(0, 2), (3, 3)]


def cfg(*overrides):
    return load_config(None, ["chunking.max_chunk_tokens=200", *overrides], environ={})


def planner(*overrides):
    config = cfg(*overrides)
    return ChunkPlanner(config, RequestFactory.from_config(config.llm), batch_item_room(config))


def long_conversation(turns=30, words=20):
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " + "about topic " * words})
        messages.append({"role": "assistant", "content": f"answer {t} " + "with details " * words})
    return Conversation(agent_id="a", id="c", messages=messages)


def test_routing_cases():
    p = planner()
    short_item = MemoryItem(agent_id="a", id="i", text="short")
    long_item = MemoryItem(agent_id="a", id="l", text="word " * 2000)
    trusted = TrustedConversation(agent_id="a", id="t", trusted=True,
                                  chunks=[[{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]])
    short_conv = Conversation(agent_id="a", id="s", messages=[{"role": "user", "content": "hi"}])
    assert not any(p.needs_llm(r) for r in (short_item, long_item, trusted, short_conv))
    assert p.needs_llm(long_conversation())
    assert not planner("chunking.semantic=false").needs_llm(long_conversation())

    routed = p.route(short_item)
    assert [u["unit_id"] for u in routed.units] == ["i"] and routed.manifest is None
    routed = p.route(long_item)
    assert routed.manifest.method == "fixed" and "".join(u["text"] for u in routed.units) == long_item.text
    assert [u["unit_id"] for u in routed.units] == [f"l#{k}" for k in range(len(routed.units))]
    routed = p.route(trusted)
    assert routed.manifest.method == "trusted" and routed.manifest.boundaries == [0, 1]
    routed = p.route(short_conv)
    assert routed.manifest.method == "passthrough" and [u["unit_id"] for u in routed.units] == ["s#0"]


def test_manifest_is_text_free_and_verifies():
    p = planner()
    record = long_conversation()
    prepared = prepare(record)
    routed = p.finish(record, prepared, fixed_plan(prepared.costs, 200), "semantic", calls=1)
    text = manifest_json(routed.manifest)
    assert "topic" not in text and "question" not in text  # no conversation text in a manifest
    assert load_verified(text, input_digest=prepared.input_digest, policy_fingerprint=p.fingerprint)
    tampered = json.loads(text)
    tampered["boundaries"][0] += 1
    with pytest.raises(ManifestMismatch):
        load_verified(json.dumps(tampered), input_digest=prepared.input_digest, policy_fingerprint=p.fingerprint)
    with pytest.raises(ManifestMismatch):
        load_verified(text, input_digest="0" * 32, policy_fingerprint=p.fingerprint)
    with pytest.raises(PolicyChanged):
        load_verified(text, input_digest=prepared.input_digest, policy_fingerprint="other")
    with pytest.raises(ManifestMismatch):
        load_verified(text[:-5], input_digest=prepared.input_digest, policy_fingerprint=p.fingerprint)


def test_windows_join_without_a_seam():
    p = planner("chunking.planner_window_tokens=600")
    record = long_conversation(turns=40)
    prepared = prepare(record)
    job = PlanJob()
    windows = 0
    while True:
        request = p.request(prepared, job)
        assert estimate_messages(request.message_dicts()) <= 600 + 64
        body = request.messages[1][1]
        shown = [int(line[1:line.index("]")]) for line in body.splitlines()[1:]]
        assert shown[0] == job.cursor
        plan = p.advance(prepared, job, json.dumps({"ends": shown[1::2] if shown[-1] in shown[1::2]
                                                     else shown[1::2] + [shown[-1]]}))
        windows += 1
        if plan is not None:
            break
    assert windows > 1
    assert validate_plan(plan, len(prepared.exchanges)) == plan


