"""The vectors part of a store: which model wrote the rows' vectors, and when a row gets its vector.

With an inline model (the static one) a write carries its rows' vectors in the same transaction; a slower
model's follow in a transaction of their own (a row not yet embedded is found by keyword). Either way a row
reuses the vector of a live row with the same text digest and model (a replay embeds nothing again). A store
holds the vectors of one model, recorded with the first vector written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from flink_memory.store.connection import Statements, StoreConnection
from flink_memory.store.rules import StoreError
from flink_memory.store.schema import META, MODEL, MODEL_KEYS, NODES, SET_META, SET_VECTOR, UNEMBEDDED, text_digest

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder


class VectorColumn(Protocol):
    """How a store's vector column holds a vector, and what indexes it."""

    def value(self, vector: Any) -> Any:
        """A vector as SET_VECTOR writes it."""
        ...

    def recorded(self, dim: int) -> None:
        """The store's model is recorded (its vectors have `dim` dimensions): build what indexes them."""
        ...

    def forgotten(self) -> None:
        """Every vector is about to go (another model comes): drop what indexes them."""
        ...


class BytesColumn:
    """Vectors as little-endian float32 bytes, with no index to keep (SQLite's; PostgreSQL's without pgvector).
    PostgreSQL's pgvector column: flink_memory.store.postgres.PgvectorColumn."""

    def value(self, vector: Any) -> Any:
        from flink_memory.embeddings import to_bytes
        return to_bytes(vector)

    def recorded(self, dim: int) -> None:
        pass

    def forgotten(self) -> None:
        pass


class VectorRows:
    """The store's vectors and the record of their model, on a connection, written as `column` holds them."""

    def __init__(self, connection: StoreConnection, column: VectorColumn | None = None) -> None:
        self.connection = connection
        self.column = column or BytesColumn()
        self.embedder: Embedder | None = None  # what writes embed rows with and recall embeds questions with
        self._model_recorded = False  # this writer checked (and recorded) its embedder's model

    def embedding_model(self) -> str | None:
        """The model of the store's vectors (None: no vectors yet)."""
        return self.connection.meta("embedding_model")

    def vector_counts(self) -> tuple[int, int]:
        """(rows, rows with a vector) over the whole store: how far the vectors are behind the rows."""
        rows, embedded = self.connection.fetch(f"SELECT COUNT(*), COUNT(vector) FROM {NODES}", ())[0]
        return int(rows), int(embedded)

    def model(self) -> dict[str, str]:
        """The store's record of its vectors' model: embedding_model and embedding_dim (none: no vectors yet)."""
        return dict(self.connection.query(MODEL, ()))

    def check_model(self, embedder: Embedder, *, record: bool, model: dict[str, str] | None = None) -> bool:
        """True when the store's vectors are of `embedder`'s model (recording it when `record` and none is
        recorded yet); False when the store holds no vectors yet. Another model: StoreError. `model`: the
        store's record (`model()`), when read already."""
        sql = self.connection.sql
        model = self.model() if model is None else model
        if "embedding_model" not in model and record:
            self.connection.write([], [(sql(SET_META), ("embedding_model", embedder.name)),
                                       (sql(SET_META), ("embedding_dim", str(embedder.dim)))])
            model = self.model()
        name, dim = model.get("embedding_model"), model.get("embedding_dim")
        if name is None:
            return False
        if name != embedder.name or dim != str(embedder.dim):
            raise StoreError(f"the vectors of {self.connection.location} are of the embedding model {name} ({dim} "
                             f"dimensions), not {embedder.name} ({embedder.dim}): set embeddings.provider and "
                             "embeddings.model to the store's, or recall with --mode keyword")
        if record:
            self.column.recorded(embedder.dim)
        return True

    def forget_vectors(self) -> int:
        """Drop every vector and the record of their model, in one transaction, so that `embed_pending` gives
        each row a vector of another model (the first vector written records it). Returns the rows cleared.
        Stop the job's writers first, or restart them with the new model: a writer of the old model would
        record it again."""
        self.column.forgotten()
        count = self.vector_counts()[1]
        self.connection.write([], [(f"UPDATE {NODES} SET vector = NULL WHERE vector IS NOT NULL", ()),
                                   (f"DELETE FROM {META} WHERE {MODEL_KEYS}", ())])
        self._model_recorded = False
        return count

    @property
    def embeds_in_writes(self) -> bool:
        """Whether writes carry their rows' vectors (an embedder fast enough to run inside the write, such as
        the static model); else `embed_pending` gives them after the commit, or a background thread does."""
        return self.embedder is not None and self.embedder.inline

    def statements(self, rows: list[tuple[str, str, str]]) -> Statements:
        """SET_VECTOR statements for (agent, row key, text) just upserted in the same transaction, when writes
        carry their vectors (`embeds_in_writes`); none otherwise."""
        rows = [row for row in rows if row[2]]
        if not rows or not self.embeds_in_writes:
            return []
        assert self.embedder is not None
        if not self._model_recorded:
            self._model_recorded = self.check_model(self.embedder, record=True)
        vectors = self.embedder.passages([text for _, _, text in rows])
        return [(self.connection.sql(SET_VECTOR), (self.column.value(v), agent, key, text_digest(text)))
                for (agent, key, text), v in zip(rows, vectors)]

    def embed_pending(self, agents: Iterable[str]) -> int:
        """Embed the agents' rows that have no vector yet (reusing the vector of a live row with the same
        text); returns how many rows got one. Without an embedder: 0."""
        if self.embedder is None:
            return 0
        sql, done = self.connection.sql, 0
        for agent in agents:
            rows = self.connection.query(UNEMBEDDED, (agent,))
            if not rows:
                continue
            vectors = self.embedder.passages([text for _, text, _ in rows])
            self.check_model(self.embedder, record=True)
            self.connection.commit([agent], [(sql(SET_VECTOR), (self.column.value(v), agent, key, digest))
                                             for (key, _, digest), v in zip(rows, vectors)])
            done += len(rows)
        return done
