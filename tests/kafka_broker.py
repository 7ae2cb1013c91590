"""A real single-node Kafka broker (KRaft, broker and controller in one JVM) for tests, from the pinned jars
tests/kafka/pom.xml fetches into .jars/kafka-broker/ (`make` runs it; so does this module when they are missing).

`KafkaBroker(workdir).start()` formats the storage, starts `kafka.Kafka` on free loopback ports and waits until
it answers; `stop()` kills it. `restart()` keeps the data (for outage drills)."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "tests" / "kafka" / "pom.xml"
BROKER_JARS = ROOT / ".jars" / "kafka-broker"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch_jars() -> Path:
    """The broker's jars and the Flink connector jar, fetched with Maven when missing (cached in ~/.m2)."""
    if not any(BROKER_JARS.glob("kafka_2.13-*.jar")):
        subprocess.run(["mvn", "-B", "-q", "-f", str(POM), "package"], check=True, timeout=900)
    return BROKER_JARS


class KafkaBroker:
    def __init__(self, workdir: Path, partitions: int = 1) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = workdir / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.properties = workdir / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(workdir / "data"),
            "num.partitions": str(partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            # the broker default (15 min): the job must set transaction.timeout.ms below it
            "transaction.max.timeout.ms": "900000",
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", "-Xmx512m", "-XX:+UseSerialGC", "-cp", f"{fetch_jars()}/*",
                f"-Dkafka.logs.dir={self.workdir}", main, *args]

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        if not (self.workdir / "data" / "meta.properties").exists():
            # (an id that starts with "-" would read as an option of StorageTool: Kafka's own ids never do)
            cluster_id = "k" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")[1:]
            format_command = self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                        str(self.properties))
            subprocess.run(format_command, check=True, timeout=120, capture_output=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self._java("kafka.Kafka", str(self.properties)), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited ({self.process.returncode}):\n{self.tail()}")
            if self._ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Kafka broker did not answer in {timeout_s} s:\n{self.tail()}")

    def _ready(self) -> bool:
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:  # (no client: an open port will do)
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0
        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
            metadata = admin.list_topics(timeout=2)
            return bool(metadata.brokers)
        except Exception:  # noqa: BLE001 - (not up yet)
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stops the broker, waits `down_s`, starts it again on the same ports with the same data."""
        self.stop()
        time.sleep(down_s)
        self.start()

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_topic(bootstrap: str, name: str, partitions: int, **config: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])
    futures[name].result(timeout=30)


def produce(bootstrap: str, topic: str, values: list[tuple[bytes | None, bytes | None, int | None]]) -> None:
    """(key, value, partition) records, all acknowledged before it returns."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.max.bytes": 10_000_000})
    for key, value, partition in values:
        if partition is None:
            producer.produce(topic, value=value, key=key)
        else:
            producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(60) == 0, "records left unacknowledged"


def consume_all(bootstrap: str, topic: str, timeout_s: float = 60.0, idle_s: float = 3.0
                ) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of `topic` from the start (read_committed), as (key, value), until none came
    for `idle_s`. Partitions are assigned, not subscribed: no group to join."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last < idle_s:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            out.append((message.key(), message.value()))
            last = time.monotonic()
    finally:
        consumer.close()
    return out
