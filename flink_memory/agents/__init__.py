"""Flink Agents (flink-agents 0.3) agents that remember through flink-memory (docs/flink-agents.md).

- core.py: the decisions, plain Python: one agent per call, memory records, recall hits as documents;
- memory.py: AgentMemory, recall from the job's store and remember as input records of the running job;
- vector_store.py: FlinkMemoryVectorStore, a Flink Agents vector store over the store's hybrid recall;
- actions.py: recall() and remember() for an agent's actions, through that vector store resource;
- mcp.py: the service's /mcp as an `@mcp_server` resource, its key read at connect time (never in the plan);
- example.py: a deterministic agent (no LLM) that decides what to remember, for the sample and the job.

Only core and memory import without flink-agents installed (`pip install 'flink-memory[agents]'`).
"""

from flink_memory.agents.core import AgentScopeError, RecordRefused, memory_record, scope
from flink_memory.agents.memory import AgentMemory, MemoryUnavailable

__all__ = ["AgentMemory", "AgentScopeError", "MemoryUnavailable", "RecordRefused", "memory_record", "scope"]
