"""The store follows the committed memory log: the applier writes it from committed files only.

The job writes each agent's store changes (nodes and unit rows, numbered per agent and writer:
flink_memory.memory_log.LogEntry) to `<output>/memory/` with Flink's exactly-once file sink, which makes a part file
visible only when the checkpoint holding it completes (in-progress files are hidden: their names start with a
dot). The applier reads each new committed file and applies, in one store transaction per file, the entries that
continue each agent's stored positions (one per log), with the new positions and the file's name
(`MemoryStore.apply_log`). What a failed attempt wrote was never committed, so it never reaches the store; a
restarted or second applier compares positions and can neither skip nor repeat an entry. Entries that wait for an
earlier one (in a file not seen yet, e.g. after a rescale) are kept until it comes.

Positions are (branch, seq) of a history (flink_memory.history): after a restore the folder may hold several
branches of an agent's log; the applier follows the newest branch's lineage (the older branch up to where the
newer one left it, then the newer one), and drops the entries of branches it left. A new log of an agent in
another history than the store's is refused (`refused`, logged), never mixed in.

Run it beside the job: `flink-memory run` does; on a cluster, `flink-memory apply --output DIR --follow`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from flink_memory.memory_log import LogEntry
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
LogKey = tuple[str, str]  # (agent, writer)
Place = tuple[str, int]  # (branch, seq)


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
        # per log (agent, writer): entries read and not applied yet, by (branch, seq)
        self.waiting: dict[LogKey, dict[Place, LogEntry]] = defaultdict(dict)
        self.unfinished: dict[str, set[tuple[LogKey, Place]]] = {}  # files read, not applied to the end: entries
        self.positions: dict[LogKey, Place] = {}
        self.histories: dict[str, str] = {}  # per agent: the history its logs belong to in the store
        self.refused: dict[str, str] = {}  # agents whose entries belong to another history than the store's: why
        self.entries = 0  # entries applied by this applier
        self.retired = 0  # files this applier moved out of the log's folder
        self.lag = Lag(log=self.log_dir)
        self._lag_recorded = 0.0
        self._expired = 0.0
        self._listed: list[LogFile] = []
        self.skipped: list[tuple[str, int, str]] = []  # (file, line or 0 for all of it, why): not log entries

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
        """Take a file's entries. A line that is no log entry (a corrupt or foreign file) is reported with the
        file's name and skipped: the other agents go on, and an agent whose entry it was waits at that gap."""
        held: set[tuple[LogKey, Place]] = set()
        try:
            data = self.location.read_bytes(name)
        except OSError:
            if not self.location.exists(name):  # another applier applied and retired it since the listing
                return
            raise
        try:
            lines = data.decode("utf-8").splitlines()
        except UnicodeDecodeError as exc:
            lines = []
            self._skip(name, 0, f"not UTF-8 text ({exc.reason})")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = LogEntry.model_validate_json(line)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                self._skip(name, number, f"{where}: {error['msg']}" if where else error["msg"])
                continue
            log_key, place = (entry.agent_id, entry.by), (entry.branch, entry.seq)
            self.waiting[log_key][place] = entry
            held.add((log_key, place))
        self.unfinished[name] = held

    def _skip(self, name: str, line: int, reason: str) -> None:
        where = f"{name}, line {line}" if line else name
        self.skipped.append((name, line, reason))
        log.error("skipped %s in %s: it is no memory-log entry (%s); the agents it does not concern go on",
                  where, self.log_dir, reason)

    def _position(self, log_key: LogKey) -> Place:
        if log_key not in self.positions:
            stored = self.store.log_positions(log_key[0])
            self.positions[(log_key[0], "merger")] = stored.merger
            self.positions[(log_key[0], "batcher")] = stored.batcher
            self.histories[log_key[0]] = stored.history
        return self.positions[log_key]

    def _next_run(self, log_key: LogKey, entries: dict[Place, LogEntry]) -> list[LogEntry]:
        """The entries of this log to apply next (and the ones no longer wanted dropped): the stored branch's
        next ones; or, when a newer branch's first entry is here, the stored branch's up to where the new
        branch left it (if they are here) and then the new branch (rather than an older branch's later entries:
        an abandoned history, e.g. after a restore of an older savepoint)."""
        branch, at = self._position(log_key)
        for place in [p for p in entries if (p[0] == branch and p[1] <= at) or p[0] < branch]:
            del entries[place]  # applied before (another applier), or of a branch the store left
        forks = {e.branch: e for e in entries.values() if e.base is not None and e.branch > branch}
        if not forks:
            return _consecutive(entries, branch, at)
        path = [forks[max(forks)]]
        while path[-1].base is not None and path[-1].base.branch in forks:
            path.append(forks[path[-1].base.branch])
        first = path[-1]
        assert first.base is not None
        if self._foreign(first, log_key):
            for place in [p for p in entries if p[0] == first.branch]:
                del entries[place]
            return []
        if first.base.branch == branch and first.base.seq > at and (branch, at + 1) in entries:
            return _consecutive(entries, branch, at, until=first.base.seq)  # (the branch up to the fork first)
        until = path[-2].base.seq if len(path) > 1 and path[-2].base is not None else None
        return [first, *_consecutive(entries, first.branch, first.seq, until=until)]

    def _foreign(self, first: LogEntry, log_key: LogKey) -> bool:
        """A log that starts anew (its base is nothing) in another history than the one the store holds this
        agent in: another job's memory of the same agent id. Refused, with a reason, never mixed in."""
        assert first.base is not None
        agent, stored = log_key[0], self.histories.get(log_key[0], "")
        if first.base.seq or not stored or first.history == stored or self._position(log_key) == ("", 0):
            return False
        if agent not in self.refused:
            self.refused[agent] = (f"the store holds {agent!r} of history {stored}, and {self.log_dir} has a new "
                                   f"log of it in history {first.history}: another job's memory of this agent")
            log.error("refused %s: %s. Give each job a store of its own (store.url), or restore the job that "
                      "wrote history %s", agent, self.refused[agent], stored)
        return True

    def _apply(self) -> None:
        while True:  # (again after a conflict: another applier moved some positions)
            runs = {log_key: run for log_key, entries in self.waiting.items()
                    if (run := self._next_run(log_key, entries))}
            taken = {(log_key, (e.branch, e.seq)) for log_key, run in runs.items() for e in run}
            left = {(log_key, place) for log_key, entries in self.waiting.items() for place in entries} - taken
            finished = [name for name, held in self.unfinished.items() if not held & left]
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
                        self.positions[log_key] = (run[-1].branch, run[-1].seq)
                        self.histories[log_key[0]] = run[-1].history or self.histories.get(log_key[0], "")
                        for entry in run:
                            del self.waiting[log_key][(entry.branch, entry.seq)]
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


def _consecutive(entries: dict[Place, LogEntry], branch: str, after: int, until: int | None = None) -> list[LogEntry]:
    """The entries of `branch` that follow seq `after` with no gap (up to seq `until`)."""
    run = []
    while (branch, after + 1) in entries and (until is None or after < until):
        after += 1
        run.append(entries[(branch, after)])
    return run


def apply_committed(store: MemoryStore, output_dir: str | Path) -> int:
    """Apply what the job at `output_dir` (a path or URL) committed and the store lacks; returns how many
    entries."""
    return LogApplier(store, LogLocation(str(output_dir))).poll()
