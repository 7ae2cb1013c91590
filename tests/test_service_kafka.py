"""The service's writes on a Kafka input (`serve --input kafka://HOST:PORT/TOPIC`): each write one message on
the job's input topic, keyed by agent id, whose value the job's Kafka parser accepts; and a broker that does
not answer is a clear 503 within the send timeout, never a hang, after which the writer recovers.

The broker tests start a real single-node broker (tests/kafka_broker.py: a JVM, so they are slow); the test
with no broker at all needs none."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kafka_broker import KafkaBroker, consume_all, create_topic, free_port
from servicekit import call, serving, write_store

from flink_memory.records import DeadLetter, parse_kafka_value
from flink_memory.service import writer
from flink_memory.service.server import ServeOptions

pytest.importorskip("confluent_kafka")

TIMEOUT_S = 2.0  # the send timeout of these tests (the service's default is writer.SEND_TIMEOUT_S)

CONVERSATION = [{"role": "user", "content": "I moved to Lisbon in May."},
                {"role": "assistant", "content": "Noted: Lisbon since May."}]
WRITES = [  # (method, path, body) -> the record the job must read, keyed by the agent
    ("POST", "/v1/agents/alice/memories", {"id": "boat", "text": "Alice paid 300 EUR for the boat.",
                                           "ts": "2026-03-01T10:00:00Z", "metadata": {"source": "chat"}}),
    ("POST", "/v1/agents/bob/memories", {"messages": CONVERSATION, "id": "move"}),
    ("POST", "/v1/agents/alice/memories", {"trusted": True, "id": "chunks", "chunks": [CONVERSATION[:1],
                                                                                      CONVERSATION[1:]]}),
    ("POST", "/v1/agents/alice/memories", {"id": "bad", "text": "x", "ts": "yesterday"}),  # 422: not written
    ("DELETE", "/v1/agents/alice/memories/boat", None),
    ("DELETE", "/v1/agents/bob", None),
]
EXPECTED = [
    (b"alice", {"agent_id": "alice", "id": "boat", "text": "Alice paid 300 EUR for the boat.",
                "ts": "2026-03-01T10:00:00Z", "metadata": {"source": "chat"}}, "item"),
    (b"bob", {"agent_id": "bob", "messages": CONVERSATION, "id": "move"}, "conversation"),
    (b"alice", {"agent_id": "alice", "trusted": True, "id": "chunks", "chunks": [CONVERSATION[:1],
                                                                               CONVERSATION[1:]]}, "trusted"),
    (b"alice", {"agent_id": "alice", "id": "boat", "deleted": True}, "deletion"),
    (b"bob", {"agent_id": "bob", "forget": True}, "forget"),
]


@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setattr(writer, "SEND_TIMEOUT_S", TIMEOUT_S)


def timed_post(url: str) -> tuple[float, int, dict]:
    started = time.monotonic()
    status, answer = call(f"{url}/v1/agents/alice/memories", "POST", {"text": "Alice likes figs."})
    return time.monotonic() - started, status, answer


@pytest.mark.slow
def test_each_write_is_one_keyed_message_the_job_parses(tmp_path, kafka_broker):
    topic = f"service-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 1)  # one partition: the messages in the order they were sent
    store = write_store(tmp_path / "memory.sqlite")
    with serving(ServeOptions(store=store, input=f"kafka://{kafka_broker.bootstrap}/{topic}")) as url:
        assert call(f"{url}/v1/health")[1]["writes"] == "kafka"
        answers = [call(f"{url}{path}", method, body) for method, path, body in WRITES]
    assert [status for status, _ in answers] == [202, 202, 202, 422, 202, 202]
    assert "RFC 3339" in answers[3][1]["detail"]  # the job's reason, and nothing written
    messages = consume_all(kafka_broker.bootstrap, topic)
    assert len(messages) == len(EXPECTED)
    for offset, ((key, value), (want_key, want, kind)) in enumerate(zip(messages, EXPECTED)):
        assert key == want_key
        assert json.loads(value) == want
        parsed = parse_kafka_value(value, f"{topic}/0@{offset}", 1_048_576)  # as the job's Kafka source reads it
        assert not isinstance(parsed, DeadLetter), parsed.reason
        assert parsed.kind == kind and parsed.agent_id == key.decode()


def test_no_broker_at_the_address_is_a_503_within_the_send_timeout(tmp_path, short_timeout):
    store = write_store(tmp_path / "memory.sqlite")
    with serving(ServeOptions(store=store, input=f"kafka://127.0.0.1:{free_port()}/events")) as url:
        elapsed, status, answer = timed_post(url)
        assert call(f"{url}/v1/agents/alice/recall", "POST", {"question": "boat"})[0] == 200  # reads still work
    assert status == 503, answer
    assert "not confirmed" in answer["detail"] and f"{TIMEOUT_S:g} s" in answer["detail"], answer
    assert TIMEOUT_S - 0.5 < elapsed < TIMEOUT_S + 2


@pytest.mark.slow
def test_a_broker_down_is_a_503_within_the_send_timeout_and_writes_resume_when_it_is_back(tmp_path, short_timeout):
    with KafkaBroker(tmp_path / "broker") as broker:
        topic = f"outage-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, 1)
        store = write_store(tmp_path / "memory.sqlite")
        with serving(ServeOptions(store=store, input=f"kafka://{broker.bootstrap}/{topic}")) as url:
            assert timed_post(url)[1] == 202
            broker.stop()
            down = [timed_post(url) for _ in range(2)]
            broker.start()
            elapsed, status, answer = timed_post(url)
            assert status == 202, answer  # the same writer: no fatal producer state after the timeouts
        for took, status, answer in down:
            assert status == 503, answer
            assert "not confirmed" in answer["detail"], answer
            assert took < TIMEOUT_S + 2
        values = [json.loads(v)["text"] for _, v in consume_all(broker.bootstrap, topic)]
    assert values.count("Alice likes figs.") >= 2  # before and after the outage (a timed-out one may be there too)
