"""Kafka as the job sees it, in plain Python: the `kafka://` input form, the source and sink settings, the
topic names, and the connector jar. The Flink wiring is in flink_memory/flink/kafka_connector.py; what a value means
(a record or a dead letter) is decided in flink_memory/records.py (`parse_kafka_value`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# The connector build the job loads: the fat jar whose relocated classes pyflink.datastream.connectors.kafka
# and the Table API's 'kafka' connector call. tests/kafka/pom.xml fetches it into the Maven cache.
CONNECTOR = ("org.apache.flink", "flink-sql-connector-kafka", "5.0.0-2.2")
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class KafkaSourceConfig(_Section):
    group_id: str = Field("flink-memory", min_length=1)
    # earliest | latest | committed (the group's offsets; earliest where it has none) | timestamp:MS
    starting_offsets: str = Field("committed", pattern=r"^(earliest|latest|committed|timestamp:\d+)$")
    # true: stop at the end offsets that exist when the job starts (a backfill); false: read for ever
    bounded: bool = False
    # a value longer than this is a dead letter ("oversized"), never parsed
    max_value_bytes: int = Field(1_048_576, ge=1)
    # any consumer property (bootstrap.servers comes from the input address)
    properties: dict[str, str] = Field(default_factory=dict)


class KafkaSinkConfig(_Section):
    # HOST:PORT[,HOST:PORT]; null: no Kafka output
    bootstrap_servers: str | None = None
    topic_prefix: str = Field("flink-memory.", pattern=r"^[A-Za-z0-9._\-]*$")
    # transactions committed on checkpoints: must stay below the broker's transaction.max.timeout.ms
    transaction_timeout_s: float = Field(600.0, gt=0)
    # write <prefix>memory, the log-compacted live memory (each live node; a tombstone for each replaced one)
    memory_topic: bool = True
    # any producer property
    properties: dict[str, str] = Field(default_factory=dict)


class SourceConfig(_Section):
    # --follow: how often the input directory is listed for new files (seconds); the most a new file waits
    follow_interval_s: float = Field(1.0, gt=0)
    kafka: KafkaSourceConfig = Field(default_factory=KafkaSourceConfig)


class SinkConfig(_Section):
    kafka: KafkaSinkConfig = Field(default_factory=KafkaSinkConfig)


@dataclass(frozen=True)
class KafkaInput:
    """`kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC]`, taken apart."""

    bootstrap_servers: str
    topics: tuple[str, ...]


def is_kafka(input_path: str) -> bool:
    return input_path.startswith("kafka://")


def bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of each HOST:PORT of a bootstrap list (an IPv6 host without its brackets); a malformed
    entry is refused naming it."""
    addresses = []
    for entry in (e.strip() for e in bootstrap.split(",") if e.strip()):
        if not _ADDRESS.match(entry):
            raise ValueError(f"{entry!r} is not HOST:PORT")
        host, _, port = entry.rpartition(":")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def parse_kafka_url(url: str) -> KafkaInput:
    """The servers and topics of a `kafka://` input; a malformed one is refused with what is expected."""
    expected = "expected kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC]"
    if not is_kafka(url):
        raise ValueError(f"{url!r} is not a Kafka input: {expected}")
    servers, _, topics = url.removeprefix("kafka://").partition("/")
    hosts = [s.strip() for s in servers.split(",") if s.strip()]
    names = [t.strip() for t in topics.split(",") if t.strip()]
    if not hosts or not all(_ADDRESS.match(h) for h in hosts):
        raise ValueError(f"{url!r}: no valid HOST:PORT before the topic ({expected})")
    if not names or not all(_TOPIC.match(t) for t in names):
        raise ValueError(f"{url!r}: no valid topic name after the servers ({expected})")
    return KafkaInput(",".join(hosts), tuple(names))


def position(topic: str, partition: int, offset: int) -> str:
    """A dead letter's `position` for a Kafka record: topic, partition and offset, as `topic/partition@offset`."""
    return f"{topic}/{partition}@{offset}"


def topics(prefix: str) -> dict[str, str]:
    """The output topics by what they carry."""
    return {name: f"{prefix}{name}" for name in ("summaries", "dead-letters", "manifests", "memory")}


def memory_key(agent_id: str, node_id: str) -> str:
    """The compaction key of `<prefix>memory`: one live value (or a tombstone) per agent and node."""
    return f"{agent_id}/{node_id}"


def shipped_connector(pipeline_jars: str | None) -> str | None:
    """The Kafka connector jar the submitter already ships (`flink run --jarfile`, or `pipeline.jars`), if any:
    the job then needs no copy of its own, so a client without the Maven cache can submit it."""
    for entry in (pipeline_jars or "").strip("[]").replace(";", ",").split(","):
        jar = entry.strip().strip("'\"")
        name = jar.rsplit("/", 1)[-1]
        if name.startswith(("flink-sql-connector-kafka", "flink-connector-kafka")) and name.endswith(".jar"):
            return jar
    return None


def connector_jar(configured: str | None) -> Path:
    """The connector jar: job.kafka_connector_jar, else the Maven cache's copy of CONNECTOR."""
    if configured:
        path = Path(configured.removeprefix("file://")).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"job.kafka_connector_jar = {configured!r}: no such file")
        return path.resolve()
    group, artifact, version = CONNECTOR
    path = (Path.home() / ".m2" / "repository" / group.replace(".", "/") / artifact / version
            / f"{artifact}-{version}.jar")
    if not path.is_file():
        raise FileNotFoundError(
            f"the Kafka connector jar is not in the Maven cache ({path}): fetch it with `mvn -f tests/kafka/pom.xml "
            f"package` (make install does) or `mvn dependency:get -Dartifact={group}:{artifact}:{version}`, or "
            "set job.kafka_connector_jar")
    return path
