"""The store's provisional writer: unit rows shown the moment the batcher logs them, before their commit.

The store follows the committed memory log (`<output>/memory/`, flink_memory.store.applier); this sink only writes
what agents expect to find at once: an accepted unit as a provisional row, a deletion or a forget as rows hidden
at once (`MemoryStore.write_provisional`, within 50 ms: flink_memory.store.provisional). Each is confirmed or
removed by the commit that reaches its `seq`, and a write behind the committed position changes nothing
(docs/output.md, "What a reader sees, and when"). With `embeddings` (a provider other than none) each write
carries its rows' vectors when the model is fast enough (the default static one); a slower model's are computed
on a thread of their own (flink_memory.store.backfill), and closing waits (up to CLOSE_WAIT_S) for the last
ones. Reuse it in other jobs beside `add_file_sinks` (which writes the log): `add_store_sink(streams,
"postgresql://...", config.embeddings)`, and run `flink-memory apply` on the output directory.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from pyflink.datastream import DataStream, ProcessFunction, RuntimeContext

from flink_memory.config import EmbeddingsConfig
from flink_memory.embeddings import embedder_for
from flink_memory.flink.metrics import Tally
from flink_memory.memory_log import LogEntry
from flink_memory.stages.channels import MEMORY_LOG
from flink_memory.store import MemoryStore, open_store
from flink_memory.store.backfill import VectorBackfill
from flink_memory.store.lag import CommitWatch, overdue_message
from flink_memory.store.provisional import WriteBehind

if TYPE_CHECKING:
    from flink_memory.flink.streams import MemoryStreams

# Part of the savepoint contract like flink_memory.flink.pipeline.UIDS (which lists it as sink_store).
STORE_SINK_UID = "flink-memory-sink-store"
CLOSE_WAIT_S = 120.0  # how long closing waits for the last vectors (Flink cancels a task after 180 s)
WATCH_EVERY_S = 15.0  # how often the commit watch reads the store's positions
WARN_EVERY_S = 600.0  # how often it repeats its warning while no applier takes the commits

log = logging.getLogger(__name__)


class Watcher:
    """Whether an applier takes the job's commits: the log entries this subtask wrote against the store's
    positions (flink_memory.store.lag.CommitWatch), looked at every WATCH_EVERY_S on a thread with its own
    store connection; says so in the TaskManager's log when one has waited `warn_after_s`."""

    def __init__(self, url: str, warn_after_s: float) -> None:
        self.url = url
        self.watch = CommitWatch(warn_after_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = 0.0
        self.overdue_s = 0.0  # the last look's answer: how long the oldest unapplied entry has waited (0: none)
        self._thread = threading.Thread(target=self._run, name="flink-memory-commit-watch", daemon=True)
        self._thread.start()

    def wrote(self, entry: LogEntry) -> None:
        with self._lock:
            self.watch.wrote(entry.agent_id, entry.by, entry.seq, time.time())

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        store = None
        try:
            while not self._stop.wait(WATCH_EVERY_S):
                try:
                    store = store or open_store(self.url)

                    def position(agent_id: str, by: str, store: MemoryStore = store) -> int:
                        merger, batcher = store.log_position(agent_id)
                        return merger if by == "merger" else batcher

                    with self._lock:
                        age = self.watch.overdue(position, time.time())
                except Exception as exc:  # noqa: BLE001 - a watch, not the job: it tries again
                    log.debug("the commit watch could not read %s: %s", self.url, exc)
                    continue
                self.overdue_s = age or 0.0
                if age is not None and time.monotonic() - self._warned >= WARN_EVERY_S:
                    self._warned = time.monotonic()
                    log.warning("flink-memory: %s", overdue_message(age))
        finally:
            if store is not None:
                store.close()


class WriteProvisional(ProcessFunction):
    """Opens the store in each subtask (creating the schema once) and shows every unit-rows message it gets;
    with `warn_after_s`, watches that an applier takes the job's commits (Watcher)."""

    def __init__(self, url: str, embeddings: EmbeddingsConfig | None = None,
                 warn_after_s: float | None = None, branch: str = "") -> None:
        self.url = url
        self.embeddings = embeddings
        self.warn_after_s = warn_after_s
        self.branch = branch  # the job's (flink_memory.history): a restarted attempt voids the failed one's rows
        self.store: MemoryStore | None = None
        self.vectors: VectorBackfill | None = None
        self.writer: WriteBehind | None = None
        self.watcher: Watcher | None = None
        self.tally: Tally | None = None
        self.overdue_level = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        embedder = embedder_for(self.embeddings) if self.embeddings is not None else None
        inline = embedder is not None and embedder.inline  # (else vectors follow on a thread of their own)
        self.store = open_store(self.url, create=True, embedder=embedder if inline else None)
        self.vectors = VectorBackfill(self.url, embedder) if embedder is not None and not inline else None
        try:  # (PyFlink 2.3's thread mode lacks it: pemja finds no getAttemptNumber; then commits alone undo)
            attempt: int | None = runtime_context.get_attempt_number()
        except Exception:  # noqa: BLE001 - an attribute error raised through pemja
            attempt = None
        if self.branch and attempt is not None:  # (this store then writes as this attempt)
            self.store.restart_attempt(self.branch, attempt)
        self.writer = WriteBehind(self.store, self.vectors.name if self.vectors is not None else None)
        self.watcher = Watcher(self.url, self.warn_after_s) if self.warn_after_s is not None else None
        self.tally = Tally(runtime_context.get_metrics_group().add_group("flink_memory"))
        self.overdue_level = 0  # what the applier_overdue_s counter says now (a level: moved by differences)

    def process_element(self, value: Any, ctx: ProcessFunction.Context) -> None:
        assert self.writer is not None
        entry = MEMORY_LOG.load(value)
        if entry.units is not None:  # (a node waits for its commit)
            self.writer.submit(entry.units)
        if self.watcher is not None and self.tally is not None:
            self.watcher.wrote(entry)
            level = int(self.watcher.overdue_s)
            if level != self.overdue_level:
                self.tally.add("applier_overdue_s", level - self.overdue_level)
                self.tally.flush()
                self.overdue_level = level

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()
        if self.vectors is not None:
            self.vectors.close(timeout_s=CLOSE_WAIT_S)
            error, self.vectors = self.vectors.error, None
            if error is not None:
                raise error
        if self.store is not None:
            self.store.close()
            self.store = None


def add_store_sink(streams: MemoryStreams, url: str, embeddings: EmbeddingsConfig | None = None,
                   warn_after_s: float | None = None, branch: str = "") -> DataStream | None:
    """Show the unit rows of `streams.memory_log` at once, as provisional rows, in the store at `url` (SQLite
    path or postgresql:// URL), embedded with `embeddings` (None: no vectors); with `warn_after_s`, log when
    no applier has taken a commit for that long; `branch`: the job's (config.job.branch). Returns the terminal
    operator's (empty) stream; None without a memory log."""
    entries = streams.channel(MEMORY_LOG)
    if entries is None:
        return None
    function = WriteProvisional(url, embeddings, warn_after_s, branch)
    return entries.process(function).name("sink-store").uid(STORE_SINK_UID)
