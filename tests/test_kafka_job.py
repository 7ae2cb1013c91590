"""The job on a real Kafka broker (tests/kafka_broker.py) and a MiniCluster: records in from a topic of three
partitions, summaries, dead letters, manifests and the compacted memory out, exactly once."""

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from jobkit import PRISTINE_ENV, batch_units, check_tree, config_for, execute, expected_units, items, units_per_agent
from kafka_broker import consume_all, create_topic, produce
from scripted_server import ScriptedServer

from flink_memory.config import ConfigError
from flink_memory.flink.pipeline import build_job
from flink_memory.outputs import read_outputs

pytestmark = pytest.mark.slow


def values(bootstrap, topic):
    return [json.loads(v) for _, v in consume_all(bootstrap, topic) if v is not None]


def test_bounded_backfill_from_three_partitions_exactly_once(tmp_path, kafka_broker):
    bootstrap = kafka_broker.bootstrap
    topic = f"in-{uuid.uuid4().hex[:8]}"
    prefix = f"out-{uuid.uuid4().hex[:8]}."
    create_topic(bootstrap, topic, 3)
    records = items(agents=4, per_agent=15)
    good = [(r["agent_id"].encode(), json.dumps(r).encode(), i % 3) for i, r in enumerate(records)]
    # the key names another agent than the value: the value's agent_id wins
    liar = {"agent_id": "agent-0", "id": "liar", "text": "A fact of agent 0 whose key says agent 3."}
    bad = [(None, b"\xff\xfe not utf-8", 0), (None, b"{not json", 1), (b"agent-1", None, 2),
           (None, json.dumps({"agent_id": "agent-2", "id": "big", "text": "x" * 5000}).encode(), 0)]
    produce(bootstrap, topic, good + [(b"agent-3", json.dumps(liar).encode(), 1)] + bad)
    output = tmp_path / "out"
    with ScriptedServer() as server:
        config = config_for(server.base_url, "batching.max_items=4", "summarization.fan_in=3",
                            "source.kafka.bounded=true", "source.kafka.starting_offsets=earliest",
                            "checkpointing.restart_attempts=0",
                            "source.kafka.max_value_bytes=4096", f"sink.kafka.bootstrap_servers={bootstrap}",
                            f"sink.kafka.topic_prefix={prefix}")
        started = time.monotonic()
        execute(build_job(config, f"kafka://{bootstrap}/{topic}", str(output)), "kafka-backfill", timeout_s=300)
        print(f"bounded Kafka job: {len(records) + 5} records in {time.monotonic() - started:.1f} s")
    expected = expected_units(records + [liar])
    files = read_outputs(str(output))
    summaries = values(bootstrap, f"{prefix}summaries")
    assert Counter(json.dumps(n, sort_keys=True) for n in summaries) == Counter(
        json.dumps(n, sort_keys=True) for n in files["summaries"])  # the same changelog, each node once
    assert batch_units(summaries) == expected  # every unit in exactly one batch node
    check_tree(summaries, units_per_agent(expected))
    assert len({(n["agent_id"], n["node_id"]) for n in summaries}) == len(summaries)
    keyed = consume_all(bootstrap, f"{prefix}summaries")
    assert all(k.decode() == json.loads(v)["agent_id"] for k, v in keyed)
    dead = values(bootstrap, f"{prefix}dead-letters")
    assert len(dead) == 4
    by_reason = {d["reason"].split(":")[0].split(" ")[0]: d for d in dead}
    assert set(by_reason) == {"not", "invalid", "null", "oversized"}, [d["reason"] for d in dead]
    assert all(d["position"].startswith(f"{topic}/") and "@" in d["position"] for d in dead)
    assert by_reason["null"]["position"] == f"{topic}/2@{sum(1 for _, _, p in good if p == 2)}"
    assert by_reason["not"]["raw_base64"]
    assert len(values(bootstrap, f"{prefix}manifests")) == len(files["manifests"])
    # <prefix>memory read from the start: the live nodes (last value per key; tombstones drop a key)
    live: dict[bytes, bytes | None] = {}
    for key, value in consume_all(bootstrap, f"{prefix}memory"):
        live[key] = value
    live_nodes = {k.decode() for k, v in live.items() if v is not None}
    replaced = {(n["agent_id"], r) for n in summaries for r in n["replaces"]}
    expected_live = {f"{n['agent_id']}/{n['node_id']}" for n in summaries
                     if (n["agent_id"], n["node_id"]) not in replaced}
    assert live_nodes == expected_live


def test_unreachable_broker_fails_fast_naming_the_address(tmp_path):
    config = config_for("http://127.0.0.1:9/v1", "source.kafka.bounded=true")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="127.0.0.1:9 did not answer"):
        build_job(config, "kafka://127.0.0.1:9/events", str(tmp_path / "out"))
    assert time.monotonic() - started < 60


GATEWAY_THREADS = """
import socket, sys, threading, time
sys.path.insert(0, sys.argv[1])
from jobkit import config_for
from pyflink.java_gateway import get_gateway
from flink_memory.config import ConfigError
from flink_memory.flink.kafka_connector import KafkaUnavailable, check_brokers
from flink_memory.flink.pipeline import build_job
config = config_for("http://127.0.0.1:9/v1", "source.kafka.bounded=true")
try:
    build_job(config, "kafka://127.0.0.1:9/events", sys.argv[2])  # (the connector is loaded)
except ConfigError as exc:
    assert "127.0.0.1:9 did not answer" in str(exc), exc
busy = threading.Thread(target=lambda: get_gateway().jvm.java.lang.Thread.sleep(4000))
with socket.create_server(("127.0.0.1", 0)) as silent:  # (takes connections, never answers: the admin runs)
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    busy.start()
    time.sleep(0.5)
    try:
        check_brokers(address, {}, timeout_s=2)
    except KafkaUnavailable as exc:
        print("REFUSED", exc)
    busy.join()
"""


def test_the_broker_check_finds_the_connector_from_any_gateway_thread(tmp_path):
    """Py4J finds a class through the context class loader of the JVM thread that serves the call; only the
    thread that ran add_jars has the connector. A call on the gateway while another Python thread holds its
    connection goes to a new JVM thread: the check must still find the admin client there. (In a process of its
    own: the second gateway connection it makes would move later calls of this process between JVM threads.)"""
    done = subprocess.run([sys.executable, "-c", GATEWAY_THREADS, str(Path(__file__).parent), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240, env=PRISTINE_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "did not answer within 2 s" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_unbounded_reads_records_produced_while_it_runs(tmp_path, kafka_broker):
    bootstrap = kafka_broker.bootstrap
    topic = f"live-{uuid.uuid4().hex[:8]}"
    prefix = f"live-{uuid.uuid4().hex[:8]}."
    create_topic(bootstrap, topic, 3)
    records = items(agents=3, per_agent=8)
    expected = expected_units(records)
    with ScriptedServer() as server:
        config = config_for(server.base_url, "batching.max_items=4", "batching.flush_after_s=1",
                            "summarization.global_refresh_s=0", "checkpointing.interval_s=1",
                            "source.kafka.starting_offsets=earliest", f"sink.kafka.bootstrap_servers={bootstrap}",
                            f"sink.kafka.topic_prefix={prefix}")
        client = build_job(config, f"kafka://{bootstrap}/{topic}", str(tmp_path / "out")).execute_async("live")
        try:
            half = len(records) // 2
            produce(bootstrap, topic, [(None, json.dumps(r).encode(), i % 3) for i, r in enumerate(records[:half])])
            time.sleep(3)  # the second half arrives while the first is being summarized
            produce(bootstrap, topic, [(None, json.dumps(r).encode(), i % 3) for i, r in enumerate(records[half:])])
            deadline = time.monotonic() + 120
            while True:
                summaries = values(bootstrap, f"{prefix}summaries")
                if batch_units(summaries) == expected or time.monotonic() > deadline:
                    break
                time.sleep(2)
        finally:
            client.cancel().result()
    assert batch_units(summaries) == expected  # read_committed: every unit in exactly one batch node
    assert len({(n["agent_id"], n["node_id"]) for n in summaries}) == len(summaries)


def test_restore_from_a_checkpoint_resumes_after_the_offsets_it_holds(tmp_path, kafka_broker):
    bootstrap = kafka_broker.bootstrap
    topic = f"restore-{uuid.uuid4().hex[:8]}"
    prefix = f"restore-{uuid.uuid4().hex[:8]}."
    create_topic(bootstrap, topic, 3)
    records = items(agents=2, per_agent=10)
    half = len(records) // 2
    output = tmp_path / "out"
    with ScriptedServer() as server:
        config = config_for(server.base_url, "batching.max_items=5", "batching.flush_after_s=1",
                            "summarization.global_refresh_s=0", "checkpointing.interval_s=1",
                            "source.kafka.starting_offsets=earliest", f"sink.kafka.bootstrap_servers={bootstrap}",
                            f"sink.kafka.topic_prefix={prefix}")

        def run_until(expected, restore=None):
            client = build_job(config, f"kafka://{bootstrap}/{topic}", str(output), restore=restore).execute_async("r")
            try:
                deadline = time.monotonic() + 120
                while batch_units(values(bootstrap, f"{prefix}summaries")) != expected:
                    assert time.monotonic() < deadline, "the summaries did not cover the input in time"
                    time.sleep(2)
                time.sleep(3)  # a few more checkpoints: the retained one covers the offsets read
            finally:
                client.cancel().result()

        produce(bootstrap, topic, [(None, json.dumps(r).encode(), i % 3) for i, r in enumerate(records[:half])])
        run_until(expected_units(records[:half]))
        checkpoint = max((output / "_checkpoints").glob("*/chk-*"), key=lambda p: p.stat().st_mtime)
        produce(bootstrap, topic, [(None, json.dumps(r).encode(), i % 3) for i, r in enumerate(records[half:])])
        run_until(expected_units(records), restore=str(checkpoint))
    summaries = values(bootstrap, f"{prefix}summaries")
    assert batch_units(summaries) == expected_units(records)  # nothing read twice, nothing lost
    assert len({(n["agent_id"], n["node_id"]) for n in summaries}) == len(summaries)
    assert values(bootstrap, f"{prefix}dead-letters") == []  # a record read again would be a `duplicate`
