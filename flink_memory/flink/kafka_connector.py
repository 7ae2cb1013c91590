"""Kafka in and out: the connector jar, a start-up check of the brokers, the source and the exactly-once sinks.

Both ends go through the Table API's 'kafka' connector with the 'raw' format (the same KafkaSource and
KafkaSink underneath): it hands over each value's bytes untouched (null for a tombstone) with its topic,
partition and offset, which the DataStream API's value deserializers do not, and it writes a key and a value
(or a null value: a tombstone) per row. What a value means is decided in `records.parse_kafka_value`.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyflink.common import Row, Types
from pyflink.datastream import DataStream, StreamExecutionEnvironment
from pyflink.java_gateway import get_gateway
from pyflink.table import StreamTableEnvironment
from pyflink.util.java_utils import to_jarray

from flink_memory.config import Config, ConfigError
from flink_memory.flink.operators import ParseRecords
from flink_memory.kafka import (
    KafkaInput,
    bootstrap_addresses,
    connector_jar,
    memory_key,
    position,
    shipped_connector,
    topics,
)
from flink_memory.records import DeadLetter, InputRecord, parse_kafka_value

CHECK_TIMEOUT_S = 20.0
KEY_VALUE = Types.ROW_NAMED(["k", "v"], [Types.STRING(), Types.STRING()])
_STARTUP = {"earliest": "earliest-offset", "latest": "latest-offset", "committed": "group-offsets"}
_ADMIN = "org.apache.flink.kafka.shaded.org.apache.kafka.clients.admin"
_connector_urls: list[str] = []
_loaders: dict[tuple[str, ...], Any] = {}


class KafkaUnavailable(ConfigError):
    """The brokers did not answer at start, or an input topic is missing; the message names the address."""


def load_connector(env: StreamExecutionEnvironment, config: Config) -> None:
    """Ship the connector jar with the job (pipeline.jars) and make its classes visible to this client; a jar
    the submitter ships already (`flink run --jarfile`, `-D pipeline.jars=...`) is used as it is."""
    shipped = str(env._j_stream_execution_environment.getConfiguration().toMap().get("pipeline.jars"))
    given = shipped_connector(shipped)
    if not config.job.kafka_connector_jar and given:
        _connector_urls[:] = [given if ":" in given.split("/", 1)[0] else Path(given).resolve().as_uri()]
        return
    try:
        jar = connector_jar(config.job.kafka_connector_jar)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    uri = jar.as_uri()
    if uri not in shipped:
        env.add_jars(uri)
    _connector_urls[:] = [uri]


def _connector_loader(jvm: Any) -> Any:
    """A class loader over the connector jar, made once. Py4J finds a class, and Kafka its plugins, through
    the context class loader of the JVM thread that serves a call; only the gateway thread that ran
    `add_jars` has the jar in it, and a call lands on another one when Python threads share the gateway."""
    key = tuple(_connector_urls)
    if key not in _loaders:
        loader = jvm.Thread.currentThread().getContextClassLoader()
        if key:
            urls = to_jarray(jvm.java.net.URL, [jvm.java.net.URL(url) for url in key])
            loader = jvm.java.net.URLClassLoader(urls, loader)
        _loaders[key] = loader
    return _loaders[key]


def _admin_class(jvm: Any, name: str) -> Any:
    return jvm.java.lang.Class.forName(f"{_ADMIN}.{name}", True, _connector_loader(jvm))


def _admin_client(jvm: Any, props: Any, tries: int = 3) -> Any:
    """AdminClient.create with the connector's loader as the serving thread's context loader (Kafka loads its
    metric reporters and login modules through it; the admin's own threads inherit it). Setting the loader and
    creating are two gateway calls, which another Python thread can come between: then it is tried again."""
    create = _admin_class(jvm, "AdminClient").getMethod("create", to_jarray(jvm.Class, [props.getClass()]))
    for attempt in range(tries):
        jvm.Thread.currentThread().setContextClassLoader(_connector_loader(jvm))
        try:
            return create.invoke(None, to_jarray(jvm.Object, [props]))
        except Py4JJavaError as exc:
            if "cannot be found" not in str(exc) or attempt == tries - 1:
                raise


def table_environment(env: StreamExecutionEnvironment) -> StreamTableEnvironment:
    return StreamTableEnvironment.create(env)


def _options(values: dict[str, str]) -> str:
    return ", ".join(f"'{k}' = '{str(v).replace(chr(39), chr(39) * 2)}'" for k, v in values.items())


def check_brokers(bootstrap: str, properties: dict[str, str], *, need: tuple[str, ...] = (),
                  create: dict[str, dict[str, str]] | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Ask the brokers at `bootstrap` for the cluster within `timeout_s`: an unreachable address is an error
    naming it, at start, instead of a source that retries for ever. Topics in `need` must exist; those in
    `create` are created (with their configs) when missing."""
    _reachable(bootstrap, timeout_s)
    jvm = get_gateway().jvm
    props = jvm.java.util.Properties()
    for key, value in properties.items():
        props.setProperty(key, value)
    millis = str(int(timeout_s * 1000))
    props.setProperty("bootstrap.servers", bootstrap)
    props.setProperty("request.timeout.ms", millis)
    props.setProperty("default.api.timeout.ms", millis)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    admin = _admin_client(jvm, props)
    try:
        try:
            admin.describeCluster().nodes().get(int(timeout_s), seconds)
            existing = set(admin.listTopics().names().get(int(timeout_s), seconds))
        except Exception as exc:  # noqa: BLE001 - (a Py4J error around a timeout or a refused connection)
            cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise KafkaUnavailable(f"Kafka at {bootstrap} did not answer within {timeout_s:.0f} s ({cause}): "
                                   "check the address and that the brokers are up") from None
        missing = [t for t in need if t not in existing]
        if missing:
            raise KafkaUnavailable(f"Kafka at {bootstrap} has no topic {', '.join(missing)}")
        optional = jvm.java.util.Optional.empty()
        string = jvm.java.lang.Class.forName("java.lang.String")
        new_topic = _admin_class(jvm, "NewTopic").getConstructor(
            to_jarray(jvm.Class, [string, optional.getClass(), optional.getClass()]))
        new = [new_topic.newInstance(to_jarray(jvm.Object, [name, optional, optional])).configs(_java_map(jvm, configs))
               for name, configs in (create or {}).items() if name not in existing]
        if new:
            try:
                admin.createTopics(_java_list(jvm, new)).all().get(int(timeout_s), seconds)
            except Exception as exc:  # noqa: BLE001 - (created meanwhile by another job: fine)
                if "TopicExists" not in str(exc):
                    raise KafkaUnavailable(f"Kafka at {bootstrap}: creating the output topics failed: "
                                           f"{str(exc).strip().splitlines()[0][:300]}") from None
    finally:
        admin.close()


def _reachable(bootstrap: str, timeout_s: float) -> None:
    """Fail at once when no bootstrap address takes a connection (refused, or no such host): the admin client
    would retry until its timeout before saying the same."""
    try:
        addresses = bootstrap_addresses(bootstrap)
    except ValueError as exc:
        raise KafkaUnavailable(f"Kafka at {bootstrap}: {exc}") from None
    reasons = []
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    raise KafkaUnavailable(f"Kafka at {bootstrap} did not answer ({'; '.join(reasons) or 'no address'}): "
                           "check the address and that the brokers are up")


def _java_map(jvm: Any, values: dict[str, str]) -> Any:
    mapping = jvm.java.util.HashMap()
    for key, value in values.items():
        mapping.put(key, value)
    return mapping


def _java_list(jvm: Any, values: list[Any]) -> Any:
    out = jvm.java.util.ArrayList()
    for value in values:
        out.add(value)
    return out


class ParseKafkaValues(ParseRecords):
    """(topic, partition, offset, value bytes) rows to keyed records; a bad value is a dead letter whose
    position names its topic, partition and offset."""

    def __init__(self, max_value_bytes: int) -> None:
        self.max_value_bytes = max_value_bytes

    def parse(self, value: Any) -> InputRecord | DeadLetter:
        return parse_kafka_value(value[3], position(value[0], value[1], value[2]), self.max_value_bytes)


def kafka_source(t_env: StreamTableEnvironment, source: KafkaInput, config: Config) -> DataStream:
    """The input topics as a stream of (topic, partition, offset, value) rows; offsets are checkpointed."""
    settings = config.source.kafka
    options = {"connector": "kafka", "topic": ";".join(source.topics),
               "properties.bootstrap.servers": source.bootstrap_servers, "properties.group.id": settings.group_id,
               "value.format": "raw", "properties.auto.offset.reset": "earliest",
               "properties.partition.discovery.interval.ms": "30000"}
    if settings.starting_offsets.startswith("timestamp:"):
        options["scan.startup.mode"] = "timestamp"
        options["scan.startup.timestamp-millis"] = settings.starting_offsets.split(":", 1)[1]
    else:
        options["scan.startup.mode"] = _STARTUP[settings.starting_offsets]
    if settings.bounded:
        options["scan.bounded.mode"] = "latest-offset"
    options.update({f"properties.{k}": v for k, v in settings.properties.items()})
    check_brokers(source.bootstrap_servers, settings.properties, need=source.topics)
    t_env.execute_sql(
        "CREATE TEMPORARY TABLE flink_memory_input (`topic` STRING METADATA VIRTUAL, "
        "`partition` INT METADATA VIRTUAL, `offset` BIGINT METADATA VIRTUAL, `value` BYTES) "
        f"WITH ({_options(options)})")
    table = t_env.sql_query("SELECT `topic`, `partition`, `offset`, `value` FROM flink_memory_input")
    return t_env.to_data_stream(table)


def _keyed(key_field: str) -> Any:
    def to_row(line: str) -> Row:
        return Row(str(json.loads(line).get(key_field) or ""), line)
    return to_row


def _memory_rows(line: str) -> Any:
    """A summary node for <prefix>memory: the node under its key, and a tombstone for each node it replaces."""
    node = json.loads(line)
    for replaced in node.get("replaces") or ():
        yield Row(memory_key(node["agent_id"], replaced), None)
    yield Row(memory_key(node["agent_id"], node["node_id"]), line)


def transactional_prefix(config: Config, output_dir: str | None, name: str) -> str:
    """Stable for one job (its sink, topics and output), distinct between jobs: a restarted job aborts its
    own lingering transactions and never another job's."""
    sink = config.sink.kafka
    seed = f"{sink.bootstrap_servers}|{sink.topic_prefix}|{output_dir}"
    return f"flink-memory-{hashlib.sha256(seed.encode()).hexdigest()[:12]}-{name}"


def add_kafka_sinks(t_env: StreamTableEnvironment, streams: Any, config: Config, output_dir: str | None) -> None:
    """<prefix>summaries, dead-letters and manifests (and memory, log-compacted), exactly once."""
    sink = config.sink.kafka
    assert sink.bootstrap_servers
    names = topics(sink.topic_prefix)
    timeout_ms = str(int(sink.transaction_timeout_s * 1000))
    interval_s = config.checkpointing.interval_s
    if interval_s <= 0 or interval_s >= sink.transaction_timeout_s:
        raise ConfigError(f"sink.kafka needs checkpoints shorter than sink.kafka.transaction_timeout_s "
                          f"({sink.transaction_timeout_s} s): checkpointing.interval_s = {interval_s}")
    outputs: list[tuple[str, DataStream]] = [
        ("summaries", streams.summaries.map(_keyed("agent_id"), output_type=KEY_VALUE)),
        ("dead-letters", streams.dead_letters.map(_keyed("agent_id"), output_type=KEY_VALUE)),
        ("manifests", streams.manifests.map(_keyed("agent_id"), output_type=KEY_VALUE)),
    ]
    create = {names[name]: {} for name, _ in outputs}
    if sink.memory_topic:
        outputs.append(("memory", streams.summaries.flat_map(_memory_rows, output_type=KEY_VALUE)))
        create[names["memory"]] = {"cleanup.policy": "compact"}
    check_brokers(sink.bootstrap_servers, sink.properties, create=create)
    statements = t_env.create_statement_set()
    for name, rows in outputs:
        table_name = f"flink_memory_out_{name.replace('-', '_')}"
        options = {"connector": "kafka", "topic": names[name], "properties.bootstrap.servers": sink.bootstrap_servers,
                   "key.format": "raw", "key.fields": "k", "value.format": "raw", "value.fields-include": "EXCEPT_KEY",
                   "sink.delivery-guarantee": "exactly-once",
                   "sink.transactional-id-prefix": transactional_prefix(config, output_dir, name),
                   "properties.transaction.timeout.ms": timeout_ms}
        options.update({f"properties.{k}": v for k, v in sink.properties.items()})
        t_env.execute_sql(f"CREATE TEMPORARY TABLE {table_name} (k STRING, v STRING) WITH ({_options(options)})")
        statements.add_insert(table_name, t_env.from_data_stream(rows))
    statements.attach_as_datastream()
