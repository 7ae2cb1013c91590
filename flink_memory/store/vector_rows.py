"""The rows' vectors: which model wrote them, and when a row gets its vector.

With an inline model (the static one) a write carries its rows' vectors in the same transaction; a slower
model's follow in a transaction of their own (a row not yet embedded is found by keyword). Either way a row
reuses the vector of a live row with the same text digest and model (a replay embeds nothing again). A store
holds the vectors of one model, recorded with the first vector written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flink_memory.store.connection import StoreConnection
from flink_memory.store.rules import StoreError
from flink_memory.store.schema import META, MODEL, MODEL_KEYS, NODES, SET_META, SET_VECTOR, UNEMBEDDED, text_digest

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder


class VectorRows(StoreConnection):
    """The store's vectors (a part of MemoryStore)."""

    embedder: Embedder | None = None
    _model_recorded = False  # this writer checked (and recorded) its embedder's model

    def embedding_model(self) -> str | None:
        """The model of the store's vectors (None: no vectors yet)."""
        return self._meta("embedding_model")

    def vector_counts(self) -> tuple[int, int]:
        """(rows, rows with a vector) over the whole store: how far the vectors are behind the rows."""
        rows, embedded = self._fetch(f"SELECT COUNT(*), COUNT(vector) FROM {NODES}", ())[0]
        return int(rows), int(embedded)

    def _model(self) -> dict[str, str]:
        """The store's record of its vectors' model: embedding_model and embedding_dim (none: no vectors yet)."""
        return dict(self._fetch(self._sql(MODEL), ()))

    def _check_model(self, embedder: Embedder, *, record: bool, model: dict[str, str] | None = None) -> bool:
        """True when the store's vectors are of `embedder`'s model (recording it when `record` and none is
        recorded yet); False when the store holds no vectors yet. Another model: StoreError. `model`: the
        store's record (`_model`), when read already."""
        model = self._model() if model is None else model
        if "embedding_model" not in model and record:
            self._write([], [(self._sql(SET_META), ("embedding_model", embedder.name)),
                             (self._sql(SET_META), ("embedding_dim", str(embedder.dim)))])
            model = self._model()
        name, dim = model.get("embedding_model"), model.get("embedding_dim")
        if name is None:
            return False
        if name != embedder.name or dim != str(embedder.dim):
            raise StoreError(f"the vectors of {self.location} are of the embedding model {name} ({dim} dimensions), "
                             f"not {embedder.name} ({embedder.dim}): set embeddings.provider and embeddings.model "
                             "to the store's, or recall with --mode keyword")
        return True

    def forget_vectors(self) -> int:
        """Drop every vector and the record of their model, in one transaction, so that `embed_pending` gives
        each row a vector of another model (the first vector written records it). Returns the rows cleared.
        Stop the job's writers first, or restart them with the new model: a writer of the old model would
        record it again."""
        count = self.vector_counts()[1]
        self._write([], [(f"UPDATE {NODES} SET vector = NULL WHERE vector IS NOT NULL", ()),
                         (f"DELETE FROM {META} WHERE {MODEL_KEYS}", ())])
        self._model_recorded = False
        return count

    @property
    def embeds_in_writes(self) -> bool:
        """Whether writes carry their rows' vectors (an embedder fast enough to run inside the write, such as
        the static model); else `embed_pending` gives them after the commit, or a background thread does."""
        return self.embedder is not None and self.embedder.inline

    def _vector_statements(self, rows: list[tuple[str, str, str]]) -> list[tuple[str, tuple[Any, ...]]]:
        """SET_VECTOR statements for (agent, row key, text) just upserted in the same transaction, when writes
        carry their vectors (`embeds_in_writes`); none otherwise."""
        rows = [row for row in rows if row[2]]
        if not rows or not self.embeds_in_writes:
            return []
        assert self.embedder is not None
        if not self._model_recorded:
            self._model_recorded = self._check_model(self.embedder, record=True)
        vectors = self.embedder.passages([text for _, _, text in rows])
        return [(self._sql(SET_VECTOR), (self._vector_value(v), agent, key, text_digest(text)))
                for (agent, key, text), v in zip(rows, vectors)]

    def embed_pending(self, agents: Iterable[str]) -> int:
        """Embed the agents' rows that have no vector yet (reusing the vector of a live row with the same
        text); returns how many rows got one. Without an embedder: 0."""
        if self.embedder is None:
            return 0
        done = 0
        for agent in agents:
            rows = self._fetch(self._sql(UNEMBEDDED), (agent,))
            if not rows:
                continue
            vectors = self.embedder.passages([text for _, text, _ in rows])
            self._check_model(self.embedder, record=True)
            self._commit([agent], [(self._sql(SET_VECTOR), (self._vector_value(v), agent, key, digest))
                                  for (key, _, digest), v in zip(rows, vectors)])
            done += len(rows)
        return done

    def _vector_value(self, vector: Any) -> Any:
        """A vector as SET_VECTOR writes it: little-endian float32 bytes (PostgreSQL's pgvector column: text)."""
        from flink_memory.embeddings import to_bytes
        return to_bytes(vector)
