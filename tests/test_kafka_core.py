"""Kafka in plain Python: the input form, dead letters of bad values, the settings, the connector jar."""

import base64
import json

import pytest

from flink_memory.config import ConfigError, load_config
from flink_memory.kafka import (
    bootstrap_addresses,
    connector_jar,
    memory_key,
    parse_kafka_url,
    position,
    shipped_connector,
    topics,
)
from flink_memory.records import DeadLetter, MemoryItem, parse_kafka_value


def test_kafka_urls_are_taken_apart_or_refused():
    parsed = parse_kafka_url("kafka://h1:9092,h2:9093/events,more.events")
    assert parsed.bootstrap_servers == "h1:9092,h2:9093" and parsed.topics == ("events", "more.events")
    for bad in ("kafka://h1/events", "kafka://h1:9092/", "kafka:///events", "file:///x", "kafka://h:1/bad topic"):
        with pytest.raises(ValueError, match="kafka://HOST:PORT"):
            parse_kafka_url(bad)


def test_bad_values_are_dead_letters_with_topic_partition_and_offset():
    where = position("events", 2, 17)
    assert where == "events/2@17"
    good = parse_kafka_value(json.dumps({"agent_id": "a", "id": "1", "text": "hi"}).encode(), where, 100)
    assert isinstance(good, MemoryItem)
    tombstone = parse_kafka_value(None, where, 100)
    assert isinstance(tombstone, DeadLetter) and "null value" in tombstone.reason and tombstone.position == where
    big = parse_kafka_value(b"x" * 101, where, 100)
    assert isinstance(big, DeadLetter) and big.reason.startswith("oversized: 101 bytes")
    latin = parse_kafka_value(b"\xff{}", where, 100)
    assert isinstance(latin, DeadLetter) and latin.reason.startswith("not UTF-8")
    assert base64.b64decode(latin.raw_base64) == b"\xff{}" and latin.position == where
    broken = parse_kafka_value(b"{nope", where, 100)
    assert isinstance(broken, DeadLetter) and broken.reason.startswith("invalid JSON") and broken.raw == "{nope"


def test_nested_kafka_settings_from_file_env_and_set(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("source:\n  kafka:\n    group_id: from-file\n    properties:\n      fetch.min.bytes: '1'\n")
    config = load_config(conf, ["source.kafka.properties.max.poll.records=100", "sink.kafka.topic_prefix=mem."],
                         environ={"FLINK_MEMORY__SOURCE__KAFKA__BOUNDED": "true"})
    assert config.source.kafka.group_id == "from-file" and config.source.kafka.bounded is True
    assert config.source.kafka.properties == {"fetch.min.bytes": "1", "max.poll.records": "100"}
    assert topics(config.sink.kafka.topic_prefix)["summaries"] == "mem.summaries"
    assert load_config(None, ["source.kafka.group_id=7"], environ={}).source.kafka.group_id == "7"
    for override, needle in [("source.kafka.nope=1", "unknown key 'source.kafka.nope'"),
                             ("source.kafka.starting_offsets=soon", "source.kafka.starting_offsets = 'soon'"),
                             ("source.kafka.group_id.x=1", "has no key 'x'"),
                             ("source.kafka=1", "must be a mapping")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [override], environ={})
    assert load_config(None, ["source.kafka.starting_offsets=timestamp:1700000000000"], environ={})


def test_memory_keys_and_the_connector_jar(tmp_path, monkeypatch):
    assert memory_key("agent-1", "b-3") == "agent-1/b-3"
    jar = tmp_path / "c.jar"
    jar.write_bytes(b"")
    assert connector_jar(str(jar)) == jar
    with pytest.raises(FileNotFoundError, match="no such file"):
        connector_jar(str(tmp_path / "none.jar"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="job.kafka_connector_jar"):
        connector_jar(None)


def test_a_connector_shipped_by_the_submitter_is_recognized():
    jar = "file:/opt/jars/flink-sql-connector-kafka-5.0.0-2.2.jar"
    assert shipped_connector(f"[file:/opt/udf.jar, {jar}]") == jar  # (Flink prints a list)
    assert shipped_connector(f"file:/a.jar;{jar}") == jar
    assert shipped_connector(f"['{jar}', 'file:/opt/flink-python-2.3.0.jar']") == jar  # (a Python list's repr)
    assert shipped_connector("[file:/opt/jars/flink-connector-kafka-4.0.jar]")
    assert shipped_connector("[file:/opt/udf.jar]") is None
    assert shipped_connector(None) is None and shipped_connector("None") is None


def test_bootstrap_addresses_are_host_and_port_pairs():
    assert bootstrap_addresses(" h1:9092, [::1]:9093 ,") == [("h1", 9092), ("::1", 9093)]
    with pytest.raises(ValueError, match="'h2' is not HOST:PORT"):
        bootstrap_addresses("h1:9092,h2")
