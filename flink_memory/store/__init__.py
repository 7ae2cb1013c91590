"""The live memory an agent reads: `open_store(url)` on the SQLite file or PostgreSQL database the job writes.

    from flink_memory.store import open_store

    with open_store("out/memory.sqlite") as store:
        memory = store.current("agent-0")                 # SummaryNode | None: the current global summary
        hits = store.recall("agent-0", "What did Alice pay for the boat?", k=5)   # list[Recalled]

    # recall by meaning too: open with the embedder the job used (flink_memory.embeddings)
    with open_store("out/memory.sqlite", embedder=embedder_for(config.embeddings)) as store:
        hits = store.recall("agent-0", "What is the name of my dog?", mode="hybrid")  # units and nodes

Reads return pydantic models: `flink_memory.records.SummaryNode` for nodes, `Recalled` for recall hits.
"""

from flink_memory.store.core import Recalled, live_view, query_terms
from flink_memory.store.sql import MemoryStore, StoreError, StoreNotFound, open_store

__all__ = ["MemoryStore", "Recalled", "StoreError", "StoreNotFound", "live_view", "open_store", "query_terms"]
