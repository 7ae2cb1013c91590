"""The store follows the committed memory log: the applier writes it from committed files only.

The job writes each agent's store changes (nodes and unit rows, numbered per agent and writer:
stages.unit_rows.LogEntry) to `<output>/memory/` with Flink's exactly-once file sink, which makes a part file
visible only when the checkpoint holding it completes (in-progress files are hidden: their names start with a
dot). The applier reads each new committed file and applies, in one store transaction per file, the entries that
continue each agent's stored positions (one per log), with the new positions and the file's name
(`MemoryStore.apply_log`). What a failed attempt wrote was never committed, so it never reaches the store; a
restarted or second applier compares positions and can neither skip nor repeat an entry. Entries that wait for an
earlier one (in a file not seen yet, e.g. after a rescale) are kept until it comes.

Run it beside the job: `flink-memory run` does; on a cluster, `flink-memory apply --output DIR --follow`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from flink_memory.stages.unit_rows import LogEntry
from flink_memory.store.lag import Lag
from flink_memory.store.log_location import LOG_DIR as LOG_DIR  # (its home; imported from here too)
from flink_memory.store.log_location import LogFile, LogLocation
from flink_memory.store.rules import PositionConflict
from flink_memory.store.sql import MemoryStore

log = logging.getLogger(__name__)

# agents applied in one transaction (PostgreSQL holds a lock per agent until the commit; its lock table is
# bounded): a file of more agents takes several, and is recorded as applied with the last
AGENTS_PER_TRANSACTION = 500
LAG_EVERY_S = 5.0  # how often the applier records its lag in the store (store.applier_lag())
EXPIRE_EVERY_S = 600.0  # how often retired files past their retention are looked for


class LogApplier:
    """Applies a job's memory log to a store; `poll` once, or `follow` until stopped.

    `log`: the log's LogLocation, or the path or URL of its folder (`<output>/memory`). Applied files leave
    the folder `keep_applied_s` after their commit (None: never) and are deleted `retention_s` later (None:
    kept), so a poll lists only the recent log (store.log_keep_applied_s, store.log_retention_s)."""

    def __init__(self, store: MemoryStore, log_dir: LogLocation | str | Path, *,
                 keep_applied_s: float | None = None, retention_s: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.location = LogLocation.of(log_dir)
        self.log_dir = self.location.uri
        self.keep_applied_s = keep_applied_s
        self.retention_s = retention_s
        self.clock = clock
        self.applied = store.applied_files()
        # per log (agent, writer): entries read and not applied yet, by seq
        self.waiting: dict[tuple[str, str], dict[int, LogEntry]] = defaultdict(dict)
        self.unfinished: dict[str, dict[tuple[str, str], int]] = {}  # files read, not applied to the end: last seqs
        self.positions: dict[tuple[str, str], int] = {}
        self.entries = 0  # entries applied by this applier
        self.retired = 0  # files this applier moved out of the log's folder
        self.lag = Lag(log=self.log_dir)
        self._lag_recorded = 0.0
        self._expired = 0.0
        self._listed: list[LogFile] = []

    def committed_files(self) -> list[LogFile]:
        """Committed part files not applied yet, oldest first."""
        return [f for f in self._listing() if f.name not in self.applied and f.name not in self.unfinished]

    def _listing(self) -> list[LogFile]:
        self._listed = self.location.committed()
        return self._listed

    def poll(self) -> int:
        """Apply every committed file not applied yet, retire old applied ones; returns how many entries were
        applied."""
        before = self.entries
        for file in self.committed_files():
            self._read(file.name)
            self._apply()
        if self.unfinished and any(self.waiting.values()):
            self._apply()  # (entries that waited for one of the files read since)
        now = self.clock()
        self._measure(now)
        self._retire(now)
        return self.entries - before

    def follow(self, stop: threading.Event, every_s: float = 0.25) -> None:
        """Poll until `stop` is set, then once more (files committed at the end of the job). A poll that fails
        (the store unreachable, a file unreadable) is logged and tried again with a backoff: nothing is lost,
        the positions say where to go on; the last poll's failure is raised."""
        failures = 0
        while not stop.wait(every_s if not failures else min(30.0, every_s * 2 ** failures)):
            try:
                self.poll()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the applier goes on; the store lags meanwhile
                failures += 1
                log.warning("applying %s failed (%d times in a row; the store lags until it works): %s",
                            self.log_dir, failures, exc)
        self.poll()
        self.store.record_applier_lag(self.lag)

    def _measure(self, now: float) -> None:
        """The lag after this poll: commits written (files committed to the log, applied or not), applied,
        and the age of the oldest unapplied one; recorded in the store at most every LAG_EVERY_S."""
        unapplied = [f for f in self._listed if f.name not in self.applied]
        oldest = min((f.mtime_ns for f in unapplied), default=None)
        applied = len(self.applied) + self.retired
        self.lag = Lag(log=self.log_dir, written=applied + len(unapplied), applied=applied,
                       oldest_unapplied_at=oldest / 1e9 if oldest is not None else None, polled_at=now)
        if now - self._lag_recorded >= LAG_EVERY_S:
            self.store.record_applier_lag(self.lag)
            self._lag_recorded = now

    def _retire(self, now: float) -> None:
        if self.keep_applied_s is not None:
            cutoff = (now - self.keep_applied_s) * 1e9
            old = [f.name for f in self._listed if f.name in self.applied and f.mtime_ns <= cutoff]
            if old:
                self.location.retire(old)
                self.applied.difference_update(old)
                self.retired += len(old)
        if self.retention_s is not None and now - self._expired >= EXPIRE_EVERY_S:
            self._expired = now
            gone = self.location.expire(int((now - self.retention_s) * 1e9))
            if gone:
                log.info("deleted %d applied log files older than %.0f s from %s", gone, self.retention_s,
                         self.location.retired_path)

    def _read(self, name: str) -> None:
        try:
            text = self.location.read_text(name)
        except OSError:
            if not self.location.exists(name):  # another applier applied and retired it since the listing
                return
            raise
        last: dict[tuple[str, str], int] = {}
        for line in text.splitlines():
            if line.strip():
                entry = LogEntry.model_validate_json(line)
                log_key = (entry.agent_id, entry.by)
                self.waiting[log_key][entry.seq] = entry
                last[log_key] = max(last.get(log_key, 0), entry.seq)
        self.unfinished[name] = last

    def _position(self, log_key: tuple[str, str]) -> int:
        if log_key not in self.positions:
            merger, batcher = self.store.log_position(log_key[0])
            self.positions[(log_key[0], "merger")], self.positions[(log_key[0], "batcher")] = merger, batcher
        return self.positions[log_key]

    def _apply(self) -> None:
        while True:  # (again after a conflict: another applier moved some positions)
            runs: dict[tuple[str, str], list[LogEntry]] = {}
            moved: dict[tuple[str, str], int] = {}
            for log_key, entries in self.waiting.items():
                at = self._position(log_key)
                for seq in [seq for seq in entries if seq <= at]:  # applied before (another applier)
                    del entries[seq]
                run = []
                while (at + 1) in entries:
                    at += 1
                    run.append(entries[at])
                if run:
                    runs[log_key], moved[log_key] = run, at
            finished = [name for name, last in self.unfinished.items()
                        if all(seq <= moved.get(log_key, self._position(log_key)) for log_key, seq in last.items())]
            if not runs and not finished:
                return
            agents = sorted({agent for agent, _ in runs})
            try:
                for start in range(0, max(len(agents), 1), AGENTS_PER_TRANSACTION):
                    chunk = set(agents[start:start + AGENTS_PER_TRANSACTION])
                    last = start + AGENTS_PER_TRANSACTION >= len(agents)
                    mine = {log_key: run for log_key, run in runs.items() if log_key[0] in chunk}
                    self.store.apply_log(mine, finished if last else ())
                    for log_key, run in mine.items():
                        self.positions[log_key] = moved[log_key]
                        for entry in run:
                            del self.waiting[log_key][entry.seq]
                        self.entries += len(run)
                    if self.store.embedder is not None and not self.store.embeds_in_writes and chunk:
                        self.store.embed_pending(sorted(chunk))
            except PositionConflict:
                self.positions.clear()
                continue
            for name in finished:
                del self.unfinished[name]
                self.applied.add(name)
            self.waiting = defaultdict(dict, {a: e for a, e in self.waiting.items() if e})
            return


def apply_committed(store: MemoryStore, output_dir: str | Path) -> int:
    """Apply what the job at `output_dir` (a path or URL) committed and the store lacks; returns how many
    entries."""
    return LogApplier(store, LogLocation(str(output_dir))).poll()
