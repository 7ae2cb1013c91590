"""Kafka in and out against files in and out, and the latency from produce to commit, on a real broker.

1. Throughput: the same records (20 000 items of 100 agents in batches of 50 by default) with an instant
   provider, read from a JSON-lines file and written to files, then read from a topic (bounded backfill) and
   written exactly once to Kafka (and files, which the job always writes). Records/s of each and the ratio
   Kafka / files (goal >= 0.9).
2. Latency in unbounded mode: records produced at a steady rate while the job runs (`batching.flush_after_s=2`,
   10 s checkpoints); a read_committed consumer of `<prefix>summaries` notes when each batch node arrives, that
   is when the transaction holding it was committed. Per record: that time minus the time it was produced
   (p50, p99).
3. Scaling out (`--scaling`, on its own): a standalone cluster from the wheel's bin/ scripts with two
   TaskManagers of one slot each; the same records on a topic of 2 partitions read as a bounded backfill by
   `flink run --jarfile <connector>` at parallelism 1, then 2. Each run is timed from submit to FINISHED and by
   Flink's own job duration; records/s of each and the ratio p2 / p1 (goal: a second TaskManager adds most of
   a core's throughput).

Run (starts a broker and MiniClusters; a few minutes on 2 cores):
    python benchmarks/kafka.py [--json out/bench-kafka.json]
    python benchmarks/kafka.py --scaling [--agents 100 --items-per-agent 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cluster import StandaloneCluster  # noqa: E402
from jobkit import batch_units, config_for, expected_units, items, write_lines  # noqa: E402
from kafka_broker import KafkaBroker, consume_all, create_topic, produce  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

from flink_memory.flink.pipeline import build_job  # noqa: E402
from flink_memory.kafka import connector_jar  # noqa: E402
from flink_memory.outputs import read_outputs  # noqa: E402

JOB = ROOT / "jobs" / "memory_summarization.py"


def run_job(config: Any, input_path: str, output: Path) -> float:
    started = time.perf_counter()
    build_job(config, input_path, str(output)).execute("flink-memory-kafka-benchmark")
    return time.perf_counter() - started


def throughput(root: Path, broker: KafkaBroker, records: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    settings = (f"batching.max_items={args.max_items}", f"summarization.fan_in={args.fan_in}")
    input_path = write_lines(root / "input.jsonl", records)
    topic, prefix = f"bench-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}."
    create_topic(broker.bootstrap, topic, args.partitions)
    produce(broker.bootstrap, topic, [(r["agent_id"].encode(), json.dumps(r).encode(), i % args.partitions)
                                      for i, r in enumerate(records)])
    with ScriptedServer() as server:
        files_s = run_job(config_for(server.base_url, *settings), str(input_path), root / "files")
        kafka_config = config_for(server.base_url, *settings, "source.kafka.bounded=true",
                                  "source.kafka.starting_offsets=earliest",
                                  f"sink.kafka.bootstrap_servers={broker.bootstrap}",
                                  f"sink.kafka.topic_prefix={prefix}")
        kafka_s = run_job(kafka_config, f"kafka://{broker.bootstrap}/{topic}", root / "kafka")
    nodes = [json.loads(v) for _, v in consume_all(broker.bootstrap, f"{prefix}summaries") if v is not None]
    covered = sum(batch_units(nodes).values())
    if covered != len(records):
        raise SystemExit(f"Kafka output covers {covered} units, {len(records)} expected")
    files_rate, kafka_rate = len(records) / files_s, len(records) / kafka_s
    return {"records": len(records), "files_s": round(files_s, 2), "kafka_s": round(kafka_s, 2),
            "files_records_per_s": round(files_rate), "kafka_records_per_s": round(kafka_rate),
            "kafka_over_files": round(kafka_rate / files_rate, 3)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(root: Path, broker: KafkaBroker, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    records = items(args.latency_agents, args.latency_records // args.latency_agents)
    topic, prefix = f"lat-{uuid.uuid4().hex[:8]}", f"lat-{uuid.uuid4().hex[:8]}."
    create_topic(broker.bootstrap, topic, args.partitions)
    create_topic(broker.bootstrap, f"{prefix}summaries", 1)
    produced: dict[tuple[str, str], float] = {}
    committed: dict[tuple[str, str], float] = {}
    stop = threading.Event()

    def consume() -> None:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"lat-{uuid.uuid4().hex}",
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        consumer.assign([TopicPartition(f"{prefix}summaries", 0, OFFSET_BEGINNING)])
        while not stop.is_set():
            message = consumer.poll(0.05)
            if message is None or message.error() or message.value() is None:
                continue
            node = json.loads(message.value())
            if node["kind"] == "batch":
                for unit in node["children"]:
                    committed.setdefault((node["agent_id"], unit), time.time())
        consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    with ScriptedServer() as server:
        config = config_for(server.base_url, f"batching.max_items={args.max_items}", "batching.flush_after_s=2",
                            f"summarization.fan_in={args.fan_in}", "checkpointing.interval_s=10",
                            "source.kafka.starting_offsets=earliest",
                            f"sink.kafka.bootstrap_servers={broker.bootstrap}",
                            f"sink.kafka.topic_prefix={prefix}")
        client = build_job(config, f"kafka://{broker.bootstrap}/{topic}", str(root / "latency")).execute_async("lat")
        try:
            time.sleep(args.warmup_s)  # the job is up and reading before the first record
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
            gap = 1.0 / args.rate
            started = time.time()
            for i, record in enumerate(records):
                time.sleep(max(0.0, started + i * gap - time.time()))
                produced[(record["agent_id"], record["id"])] = time.time()
                producer.produce(topic, value=json.dumps(record).encode(), partition=i % args.partitions)
                producer.poll(0)
            producer.flush(30)
            deadline = time.time() + 120
            while len(committed) < len(produced) and time.time() < deadline:
                time.sleep(0.5)
        finally:
            client.cancel().result()
            stop.set()
            reader.join(timeout=10)
    seen = [committed[k] - t for k, t in produced.items() if k in committed]
    if len(seen) < len(produced):
        raise SystemExit(f"only {len(seen)} of {len(produced)} records reached a committed batch node")
    return {"records": len(produced), "rate_per_s": args.rate, "p50_s": round(percentile(seen, 0.5), 2),
            "p99_s": round(percentile(seen, 0.99), 2), "max_s": round(max(seen), 2)}


def cluster_run(cluster: StandaloneCluster, source: str, output: Path, parallelism: int, settings: list[str]
                ) -> dict[str, float]:
    """`flink run` at `parallelism`; seconds from submit to FINISHED, and Flink's job duration."""
    started = time.perf_counter()
    job_id = cluster.submit(JOB, "--input", source, "--output", str(output), "--parallelism", str(parallelism),
                            *(arg for setting in settings for arg in ("--set", setting)),
                            options=("--jarfile", str(connector_jar(None))))
    while (state := cluster.job_state(job_id)) not in ("FINISHED", "FAILED", "CANCELED"):
        time.sleep(0.2)
    wall_s = time.perf_counter() - started
    if state != "FINISHED":
        raise SystemExit(f"job {job_id} at parallelism {parallelism} ended {state}\n{cluster.logs()}")
    return {"wall_s": wall_s, "job_s": cluster.rest(f"/jobs/{job_id}")["duration"] / 1000}


def scaling(root: Path, broker: KafkaBroker, records: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    slots = args.taskmanagers
    topic = f"scale-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, slots)
    produce(broker.bootstrap, topic, [(r["agent_id"].encode(), json.dumps(r).encode(), i % slots)
                                      for i, r in enumerate(records)])
    expected = expected_units(records)
    runs: dict[int, dict[str, float]] = {}
    with ScriptedServer() as server:
        settings = ["llm.provider=openai", f"llm.base_url={server.base_url}", "embeddings.provider=none",
                    f"batching.max_items={args.max_items}", f"summarization.fan_in={args.fan_in}",
                    "checkpointing.interval_s=1", "job.poll_interval_ms=20", "journal.path=null",
                    "source.kafka.bounded=true", "source.kafka.starting_offsets=earliest"]
        for parallelism in (1, slots):
            output = root / f"p{parallelism}"
            # a fresh cluster per run: a thread-mode TaskManager fails a second Python job (pemja's native
            # library is already loaded by the first job's class loader: NoSuchFieldException loadedLibraryNames)
            with StandaloneCluster(root / f"cluster-p{parallelism}", taskmanagers=slots) as cluster:
                runs[parallelism] = cluster_run(cluster, f"kafka://{broker.bootstrap}/{topic}", output, parallelism,
                                                settings)
            covered = batch_units(read_outputs(str(output))["summaries"])
            if covered != expected:
                raise SystemExit(f"parallelism {parallelism}: the output covers {sum(covered.values())} units, "
                                 f"{len(records)} expected")
            print(f"  parallelism {parallelism}: {runs[parallelism]['wall_s']:.2f} s submit to FINISHED, job "
                  f"{runs[parallelism]['job_s']:.2f} s ({len(records) / runs[parallelism]['job_s']:.0f} records/s)",
                  flush=True)
    one, many = runs[1], runs[slots]
    return {"records": len(records), "taskmanagers": slots, "partitions": slots,
            **{f"p{p}_{key}": round(value, 2) for p, run in runs.items() for key, value in run.items()},
            **{f"p{p}_records_per_s": round(len(records) / run["job_s"]) for p, run in runs.items()},
            "ratio_job": round(one["job_s"] / many["job_s"], 3),
            "ratio_wall": round(one["wall_s"] / many["wall_s"], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--items-per-agent", type=int, default=200)
    parser.add_argument("--max-items", type=int, default=50)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--latency-records", type=int, default=3000)
    parser.add_argument("--latency-agents", type=int, default=20)
    parser.add_argument("--rate", type=float, default=100.0, help="records produced per second (latency)")
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--scaling", action="store_true",
                        help="only the scaling case: parallelism 1 against 2 on a standalone cluster")
    parser.add_argument("--taskmanagers", type=int, default=2, help="TaskManagers of one slot (scaling)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flink-memory-kafka-bench-") as tmp, \
            KafkaBroker(Path(tmp) / "broker", partitions=args.partitions) as broker:
        root = Path(tmp)
        if args.scaling:
            records = items(args.agents, args.items_per_agent)
            print(f"scaling: {len(records)} items of {args.agents} agents, batches of {args.max_items}, instant "
                  f"provider, bounded topic of {args.taskmanagers} partitions, standalone cluster of "
                  f"{args.taskmanagers} TaskManagers x 1 slot, flink run --parallelism 1 then {args.taskmanagers}",
                  flush=True)
            case = results["scaling"] = scaling(root, broker, records, args)
            print(f"  ratio p{args.taskmanagers} / p1 throughput: {case['ratio_job']} by job duration, "
                  f"{case['ratio_wall']} submit to FINISHED", flush=True)
        else:
            if not args.skip_throughput:
                records = items(args.agents, args.items_per_agent)
                print(f"throughput: {len(records)} items of {args.agents} agents, batches of {args.max_items}, "
                      f"instant provider, topic of {args.partitions} partitions", flush=True)
                case = results["throughput"] = throughput(root, broker, records, args)
                print(f"  files in and out {case['files_s']} s ({case['files_records_per_s']} records/s), Kafka in "
                      f"and out {case['kafka_s']} s ({case['kafka_records_per_s']} records/s): ratio Kafka / files "
                      f"{case['kafka_over_files']}", flush=True)
            print(f"latency: {args.latency_records} records of {args.latency_agents} agents produced at "
                  f"{args.rate:g}/s, unbounded, batching.flush_after_s=2, 10 s checkpoints, read_committed", flush=True)
            case = results["latency"] = latency(root, broker, args)
            print(f"  produce -> committed batch node: p50 {case['p50_s']} s, p99 {case['p99_s']} s, "
                  f"max {case['max_s']} s over {case['records']} records", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
