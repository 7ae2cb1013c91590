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

from __future__ import annotations

from typing import TYPE_CHECKING

from flink_memory.databases import is_postgres
from flink_memory.store.rules import Recalled, StoreError, StoreNotFound, live_view, query_terms
from flink_memory.store.sql import MemoryStore

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder

__all__ = ["MemoryStore", "Recalled", "StoreError", "StoreNotFound", "live_view", "open_store", "query_terms"]


def open_store(location: str, *, create: bool = False, embedder: Embedder | None = None) -> MemoryStore:
    """The store at `location`: a postgresql:// (or postgres://) URL, else a SQLite file path.

    Readers open an existing store (StoreNotFound otherwise); the job's sink passes `create=True`, which
    creates the file or the tables when missing. With an `embedder` (flink_memory.embeddings), writes embed
    their rows and recall ranks by meaning too."""
    store: MemoryStore
    if is_postgres(location):
        from flink_memory.store.postgres import postgres_store

        store = postgres_store(location, create=create)
    else:
        from flink_memory.store.sqlite import sqlite_store

        store = sqlite_store(location, create=create)
    store.embedder = embedder
    return store
