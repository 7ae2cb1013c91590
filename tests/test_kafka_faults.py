"""Kafka faults on a real broker: the broker down for 30 s mid-run (MiniCluster), and a TaskManager killed
mid-stream on a standalone cluster the job is submitted to with the connector jar shipped by `flink run
--jarfile`. Either way the read_committed output covers every unit exactly once, and with the journal on no
LLM call whose answer had arrived is paid again."""

import json
import time
import uuid

import pytest
from cluster import ROOT, StandaloneCluster
from jobkit import (
    batch_units,
    check_tree,
    config_for,
    expected_units,
    items,
    repeated_after_kill,
    slow_script,
    units_per_agent,
    wait_for,
)
from kafka_broker import KafkaBroker, consume_all, create_topic, produce
from scripted_server import ScriptedServer

from flink_memory.flink.pipeline import build_job
from flink_memory.kafka import connector_jar
from flink_memory.outputs import latest_globals

pytestmark = pytest.mark.slow

JOB = ROOT / "jobs" / "memory_summarization.py"


def summaries(bootstrap: str, prefix: str) -> list[dict]:
    return [json.loads(v) for _, v in consume_all(bootstrap, f"{prefix}summaries", idle_s=2) if v is not None]


def exactly_once(nodes: list[dict], expected) -> None:
    assert batch_units(nodes) == expected  # every unit in exactly one batch node: none lost, none twice
    assert len({(n["agent_id"], n["node_id"]) for n in nodes}) == len(nodes)
    check_tree(nodes, units_per_agent(expected))


def settled(nodes: list[dict], expected) -> bool:
    """Every unit is in a batch node and each agent's latest global covers all of its units."""
    found = latest_globals(nodes)
    return batch_units(nodes) == expected and all(found.get(agent, {}).get("item_count") == count
                                                  for agent, count in units_per_agent(expected).items())


def produce_records(bootstrap: str, topic: str, records: list[dict], partitions: int) -> None:
    produce(bootstrap, topic, [(r["agent_id"].encode(), json.dumps(r).encode(), i % partitions)
                               for i, r in enumerate(records)])


def test_broker_down_for_30_s_mid_run_recovers_and_loses_nothing(tmp_path):
    with KafkaBroker(tmp_path / "broker") as broker:
        bootstrap = broker.bootstrap
        topic, prefix = f"outage-{uuid.uuid4().hex[:8]}", f"outage-{uuid.uuid4().hex[:8]}."
        create_topic(bootstrap, topic, 3)
        records = items(agents=3, per_agent=12)
        half = len(records) // 2
        produce_records(bootstrap, topic, records[:half], 3)
        with ScriptedServer() as server:
            config = config_for(server.base_url, "embeddings.provider=none", "batching.max_items=4",
                                "batching.flush_after_s=1",
                                "summarization.fan_in=3", "summarization.global_refresh_s=0",
                                "checkpointing.interval_s=1", "checkpointing.restart_backoff_s=1",
                                "source.kafka.starting_offsets=earliest", f"sink.kafka.bootstrap_servers={bootstrap}",
                                f"sink.kafka.topic_prefix={prefix}", journal=tmp_path / "journal.sqlite")
            client = build_job(config, f"kafka://{bootstrap}/{topic}", str(tmp_path / "out")).execute_async("outage")
            try:
                wait_for(lambda: batch_units(summaries(bootstrap, prefix)), timeout_s=180, every_s=1)
                # mid-run: the first half is being summarized when the broker goes away for 30 s
                down_at = time.monotonic()
                broker.restart(down_s=30)
                print(f"\n[outage] broker back after {time.monotonic() - down_at:.0f} s")
                produce_records(bootstrap, topic, records[half:], 3)
                expected = expected_units(records)
                # (the job's restarts back off exponentially while the broker is away: up to a minute between
                # two attempts once it is back, on a busy machine)
                wait_for(lambda: batch_units(summaries(bootstrap, prefix)) == expected, timeout_s=300, every_s=2)
                print(f"[outage] all {len(records)} records covered {time.monotonic() - down_at:.0f} s after the stop")
            finally:
                client.cancel().result()
        exactly_once(summaries(bootstrap, prefix), expected_units(records))
        dead = [json.loads(v) for _, v in consume_all(bootstrap, f"{prefix}dead-letters", idle_s=1) if v]
        assert dead == []  # a record read twice would be a `duplicate` dead letter


def test_taskmanager_killed_mid_stream_on_a_cluster_reading_kafka(tmp_path, kafka_broker):
    bootstrap = kafka_broker.bootstrap
    topic, prefix = f"cluster-{uuid.uuid4().hex[:8]}", f"cluster-{uuid.uuid4().hex[:8]}."
    create_topic(bootstrap, topic, 2)
    records = items(agents=4, per_agent=20)
    expected = expected_units(records)
    produce_records(bootstrap, topic, records[:40], 2)
    jar = connector_jar(None)
    empty_home = tmp_path / "home"  # no Maven cache: the jar reaches the job only through --jarfile
    empty_home.mkdir()
    with ScriptedServer(slow_script) as server, StandaloneCluster(tmp_path / "cluster") as cluster:
        job_id = cluster.submit(
            JOB, "--input", f"kafka://{bootstrap}/{topic}", "--output", str(tmp_path / "out"), "--parallelism", "2",
            "--set", "llm.provider=openai", "--set", f"llm.base_url={server.base_url}",
            "--set", "llm.max_retries=2", "--set", "llm.retry_backoff_s=0.2", "--set", "llm.max_concurrency=2",
            "--set", "batching.max_items=5", "--set", "batching.flush_after_s=1", "--set", "summarization.fan_in=3",
            "--set", "summarization.global_refresh_s=0", "--set", "checkpointing.interval_s=1",
            "--set", "checkpointing.restart_backoff_s=0.5", "--set", "job.poll_interval_ms=20",
            "--set", "source.kafka.starting_offsets=earliest", "--set", f"sink.kafka.bootstrap_servers={bootstrap}",
            "--set", f"sink.kafka.topic_prefix={prefix}", "--set", f"journal.path={tmp_path / 'journal.sqlite'}",
            options=("--jarfile", str(jar)), home=empty_home)
        wait_for(lambda: server.count() >= 6, timeout_s=120)
        (victim, *_) = cluster.busy_taskmanagers(job_id, ("batch-summaries", "hierarchical-merger"))
        killed_at = time.monotonic()
        cluster.kill_taskmanager(victim)
        calls_at_kill = server.count()
        cluster.start_taskmanager()
        produce_records(bootstrap, topic, records[40:], 2)  # the rest of the stream arrives during the recovery
        try:
            # (every unit in a batch node, and each agent's global over all of them: the last global's call may
            # still run when the last batch node is committed)
            wait_for(lambda: settled(summaries(bootstrap, prefix), expected), timeout_s=120, every_s=2)
            assert cluster.restarts(job_id) >= 1, "the kill did not make the job restart"
        except AssertionError:
            print(cluster.logs())
            raise
        finally:
            cluster.cancel(job_id)
        spans = list(server.spans)
    exactly_once(summaries(bootstrap, prefix), expected)
    repeated, finished_before_kill = repeated_after_kill(spans, killed_at)
    assert finished_before_kill == 0, f"{finished_before_kill} finished calls were paid for twice"
    assert calls_at_kill < len(spans) - repeated, "the job had no work left when the TaskManager was killed"
    print(f"\n[cluster+kafka] TaskManager killed after {calls_at_kill} calls: {len(spans)} calls, {repeated} "
          f"repeated (all in flight at the kill)")
