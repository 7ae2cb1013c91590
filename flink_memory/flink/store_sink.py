"""The store's provisional writer: unit rows shown the moment the batcher logs them, before their commit.

The store follows the committed memory log (`<output>/memory/`, flink_memory.store.applier); this sink only writes
what agents expect to find at once: an accepted unit as a provisional row, a deletion or a forget as rows hidden
at once (`MemoryStore.write_provisional`, within 50 ms: flink_memory.store.provisional). Each is confirmed or
removed by the commit that reaches its `seq`, and a write behind the committed position changes nothing
(docs/output.md, "What a reader sees, and when"). With `embeddings` (a provider other than none) each write
carries its rows' vectors when the model is fast enough (the default static one); a slower model's are computed
on a thread of their own (flink_memory.store.backfill), and closing waits (up to CLOSE_WAIT_S) for the last
ones. Reuse it in other jobs beside `add_file_sinks` (which writes the log): `add_store_sink(streams,
"postgresql://...", config.embeddings)`, and run `flink-memory apply` on the output directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyflink.datastream import DataStream, ProcessFunction, RuntimeContext

from flink_memory.config import EmbeddingsConfig
from flink_memory.embeddings import embedder_for
from flink_memory.stages.unit_rows import LogEntry
from flink_memory.store import MemoryStore, open_store
from flink_memory.store.backfill import VectorBackfill
from flink_memory.store.provisional import WriteBehind

if TYPE_CHECKING:
    from flink_memory.flink.streams import MemoryStreams

# Part of the savepoint contract like flink_memory.flink.pipeline.UIDS (which lists it as sink_store).
STORE_SINK_UID = "flink-memory-sink-store"
CLOSE_WAIT_S = 120.0  # how long closing waits for the last vectors (Flink cancels a task after 180 s)


class WriteProvisional(ProcessFunction):
    """Opens the store in each subtask (creating the schema once) and shows every unit-rows message it gets."""

    def __init__(self, url: str, embeddings: EmbeddingsConfig | None = None, branch: str = "") -> None:
        self.url = url
        self.embeddings = embeddings
        self.branch = branch  # the job's (flink_memory.history): a restarted attempt voids the failed one's rows
        self.store: MemoryStore | None = None
        self.vectors: VectorBackfill | None = None
        self.writer: WriteBehind | None = None

    def open(self, runtime_context: RuntimeContext) -> None:
        embedder = embedder_for(self.embeddings) if self.embeddings is not None else None
        inline = embedder is not None and embedder.inline  # (else vectors follow on a thread of their own)
        self.store = open_store(self.url, create=True, embedder=embedder if inline else None)
        self.vectors = VectorBackfill(self.url, embedder) if embedder is not None and not inline else None
        try:  # (PyFlink 2.3's thread mode lacks it: pemja finds no getAttemptNumber; then commits alone undo)
            attempt: int | None = runtime_context.get_attempt_number()
        except Exception:  # noqa: BLE001 - an attribute error raised through pemja
            attempt = None
        if self.branch and attempt is not None:  # (this store then writes as this attempt)
            self.store.restart_attempt(self.branch, attempt)
        self.writer = WriteBehind(self.store, self.vectors.name if self.vectors is not None else None)

    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> None:
        assert self.writer is not None
        entry = LogEntry.model_validate_json(value)
        if entry.units is not None:  # (a node waits for its commit)
            self.writer.submit(entry.units)

    def close(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()
        if self.vectors is not None:
            self.vectors.close(timeout_s=CLOSE_WAIT_S)
            error, self.vectors = self.vectors.error, None
            if error is not None:
                raise error
        if self.store is not None:
            self.store.close()
            self.store = None


def add_store_sink(streams: MemoryStreams, url: str, embeddings: EmbeddingsConfig | None = None,
                   branch: str = "") -> DataStream | None:
    """Show the unit rows of `streams.memory_log` at once, as provisional rows, in the store at `url` (SQLite
    path or postgresql:// URL), embedded with `embeddings` (None: no vectors); `branch`: the job's
    (config.job.branch). Returns the terminal operator's (empty) stream; None without a memory log."""
    if streams.memory_log is None:
        return None
    return (streams.memory_log.process(WriteProvisional(url, embeddings, branch)).name("sink-store")
            .uid(STORE_SINK_UID))
