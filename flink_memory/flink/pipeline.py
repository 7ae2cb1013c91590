"""Wiring: the environment, the file source, the operators with fixed uids, and exactly-once file sinks.

`add_memory_operators` is the public entry for other PyFlink jobs: give it any DataStream of JSON lines
(or dicts, or records) and get back the summary, manifest and dead-letter streams.
"""

from __future__ import annotations

import json
import logging
import os
import site
import sys
from pathlib import Path
from typing import Any

from pyflink.common import Configuration, Encoder, Types, WatermarkStrategy
from pyflink.datastream import DataStream, RuntimeExecutionMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import (
    BucketAssigner,
    FileSink,
    FileSource,
    OutputFileConfig,
    RollingPolicy,
    StreamFormat,
)

from flink_memory import history
from flink_memory.config import Config, ConfigError
from flink_memory.flink.operators import KEYED, ParseRecords, StageFunction, output_tag
from flink_memory.flink.store_sink import STORE_SINK_UID, add_store_sink
from flink_memory.flink.streams import MemoryStreams
from flink_memory.kafka import is_kafka, parse_kafka_url
from flink_memory.stages.channels import DEAD_LETTERS, Channel
from flink_memory.stages.messages import Rebase, to_wire
from flink_memory.topology import CHANNELS, PARSE_OPERATOR, STAGES, check

log = logging.getLogger(__name__)

# Operator uids are part of the savepoint contract: never change them without a migration note. The keyed
# stages' are in flink_memory.topology (with a "-thread" suffix in thread mode: StageSpec.uid_for); each
# channel's file sink's follows its output (Channel.sink_uid).
UIDS = {
    "source": "flink-memory-source",
    "parse": "flink-memory-parse",
    "sink_summaries": "flink-memory-sink-summaries",
    **{f"sink_{channel.output.replace('-', '_')}": channel.sink_uid for channel in CHANNELS},
    "sink_store": STORE_SINK_UID,
}


def flink_configuration(config: Config, output_dir: str | None, restore: str | None = None,
                        rest_port: int | None = None) -> Configuration:
    conf = Configuration()
    if rest_port is not None:  # local runs: the CLI reads progress from the MiniCluster's REST API
        conf.set_string("rest.bind-address", "127.0.0.1")
        conf.set_string("rest.bind-port", str(rest_port))
        # the REST API serves metrics it fetched at most this long ago (default 10 s): the progress line
        # shows calls as they end, so it reads them fresh
        conf.set_string("metrics.fetcher.update-interval", "1000")
    submitted = "PYFLINK_GATEWAY_PORT" in os.environ  # started by `flink run -py`: its -pyexec decides
    if not submitted:
        conf.set_string("python.executable", sys.executable)
        conf.set_string("python.client.executable", sys.executable)
    conf.set_string("python.execution-mode", config.job.execution_mode)
    if config.job.execution_mode == "thread":  # Python runs in the TaskManager JVM: it needs our packages
        conf.set_string("python.pythonpath", config.job.python_path or _own_python_path())
    conf.set_string("python.fn-execution.memory.managed", str(config.job.share_python_worker).lower())
    conf.set_string("python.fn-execution.bundle.size", str(config.job.bundle_size))
    conf.set_string("python.fn-execution.bundle.time", str(config.job.bundle_time_ms))
    conf.set_string("parallelism.default", str(config.job.parallelism))
    conf.set_string("taskmanager.network.memory.buffer-debloat.enabled", "true")
    conf.set_string("state.backend.type", config.checkpointing.state_backend)
    if config.checkpointing.interval_s > 0:
        conf.set_string("execution.checkpointing.interval", f"{int(config.checkpointing.interval_s * 1000)} ms")
        conf.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
        # a checkpoint that expires while slow work holds an operator must not fail the job
        conf.set_string("execution.checkpointing.tolerable-failed-checkpoints",
                        str(config.checkpointing.tolerable_failures))
        conf.set_string("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION")
        directory = config.checkpointing.dir or (_beside(output_dir, "_checkpoints") if output_dir else None)
        if directory:
            if "://" not in directory:
                directory = Path(directory).resolve().as_uri()
            conf.set_string("execution.checkpointing.dir", directory)
    if config.checkpointing.restart_attempts == 0:  # Flink's exponential-delay strategy needs at least one
        conf.set_string("restart-strategy.type", "none")
    else:
        conf.set_string("restart-strategy.type", "exponential-delay")
        conf.set_string("restart-strategy.exponential-delay.initial-backoff",
                        f"{int(config.checkpointing.restart_backoff_s * 1000)} ms")
        conf.set_string("restart-strategy.exponential-delay.max-backoff", "60 s")
        conf.set_string("restart-strategy.exponential-delay.attempts-before-reset-backoff",
                        str(config.checkpointing.restart_attempts))
    if restore:
        conf.set_string("execution.state-recovery.path",
                        restore if "://" in restore else Path(restore).resolve().as_uri())
    return conf


def _beside(output_dir: str, name: str) -> str:
    """A folder in the output directory: a local path made absolute, a remote one (s3://...) kept."""
    if "://" in output_dir and not output_dir.startswith("file://"):
        return f"{output_dir.rstrip('/')}/{name}"
    return str(Path(output_dir.removeprefix("file://")).resolve() / name)


def _own_python_path() -> str:
    """Site-packages of the interpreter building the job (and this checkout, for editable installs)."""
    paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
    paths.append(str(Path(__file__).resolve().parents[2]))
    return os.pathsep.join(paths)


def create_environment(config: Config, output_dir: str | None, restore: str | None = None,
                       rest_port: int | None = None) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment.get_execution_environment(
        flink_configuration(config, output_dir, restore, rest_port))
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    env.set_parallelism(config.job.parallelism)
    return env


def file_source(env: StreamExecutionEnvironment, input_path: str, follow: bool = False,
                follow_interval_s: float = 1.0) -> DataStream:
    """A file or a directory of JSON-lines files; with `follow`, new files are picked up as they appear."""
    from pyflink.common import Duration

    path = input_path if "://" in input_path else str(Path(input_path).resolve())
    builder = FileSource.for_record_stream_format(StreamFormat.text_line_format(), path)
    if follow:
        builder = builder.monitor_continuously(Duration.of_millis(int(follow_interval_s * 1000)))
    return env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), "memory-input").uid(UIDS["source"])


def _to_line(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if hasattr(value, "model_dump"):
        data = value.model_dump(mode="json")
        data.pop("kind", None)
        return json.dumps(data, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, default=str)


def _check_execution_mode(stream: DataStream, config: Config) -> None:
    """The stage uids and PyFlink's state layout follow the Python execution mode: the job's environment
    must run the mode the config names, or a restore would meet state of the other layout."""
    try:
        conf = stream.get_execution_environment()._j_stream_execution_environment.getConfiguration()
        mode = conf.toMap().get("python.execution-mode")
    except Exception:  # noqa: BLE001 - (a PyFlink without this internal: nothing to compare)
        return
    if mode is None:
        log.warning("this job's environment does not set python.execution-mode; job.execution_mode (%s) is "
                    "assumed: build it with flink_configuration(config, output_dir)", config.job.execution_mode)
    elif mode != config.job.execution_mode:
        raise ConfigError(f"the job's python.execution-mode is {mode} but job.execution_mode is "
                          f"{config.job.execution_mode}: build the environment with flink_configuration(config, "
                          f"output_dir) or set job.execution_mode: {mode}")


def add_memory_operators(stream: DataStream, config: Config, output_dir: str | None = None, *,
                         bounded: bool = False, parse: ParseRecords | None = None,
                         rebase: list[str] | None = None) -> MemoryStreams:
    """Add parse, plan, batch and merge to `stream` (JSON strings, dicts or our record models).

    Returns the summary nodes, and each channel of the topology (dead letters, manifests, the memory log) as
    DataStreams of JSON strings. The operator
    uids are fixed (see UIDS), so a job that embeds these operators can restore their state. `bounded`
    (the input ends, e.g. a file read once): partial batches close and globals are made when the input
    ends, not on timeouts; otherwise `batching.flush_after_s` and `summarization.global_refresh_s` apply.
    `parse`: the function that reads `stream`'s elements (e.g. Kafka rows), instead of JSON lines. `rebase`:
    agents whose logs open this job's branch at once (a restore: flink_memory.history.held_agents).
    """
    _check_execution_mode(stream, config)
    check(config)
    journal = config.journal.model_copy(update={"path": config.journal.location()})
    config = config.model_copy(update={"journal": journal})
    config_json = config.model_dump_json()
    if parse is None:
        stream = stream.map(_to_line, output_type=Types.STRING()).name("memory-to-json").uid("flink-memory-to-json")
    upstream = stream.process(parse or ParseRecords(), output_type=KEYED).name(PARSE_OPERATOR).uid(UIDS["parse"])
    channels: dict[Channel[Any], list[DataStream]] = {DEAD_LETTERS: [upstream.get_side_output(
        output_tag(DEAD_LETTERS))]}
    for index, spec in enumerate(STAGES):  # (the last stage's records leave the job: JSON alone, not keyed)
        keyed = index + 1 < len(STAGES)
        if spec.rebased and rebase:
            touch = stream.get_execution_environment().from_collection(
                [(agent, *to_wire(Rebase())) for agent in rebase], type_info=KEYED)
            upstream = upstream.union(touch.name("rebase-agents").uid("flink-memory-rebase"))
        function = StageFunction(spec, config_json, output_dir, bounded, keyed_output=keyed)
        upstream = (upstream.key_by(lambda r: r[0], key_type=Types.STRING())
                    .process(function, output_type=KEYED if keyed else Types.STRING())
                    .name(spec.operator).uid(spec.uid_for(config.job.execution_mode)))
        for channel in spec.channels:
            channels.setdefault(channel, []).append(upstream.get_side_output(output_tag(channel)))
    return MemoryStreams(upstream, {c.name: _union(channels[c]) for c in CHANNELS if c in channels})


def _union(streams: list[DataStream]) -> DataStream:
    return streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]


def file_sink(base_path: str, name: str) -> FileSink:
    """Row-format JSON lines, rolled and committed on checkpoints: exactly once."""
    return (
        FileSink.for_row_format(base_path, Encoder.simple_string_encoder())
        .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner())
        .with_output_file_config(OutputFileConfig.builder().with_part_prefix(name).with_part_suffix(".jsonl").build())
        .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy())
        .build()
    )


def add_file_sinks(streams: MemoryStreams, output_dir: str) -> None:
    """summaries/ and one folder per channel (manifests/, dead-letters/, memory/: the store's log) under
    `output_dir`, exactly once."""
    root = output_dir if "://" in output_dir else str(Path(output_dir).resolve())
    outputs = [("summaries", streams.summaries, UIDS["sink_summaries"])]
    outputs += [(c.output, stream, c.sink_uid) for c in CHANNELS if (stream := streams.channel(c)) is not None]
    for name, stream, uid in outputs:
        stream.sink_to(file_sink(f"{root}/{name}", name)).name(f"sink-{name}").uid(uid)


def build_job(config: Config, input_path: str, output_dir: str, *, follow: bool = False,
              restore: str | None = None, rest_port: int | None = None) -> StreamExecutionEnvironment:
    """The whole job: a file or Kafka input; files, the store and Kafka (sink.kafka) as outputs. The job's
    history is claimed first (flink_memory.history.start: refused, with what to do, when the output or the
    store belongs to another job)."""
    config = history.start(config, output_dir, restore)
    # (a restore rebases the store's agents through a source of their names; with Kafka in or out, operators
    # the Table API makes carry no uid, and a source more would change their ids: there each agent follows
    # the restored job at its next record instead)
    kafka_anywhere = is_kafka(input_path) or bool(config.sink.kafka.bootstrap_servers)
    rebase = history.held_agents(config, output_dir) if restore and not kafka_anywhere else []
    env = create_environment(config, output_dir, restore, rest_port)
    kafka_in = is_kafka(input_path)
    t_env = None
    if kafka_in or config.sink.kafka.bootstrap_servers:
        from flink_memory.flink import kafka_connector as kafka

        kafka.load_connector(env, config)
        t_env = kafka.table_environment(env)
    if kafka_in:
        try:
            source = parse_kafka_url(input_path)
        except ValueError as exc:
            raise ConfigError(f"--input {exc}") from None
        rows = kafka.kafka_source(t_env, source, config)
        streams = add_memory_operators(rows, config, output_dir, bounded=config.source.kafka.bounded,
                                       parse=kafka.ParseKafkaValues(config.source.kafka.max_value_bytes),
                                       rebase=rebase)
    else:
        streams = add_memory_operators(file_source(env, input_path, follow, config.source.follow_interval_s), config,
                                       output_dir, bounded=not follow, rebase=rebase)
    add_file_sinks(streams, output_dir)
    store_url = config.store.location(output_dir)
    if store_url:
        add_store_sink(streams, store_url, config.embeddings, config.store.applier_warn_after_s, config.job.branch)
    if config.sink.kafka.bootstrap_servers:
        kafka.add_kafka_sinks(t_env, streams, config, output_dir)
    return env
