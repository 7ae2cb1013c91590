"""What the job's pipeline hands to its sinks (and to a job that reuses it): its output streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyflink.datastream import DataStream

from flink_memory.stages.channels import DEAD_LETTERS, MANIFESTS, MEMORY_LOG, Channel


@dataclass
class MemoryStreams:
    """The last stage's summary nodes, and one stream per channel of flink_memory.topology.CHANNELS (by name),
    each of JSON lines as the channel writes them (`Channel.dump`; read back with `Channel.load`)."""

    summaries: DataStream
    channels: dict[str, DataStream] = field(default_factory=dict)

    def channel(self, channel: Channel[Any]) -> DataStream | None:
        return self.channels.get(channel.name)

    @property
    def dead_letters(self) -> DataStream:
        stream = self.channel(DEAD_LETTERS)
        assert stream is not None  # (the parser emits on it in every job)
        return stream

    @property
    def manifests(self) -> DataStream | None:
        return self.channel(MANIFESTS)

    @property
    def memory_log(self) -> DataStream | None:
        """The store's log: written exactly once to <output>/memory/, from which the store applier writes the
        store; its unit rows are shown in the store at once (flink_memory.flink.store_sink)."""
        return self.channel(MEMORY_LOG)
