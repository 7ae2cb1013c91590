"""Where the service's writes go: the running job's input, never the store (the job stays the only writer of
memory). A write is one input record, as a JSON line:

- a directory the job follows (`flink-memory run --input DIR --follow`): a new file per record, written under
  a hidden temporary name (Flink's file source skips names starting with `.`), synced, then renamed, so the
  job never reads half a record;
- a Kafka topic (`kafka://HOST:PORT/TOPIC`, the job's `--input`): one message keyed by agent id, sent by an
  idempotent producer and awaited (acks=all) before the service answers.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from flink_memory.kafka import is_kafka, parse_kafka_url

SEND_TIMEOUT_S = 10.0
log = logging.getLogger("flink_memory.service.kafka")


class WriteFailed(RuntimeError):
    """The record could not be handed to the job's input (the message says why); nothing was written."""


class RecordTooLarge(WriteFailed):
    """The job's input refused the record for its size (a Kafka message over the topic's limit)."""


class RecordWriter(Protocol):
    target: str

    def write(self, agent_id: str, line: str) -> None:
        """Hand one JSON line to the job's input; WriteFailed when it did not get there."""

    def close(self) -> None: ...


class DirectoryWriter:
    """One new file per record in the directory the job follows, written atomically."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise WriteFailed(f"--input {self.directory}: no such directory (the job's followed input)")
        self.target = "directory"

    def write(self, agent_id: str, line: str) -> None:
        name = f"api-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex}.jsonl"
        tmp = self.directory / f".{name}.tmp"
        try:
            with open(tmp, "x", encoding="utf-8") as out:
                out.write(line + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.directory / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise WriteFailed(f"cannot write to the job's input directory: {exc.strerror}") from None

    def close(self) -> None:
        pass


class KafkaWriter:
    """One message per record on the job's input topic (the first topic of the `kafka://` address)."""

    def __init__(self, url: str, properties: dict[str, str] | None = None) -> None:
        try:
            from confluent_kafka import KafkaError, KafkaException, Producer
        except ImportError:
            raise WriteFailed("--input kafka://... needs confluent-kafka: pip install 'flink-memory[service]'"
                              ) from None

        self._kafka_exception = KafkaException
        self._too_large = KafkaError.MSG_SIZE_TOO_LARGE
        address = parse_kafka_url(url)
        self.topic = address.topics[0]
        self.servers = address.bootstrap_servers
        self.target = "kafka"
        self.timeout_s = SEND_TIMEOUT_S
        # the client's own log lines (a broker it cannot reach, ...) go to logging, not straight to stderr
        self._producer = Producer({"bootstrap.servers": self.servers, "enable.idempotence": True, "acks": "all",
                                   "message.timeout.ms": int(self.timeout_s * 1000),
                                   "logger": log, **(properties or {})})

    def write(self, agent_id: str, line: str) -> None:
        from confluent_kafka import KafkaError

        outcome: dict[str, Any] = {}

        def delivered(error: Any, _message: Any) -> None:
            outcome["error"] = error

        try:
            self._producer.produce(self.topic, key=agent_id.encode("utf-8"), value=line.encode("utf-8"),
                                   on_delivery=delivered)
        except (BufferError, ValueError) as exc:
            raise WriteFailed(f"the job's input topic refused the record: {exc}") from None
        except self._kafka_exception as exc:  # e.g. over the producer's message.max.bytes
            raise self._refused(exc.args[0]) from None
        self._producer.flush(self.timeout_s + 1)
        error = outcome.get("error", KafkaError(KafkaError._MSG_TIMED_OUT))
        if error is None:
            return
        # (the answer goes to the API's caller: it names no broker; the log does)
        log.warning("the Kafka input %s on %s: %s", self.topic, self.servers, error.str())
        if error.code() == KafkaError._MSG_TIMED_OUT:
            raise WriteFailed(f"the record was not confirmed by the job's input topic within {self.timeout_s:g} s "
                              "(is its broker up?)")
        raise self._refused(error)

    def _refused(self, error: Any) -> WriteFailed:
        """What to raise for a record the producer or the broker refused: RecordTooLarge for its size."""
        if error.code() == self._too_large:
            return RecordTooLarge(f"the record is over the job's input topic's message size limit: {error.str()}")
        return WriteFailed(f"the job's input topic refused the record: {error.str()}")

    def close(self) -> None:
        self._producer.flush(self.timeout_s)


def open_writer(target: str | None) -> RecordWriter | None:
    """The writer of `--input` (a directory or kafka://...), None without one (the server is read-only)."""
    if target is None:
        return None
    if is_kafka(target):
        return KafkaWriter(target)
    return DirectoryWriter(target)


def as_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))
