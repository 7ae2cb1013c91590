"""Vectors for the rows a writer just stored, computed on a thread of their own: summaries never wait for them.

A writer (the job's store sink) stores rows without embedding them and names the agents it wrote; the
backfill embeds those agents' rows that have no vector yet, in batches, on its own store connection. A row
not embedded yet is found by keyword meanwhile. `close` embeds what is still named, then stops, so a
bounded job ends with every row embedded; a failure of the provider is logged and the rows stay without a
vector until the next write names their agent again.
"""

from __future__ import annotations

import logging
import threading
import time

from flink_memory.embeddings.core import Embedder
from flink_memory.store.sql import open_store

log = logging.getLogger(__name__)


class VectorBackfill:
    """Embeds the named agents' unembedded rows on a background thread (one store connection of its own)."""

    def __init__(self, url: str, embedder: Embedder) -> None:
        self.url, self.embedder = url, embedder
        self._named: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self.embedded = 0  # rows that got a vector
        self.busy_s = 0.0  # time spent embedding (rows / busy_s: the throughput of this thread)
        self._thread = threading.Thread(target=self._run, name="flink-memory-vectors", daemon=True)
        self._thread.start()

    def name(self, agents: set[str] | list[str]) -> None:
        """These agents have rows that may lack a vector."""
        with self._lock:
            self._named.update(agents)
        self._wake.set()

    @property
    def lag(self) -> int:
        """Agents named and not embedded yet."""
        with self._lock:
            return len(self._named)

    def close(self, timeout_s: float | None = None) -> None:
        """Embed what is named, then stop."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        with open_store(self.url, embedder=self.embedder) as store:
            while True:
                self._wake.wait()
                self._wake.clear()
                with self._lock:
                    agents, self._named = sorted(self._named), set()
                if agents:
                    started = time.monotonic()
                    try:
                        self.embedded += store.embed_pending(agents)
                    except Exception as exc:  # noqa: BLE001 - a provider that fails costs vectors, never rows
                        log.warning("embedding %d agents' new rows failed (they stay keyword-only for now): %s",
                                    len(agents), exc)
                    self.busy_s += time.monotonic() - started
                elif self._stopping:
                    return
                if self._stopping:
                    self._wake.set()  # one more pass: what was named meanwhile, then stop
