"""Vectors for the rows a writer just stored, computed on a thread of their own: summaries never wait for them.

A writer (the job's store sink) stores rows without embedding them and names the agents it wrote; the
backfill embeds those agents' rows that have no vector yet, in batches, on its own store connection. A row
not embedded yet is found by keyword meanwhile. A provider that fails is retried with a backoff (the agents
stay named); a store whose vectors are of another model, or one the thread cannot open, is an error the
writer sees on its next `name`. `close` embeds what is still named, then stops.
"""

from __future__ import annotations

import logging
import threading

from flink_memory.embeddings.api import Embedder
from flink_memory.store import open_store
from flink_memory.store.rules import StoreError

log = logging.getLogger(__name__)

RETRY_S = (1.0, 5.0, 30.0)  # waits after a failed pass, then the last one again
CLOSE_ATTEMPTS = 3  # passes `close` makes over agents whose embedding fails before it gives up on them


class VectorBackfill:
    """Embeds the named agents' unembedded rows on a background thread (one store connection of its own)."""

    def __init__(self, url: str, embedder: Embedder) -> None:
        self.url, self.embedder = url, embedder
        self._named: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self.error: StoreError | None = None  # fatal: the writer raises it
        self.embedded = 0  # rows that got a vector
        self._thread = threading.Thread(target=self._run, name="flink-memory-vectors", daemon=True)
        self._thread.start()

    def name(self, agents: set[str] | list[str]) -> None:
        """These agents have rows that may lack a vector."""
        if self.error is not None:
            raise self.error
        with self._lock:
            self._named.update(agents)
        self._wake.set()

    @property
    def lag(self) -> int:
        """Agents named and not embedded yet."""
        with self._lock:
            return len(self._named)

    def close(self, timeout_s: float | None = None) -> None:
        """Embed what is named (within `timeout_s`; a replay's writes name the rest again), then stop."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            store = open_store(self.url, embedder=self.embedder)
        except StoreError as exc:
            self.error = exc
            return
        failures = 0
        with store:
            while True:
                self._wake.wait(None if not failures else RETRY_S[min(failures, len(RETRY_S)) - 1])
                self._wake.clear()
                with self._lock:
                    agents, self._named = sorted(self._named), set()
                if not agents:
                    if self._stopping:
                        return
                    continue
                done: list[str] = []
                try:
                    for agent in agents:
                        self.embedded += store.embed_pending([agent])
                        done.append(agent)
                    failures = 0
                except StoreError as exc:  # another model's vectors: writing on would mix them
                    self.error = exc
                    return
                except Exception as exc:  # noqa: BLE001 - a provider that fails costs vectors, never rows
                    failures += 1
                    log.warning("embedding new rows of %d agents failed (%d times in a row; found by keyword "
                                "until it works): %s", len(agents) - len(done), failures, exc)
                    if self._stopping and failures >= CLOSE_ATTEMPTS:
                        return
                    with self._lock:
                        self._named.update(a for a in agents if a not in done)
                if self._stopping:
                    self._wake.set()  # one more pass: what was named meanwhile, then stop
