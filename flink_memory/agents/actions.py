"""What an agent's actions call to recall and to remember, through the FlinkMemoryVectorStore resource the
agent declares (default name VECTOR_STORE): always for one agent, the one the action names (its event's key)."""

from __future__ import annotations

from typing import Any, cast

from flink_agents.api.resource import ResourceType
from flink_agents.api.runner_context import RunnerContext
from flink_agents.api.vector_stores.vector_store import Document, VectorStoreQuery

from flink_memory.agents.core import check_agent_id, check_limit, check_question, scope
from flink_memory.agents.vector_store import FlinkMemoryVectorStore

VECTOR_STORE = "memory"


def memory_store(ctx: RunnerContext, name: str = VECTOR_STORE) -> FlinkMemoryVectorStore:
    store = ctx.get_resource(name, ResourceType.VECTOR_STORE)
    if not isinstance(store, FlinkMemoryVectorStore):
        raise TypeError(f"vector store {name!r} is a {type(store).__name__}, not a FlinkMemoryVectorStore")
    return cast(FlinkMemoryVectorStore, store)


def recall(ctx: RunnerContext, agent_id: str, question: str, k: int = 5, *,
           vector_store: str = VECTOR_STORE) -> list[Document]:
    """The agent's k memories (units and summaries) that best answer the question, best first."""
    query = VectorStoreQuery(query_text=check_question(question), limit=check_limit(k),
                             filters={"agent_id": check_agent_id(agent_id, "recall")})
    return memory_store(ctx, vector_store).query(query).documents


def remember(ctx: RunnerContext, agent_id: str, text: str | None = None, *, vector_store: str = VECTOR_STORE,
             **fields: Any) -> str:
    """Remember `text` (or `messages=`) for the agent: an input record of the running memory job (its id:
    `id=`, else one from the content, so a replayed action writes no second memory). Returns the id."""
    store = memory_store(ctx, vector_store)
    agent = scope(store.agent_id, given=check_agent_id(agent_id, "remember"))
    return store.memory.remember(agent, text, **fields).id
