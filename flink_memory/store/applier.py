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
from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from flink_memory.stages.unit_rows import LogEntry
from flink_memory.store.rules import PositionConflict
from flink_memory.store.sql import MemoryStore

log = logging.getLogger(__name__)

LOG_DIR = "memory"  # the log's folder in the job's output directory
# agents applied in one transaction (PostgreSQL holds a lock per agent until the commit; its lock table is
# bounded): a file of more agents takes several, and is recorded as applied with the last
AGENTS_PER_TRANSACTION = 500


class LogApplier:
    """Applies a memory-log folder to a store; `poll` once, or `follow` until stopped."""

    def __init__(self, store: MemoryStore, log_dir: str | Path) -> None:
        self.store = store
        self.log_dir = Path(log_dir)
        self.applied = store.applied_files()
        # per log (agent, writer): entries read and not applied yet, by seq
        self.waiting: dict[tuple[str, str], dict[int, LogEntry]] = defaultdict(dict)
        self.unfinished: dict[str, dict[tuple[str, str], int]] = {}  # files read, not applied to the end: last seqs
        self.positions: dict[tuple[str, str], int] = {}
        self.entries = 0  # entries applied by this applier
        self.skipped: list[tuple[str, int, str]] = []  # (file, line or 0 for all of it, why): not log entries

    def committed_files(self) -> list[Path]:
        """Committed part files not applied yet, oldest first."""
        if not self.log_dir.is_dir():
            return []
        found = [p for p in self.log_dir.iterdir() if p.is_file() and not p.name.startswith(".")
                 and p.name not in self.applied and p.name not in self.unfinished]
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def poll(self) -> int:
        """Apply every committed file not applied yet; returns how many entries were applied."""
        before = self.entries
        for path in self.committed_files():
            self._read(path)
            self._apply()
        if self.unfinished and any(self.waiting.values()):
            self._apply()  # (entries that waited for one of the files read since)
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

    def _read(self, path: Path) -> None:
        """Take a file's entries. A line that is no log entry (a corrupt or foreign file) is reported with the
        file's name and skipped: the other agents go on, and an agent whose entry it was waits at that gap."""
        last: dict[tuple[str, str], int] = {}
        try:
            lines = path.read_bytes().decode("utf-8").splitlines()
        except UnicodeDecodeError as exc:
            lines = []
            self._skip(path.name, 0, f"not UTF-8 text ({exc.reason})")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = LogEntry.model_validate_json(line)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                self._skip(path.name, number, f"{where}: {error['msg']}" if where else error["msg"])
                continue
            log_key = (entry.agent_id, entry.by)
            self.waiting[log_key][entry.seq] = entry
            last[log_key] = max(last.get(log_key, 0), entry.seq)
        self.unfinished[path.name] = last

    def _skip(self, name: str, line: int, reason: str) -> None:
        where = f"{name}, line {line}" if line else name
        self.skipped.append((name, line, reason))
        log.error("skipped %s in %s: it is no memory-log entry (%s); the agents it does not concern go on",
                  where, self.log_dir, reason)

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
    """Apply what the job at `output_dir` committed and the store lacks; returns how many entries."""
    return LogApplier(store, Path(output_dir) / LOG_DIR).poll()
