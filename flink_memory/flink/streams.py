"""What the job's pipeline hands to its sinks (and to a job that reuses it): its output streams."""

from __future__ import annotations

from dataclasses import dataclass

from pyflink.datastream import DataStream


@dataclass
class MemoryStreams:
    summaries: DataStream
    manifests: DataStream
    dead_letters: DataStream
    # the store's log: every node and unit-row message, numbered per agent and writer (LogEntry); written
    # exactly once to <output>/memory/, from which the store applier writes the store, and its unit rows
    # shown in the store at once (flink_memory.flink.store_sink)
    memory_log: DataStream | None = None
