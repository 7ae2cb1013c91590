import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flink_memory.records import (
    Conversation,
    DeadLetter,
    MemoryItem,
    SummaryNode,
    TrustedConversation,
    parse_line,
)


def line(**fields):
    return json.dumps(fields)


def test_memory_item():
    rec = parse_line(line(agent_id="a", id="1", text="Alice likes tea", ts="2026-01-02T03:04:05Z"))
    assert isinstance(rec, MemoryItem)
    assert rec.ts.isoformat() == "2026-01-02T03:04:05+00:00"
    assert rec.model_dump(mode="json")["ts"] == "2026-01-02T03:04:05Z"


def test_conversation_keeps_unknown_message_fields():
    raw = line(agent_id="a", id="c", messages=[{"role": "user", "content": "hi", "has_answer": True}])
    rec = parse_line(raw)
    assert isinstance(rec, Conversation)
    assert rec.messages[0].source_dict() == {"role": "user", "content": "hi", "has_answer": True}


def test_trusted_chunks():
    rec = parse_line(line(agent_id="a", id="t", trusted=True, chunks=[[{"role": "user", "content": "x"}]]))
    assert isinstance(rec, TrustedConversation)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty line"),
        ("{", "invalid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (line(agent_id="a", id="1"), "exactly one of text, messages, chunks"),
        (line(agent_id="a", id="1", text="x", messages=[]), "exactly one of"),
        (line(agent_id="", id="1", text="x"), "agent_id"),
        (line(agent_id="  ", id="1", text="x"), "must not be blank"),
        (line(agent_id="a\x00b", id="1", text="x"), "control characters"),
        (line(agent_id="a", id=7, text="x"), "id: Input should be a valid string"),
        (line(agent_id="a", id="n#0", text="x"), "would name a part of another record"),
        (line(agent_id="a", id="n#12", deleted=True), "would name a part of another record"),
        (line(agent_id="a", id="1", text=""), "text"),
        (line(agent_id="a", id="1", text="x", ts="yesterday"), "RFC 3339"),
        (line(agent_id="a", id="1", text="x", ts="2026-01-02T03:04:05"), "RFC 3339"),
        (line(agent_id="a", id="1", messages=[]), "messages"),
        (line(agent_id="a", id="1", messages=[{"role": "wizard", "content": "x"}]), "role"),
        (line(agent_id="a", id="1", messages=[{"role": "user", "content": None}]), "content"),
        (line(agent_id="a", id="1", chunks=[[{"role": "user", "content": "x"}]]), '"trusted": true'),
        (line(agent_id="a", id="1", text="x", color="red"), "color: Extra inputs are not permitted"),
        ("[" * 100000 + "]" * 100000, "invalid JSON"),
    ],
)
def test_dead_letters_say_why(raw, reason):
    result = parse_line(raw, position="input.jsonl:3")
    assert isinstance(result, DeadLetter)
    assert reason in result.reason
    assert result.raw == raw
    assert result.position == "input.jsonl:3"


def test_dead_letter_keeps_identity_when_known():
    result = parse_line(line(agent_id="a", id="x1", text=""))
    assert isinstance(result, DeadLetter)
    assert (result.agent_id, result.record_id) == ("a", "x1")


def test_invalid_utf8_is_kept_as_base64():
    raw = b'{"agent_id": "a", "id": "1", "text": "\xff\xfe"}'
    result = parse_line(raw)
    assert isinstance(result, DeadLetter)
    assert "not UTF-8" in result.reason
    import base64

    assert base64.b64decode(result.raw_base64) == raw


def test_huge_and_unicode_strings_are_fine():
    text = "🎉 日本語 \u0000 " * 50000
    rec = parse_line(line(agent_id="a", id="1", text=text))
    assert isinstance(rec, MemoryItem) and rec.text == text


def test_summary_node_version_only_on_global():
    base = dict(agent_id="a", node_id="n", level=1, children=["1"], text="t", item_count=1, model="m")
    SummaryNode(kind="batch", **base)
    with pytest.raises(ValueError):
        SummaryNode(kind="batch", version=1, **base)
    with pytest.raises(ValueError):
        SummaryNode(kind="global", **base)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
record_like = st.fixed_dictionaries(
    {},
    optional={
        "agent_id": json_values,
        "id": json_values,
        "text": json_values,
        "messages": st.lists(
            st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "assistant", "x"]) | json_values,
                                                "content": json_values}),
            max_size=3,
        ) | json_values,
        "chunks": json_values,
        "trusted": json_values,
        "ts": json_values,
        "metadata": json_values,
    },
)


def _check_total(raw):
    result = parse_line(raw)
    if isinstance(result, DeadLetter):
        expected = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
        assert result.raw == expected.rstrip("\r\n")
        assert result.reason
    else:
        assert isinstance(result, (MemoryItem, Conversation, TrustedConversation))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(raw):
    _check_total(raw)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_random_text(raw):
    _check_total(raw)


@settings(max_examples=400, deadline=None)
@given(record_like, st.integers(min_value=0, max_value=400))
def test_fuzz_record_shapes_and_truncation(obj, cut):
    raw = json.dumps(obj)
    _check_total(raw)
    _check_total(raw[:cut])


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=5000))
def test_fuzz_deep_nesting(depth):
    _check_total('{"agent_id": "a", "id": "1", "text": "x", "metadata": ' + '{"k": ' * depth + "1" + "}" * depth + "}")
    _check_total("[" * depth)


def test_deletions_and_forget_records_parse_strictly():
    from flink_memory.records import Deletion, Forget

    assert isinstance(parse_line('{"agent_id": "a", "id": "m1", "deleted": true}'), Deletion)
    assert isinstance(parse_line('{"agent_id": "a", "forget": true, "ts": "2026-01-01T00:00:00Z"}'), Forget)
    for line, reason in [
        ('{"agent_id": "a", "id": "m1", "deleted": true, "text": "x"}', "carries no content"),
        ('{"agent_id": "a", "deleted": true}', "id: Field required"),
        ('{"agent_id": "a", "forget": false}', "forget: Input should be True"),
        ('{"agent_id": "a", "id": "m1", "forget": true}', "Extra inputs are not permitted"),
        ('{"agent_id": "a\\u0007", "forget": true}', "control characters"),
        ('{"agent_id": "a", "id": "m1", "deleted": true, "forget": true}', "nothing else"),
    ]:
        dead = parse_line(line)
        assert isinstance(dead, DeadLetter) and reason in dead.reason, (line, dead)
