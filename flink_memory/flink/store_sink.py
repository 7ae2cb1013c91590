"""The store sink: every summary node is upserted into the live-memory store as the merger emits it, and
every unit row as the batcher sends it (flink_memory.stages.unit_rows: a unit is searchable once accepted).

Terminal and at-least-once by design: a node is written when it is produced, not when a checkpoint
completes, and a replay after a failure writes the nodes again under the same (agent_id, node_id), which
the store's idempotent upsert turns into the same rows (flink_memory.store). With `embeddings` (a provider
other than none) the written rows are embedded on a thread of their own (flink_memory.store.backfill),
reusing the vector of a live row with the same text: no node waits for its vector, and a row not yet
embedded is found by keyword meanwhile; the sink's close waits (up to CLOSE_WAIT_S) for the last vectors. Reuse it in other jobs beside
`add_file_sinks`: `add_store_sink(streams, "postgresql://...", config.embeddings)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyflink.datastream import DataStream, ProcessFunction, RuntimeContext

from flink_memory.config import EmbeddingsConfig
from flink_memory.embeddings import embedder_for
from flink_memory.stages.unit_rows import unit_rows_of
from flink_memory.store import MemoryStore, open_store
from flink_memory.store.backfill import VectorBackfill
from flink_memory.store.core import as_node

if TYPE_CHECKING:
    from flink_memory.flink.pipeline import MemoryStreams

# Part of the savepoint contract like flink_memory.flink.pipeline.UIDS (which lists it as sink_store).
STORE_SINK_UID = "flink-memory-sink-store"
CLOSE_WAIT_S = 120.0  # how long closing waits for the last vectors (Flink cancels a task after 180 s)


class UpsertNodes(ProcessFunction):
    """Opens the store in each subtask (creating the schema once) and writes every node and unit row it
    receives."""

    def __init__(self, url: str, embeddings: EmbeddingsConfig | None = None) -> None:
        self.url = url
        self.embeddings = embeddings
        self.store: MemoryStore | None = None
        self.vectors: VectorBackfill | None = None

    def open(self, runtime_context: RuntimeContext) -> None:
        embedder = embedder_for(self.embeddings) if self.embeddings is not None else None
        self.store = open_store(self.url, create=True)
        self.vectors = VectorBackfill(self.url, embedder) if embedder is not None else None

    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> None:
        assert self.store is not None
        rows = unit_rows_of(value)
        if rows is not None:
            rows.apply(self.store)
            agent = rows.agent_id
        else:
            node = as_node(value)
            self.store.upsert([node])
            agent = node.agent_id
        if self.vectors is not None and (rows is None or rows.upsert):
            self.vectors.name([agent])

    def close(self) -> None:
        if self.vectors is not None:
            self.vectors.close(timeout_s=CLOSE_WAIT_S)
            error, self.vectors = self.vectors.error, None
            if error is not None:
                raise error
        if self.store is not None:
            self.store.close()
            self.store = None


def add_store_sink(streams: MemoryStreams, url: str, embeddings: EmbeddingsConfig | None = None) -> DataStream:
    """Write `streams.summaries` (summary-node JSON strings) and `streams.store_rows` (unit rows) into the
    store at `url` (SQLite path or postgresql:// URL), embedded with `embeddings` (None: no vectors).
    Returns the terminal operator's (empty) stream."""
    written = streams.summaries if streams.store_rows is None else streams.summaries.union(streams.store_rows)
    return written.process(UpsertNodes(url, embeddings)).name("sink-store").uid(STORE_SINK_UID)
