"""The live-memory store: summary nodes and memory units in SQLite (one file, WAL) or PostgreSQL (psycopg 3),
one schema (flink_memory.store.schema), composed of parts that each hold their own statements.

A dialect (flink_memory.store.sqlite, flink_memory.store.postgres) supplies the connection (its transaction,
schema and placeholder), the vector column and the search; `MemoryStore` builds the rest on them: the vectors
(store/vector_rows.py), the writer of nodes and units (store/writes.py), the log part that applies the committed
memory log and shows provisional rows (store/log_writes.py), the reader (store/reads.py) and recall
(store/recall.py). Each part takes what it needs in its constructor; none calls back into another's caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flink_memory.store.log_writes import LogWriter
from flink_memory.store.reads import StoreReader
from flink_memory.store.recall import Recaller
from flink_memory.store.writes import StoreWriter

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder
    from flink_memory.store.connection import StoreConnection
    from flink_memory.store.recall import Search
    from flink_memory.store.vector_rows import VectorRows


class MemoryStore:
    """The store's parts behind one face: `open_store` builds it. Use as a context manager.

    With an `embedder`, writes embed their rows (in the write itself when the embedder is `inline`, else after
    committing them) and recall can rank by meaning. Each public method is its part's."""

    def __init__(self, connection: StoreConnection, vectors: VectorRows, search: Search) -> None:
        self.connection, self.vectors, self.search, self.location = connection, vectors, search, connection.location
        self.writer = StoreWriter(connection, vectors)
        self.log = LogWriter(connection, vectors, self.writer)
        self.reader = StoreReader(connection)
        self.recaller = Recaller(connection, vectors, search)
        writer, log, reader = self.writer, self.log, self.reader
        self.upsert, self.upsert_units, self.delete_units, self.forget_units = (
            writer.upsert, writer.upsert_units, writer.delete_units, writer.forget_units)
        self.write_provisional, self.restart_attempt, self.apply_log = (
            log.write_provisional, log.restart_attempt, log.apply_log)
        self.log_position, self.log_positions, self.history, self.claim_history, self.applied_files = (
            log.log_position, log.log_positions, log.history, log.claim_history, log.applied_files)
        self.record_applier_lag, self.applier_lag = log.record_applier_lag, log.applier_lag
        self.current, self.node, self.children, self.nodes, self.units, self.units_by_id = (
            reader.current, reader.node, reader.children, reader.nodes, reader.units, reader.units_by_id)
        self.timeline, self.replaced_count, self.parents, self.agents, self.has_agent = (
            reader.timeline, reader.replaced_count, reader.parents, reader.agents, reader.has_agent)
        self.agent_vectors, self.recall = reader.agent_vectors, self.recaller.recall
        self.embedding_model, self.vector_counts, self.forget_vectors, self.embed_pending = (
            vectors.embedding_model, vectors.vector_counts, vectors.forget_vectors, vectors.embed_pending)

    @property
    def embedder(self) -> Embedder | None:
        return self.vectors.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder | None) -> None:
        self.vectors.embedder = embedder

    @property
    def embeds_in_writes(self) -> bool:
        return self.vectors.embeds_in_writes

    def close(self) -> None:
        try:
            self.search.close()
        finally:
            self.connection.close()

    def __repr__(self) -> str:
        return f"MemoryStore({self.location!r})"

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()
