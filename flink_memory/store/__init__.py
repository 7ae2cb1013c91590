"""The live memory an agent reads: `open_store(url)` on the SQLite file or PostgreSQL database the job writes.

    from flink_memory.store import open_store

    with open_store("out/memory.sqlite") as store:
        memory = store.current("agent-0")                 # SummaryNode | None: the current global summary
        hits = store.recall("agent-0", "What did Alice pay for the boat?", k=5)   # list[Recalled]

Reads return pydantic models: `flink_memory.records.SummaryNode` for nodes, `Recalled` for recall hits.
"""

from flink_memory.store.core import Recalled, live_view, query_terms
from flink_memory.store.sql import (
           MemoryStore,
           PostgresStore,
           SqliteStore,
           StoreError,
           StoreNotFound,
           open_store,
)

__all__ = ["MemoryStore", "PostgresStore", "Recalled", "SqliteStore", "StoreError", "StoreNotFound", "live_view",
           "open_store", "query_terms"]
