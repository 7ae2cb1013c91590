"""flink-memory as a Flink Agents vector store (`BaseVectorStore` of flink-agents 0.3): recall is the store's
hybrid recall (keyword and meaning) of one agent; documents added are input records for the running memory
job, which summarizes them. Declare it in an agent:

    @vector_store
    @staticmethod
    def memory() -> ResourceDescriptor:
        return ResourceDescriptor(clazz=FlinkMemoryVectorStore.CLASS_PATH, store="out/memory.sqlite",
                                  input="inbox/")

A query names its agent with `filters={"agent_id": ...}` (the event's key), or the store is bound to one agent
with `agent_id=`; a query that names none is refused, so the built-in context retrieval
(ContextRetrievalRequestEvent, which passes no filter) works on a store bound to one agent only.
"""

from __future__ import annotations

from typing import Any, ClassVar

from flink_agents.api.vector_stores.vector_store import (
    BaseVectorStore,
    Document,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from pydantic import Field, PrivateAttr

from flink_memory.agents.core import hit_document, scope
from flink_memory.agents.memory import AgentMemory, load_embedder
from flink_memory.service.models import Mode


class FlinkMemoryVectorStore(BaseVectorStore):
    """An agent's long-term memory kept by flink-memory; the store embeds questions itself (no
    `embedding_model` resource: it has the job's own model)."""

    CLASS_PATH: ClassVar[str] = "flink_memory.agents.vector_store.FlinkMemoryVectorStore"

    store: str = Field(description="the memory job's store: a SQLite path or postgresql:// URL")
    input: str | None = Field(default=None, description="the job's input for writes: a followed directory or "
                                                        "kafka://HOST:PORT/TOPIC; None: read-only")
    agent_id: str | None = Field(default=None, description="bind every call to this agent")
    mode: Mode = Field(default="hybrid", description="recall by keyword, by meaning (vector) or both")
    config: str | None = Field(default=None, description="flink-memory config file, for embeddings.*")
    settings: list[str] = Field(default_factory=list, description="config overrides (key=value)")

    _memory: AgentMemory | None = PrivateAttr(default=None)

    @property
    def memory(self) -> AgentMemory:
        """Opened on first use (on the TaskManager, not where the plan is built)."""
        if self._memory is None:
            embedder = load_embedder(self.config, self.settings) if self.mode != "keyword" else None
            self._memory = AgentMemory(self.store, self.input, embedder=embedder, mode=self.mode)
        return self._memory

    @property
    def store_kwargs(self) -> dict[str, Any]:
        return {}

    def query(self, query: VectorStoreQuery) -> VectorStoreQueryResult:
        """The agent's units and summary nodes that best answer `query.query_text`, best first."""
        agent = scope(self.agent_id, filters=query.filters, given=query.extra_args.get("agent_id"),
                      collection=query.collection_name)
        hits = self.memory.recall(agent, query.query_text, query.limit)
        return VectorStoreQueryResult(documents=[Document(**hit_document(agent, hit).model_dump()) for hit in hits])

    def add(self, documents: Document | list[Document], collection_name: str | None = None,
            **kwargs: Any) -> list[str]:
        """Each document becomes a memory item of the agent (its id kept, else a new one): an input record
        the job summarizes; recall finds it once the job's batcher accepts it."""
        agent = scope(self.agent_id, given=kwargs.get("agent_id"), collection=collection_name, write=True)
        docs = documents if isinstance(documents, list) else [documents]
        return [self.memory.remember(agent, doc.content, id=doc.id, metadata=doc.metadata or None).id
                for doc in docs]

    def update(self, documents: Document | list[Document], collection_name: str | None = None,
               **kwargs: Any) -> None:
        """The same id with other text is an update of that memory (its batch is re-summarized)."""
        docs = documents if isinstance(documents, list) else [documents]
        if not docs or any(doc.id is None for doc in docs):
            raise ValueError("update needs documents, each with its id")
        self.add(docs, collection_name, **kwargs)

    def get(self, ids: str | list[str] | None = None, collection_name: str | None = None,
            filters: dict[str, Any] | None = None, limit: int | None = 100, **kwargs: Any) -> list[Document]:
        """The agent's memory units (by id, or the first `limit`)."""
        agent = scope(self.agent_id, filters=filters, given=kwargs.get("agent_id"), collection=collection_name)
        wanted = [ids] if isinstance(ids, str) else ids
        units = self.memory.units(agent, wanted)
        if wanted is None and limit is not None:
            units = units[:limit]
        return [Document(id=uid, content=text, metadata={"agent_id": agent, "kind": "unit"}) for uid, text in units]

    def delete(self, ids: str | list[str] | None = None, collection_name: str | None = None,
               filters: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Retract records of the agent by id (deleting everything is `forget`, not a filter)."""
        agent = scope(self.agent_id, filters=filters, given=kwargs.get("agent_id"), collection=collection_name,
                      write=True)
        wanted = [ids] if isinstance(ids, str) else ids
        if not wanted:
            raise ValueError("delete needs ids: flink-memory retracts records by id")
        for record_id in wanted:
            self.memory.delete(agent, record_id)

    def _query_embedding(self, embedding: list[float], limit: int = 10, collection_name: str | None = None,
                         filters: dict[str, Any] | None = None, **kwargs: Any) -> list[Document]:
        raise NotImplementedError("flink-memory recalls by the question's text (query()), not by a given vector")

    def _add_embedding(self, *, documents: list[Document], collection_name: str | None = None,
                       **kwargs: Any) -> list[str]:
        return self.add(documents, collection_name, **kwargs)

    def _update_embedding(self, *, documents: list[Document], collection_name: str | None = None,
                          **kwargs: Any) -> None:
        self.update(documents, collection_name, **kwargs)

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None
