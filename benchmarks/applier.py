"""The store applier as the memory log ages: poll cost, apply throughput and commit-to-found latency at 1 000,
10 000 and 100 000 checkpoints' worth of log, against today's listing approach, in the same script.

For each size N, a memory/ folder holds N committed files, all applied (the store says so), as a job leaves it
after N checkpoints at parallelism 1; the newest `--recent` of them were committed within
store.log_keep_applied_s (the last hour: 720 at 10 s checkpoints and parallelism 2), the others before. Then:

- poll cost: CPU per idle poll (nothing new) of (a) today's listing (main before this change: `iterdir`, a
  `stat` per entry, every poll), (b) the applier with retirement off (store.log_keep_applied_s: null: it lists
  the whole log, through pyarrow.fs), (c) the applier as configured by default (applied files older than
  keep_applied_s retired to memory-applied/ by its first poll, a one-off measured apart);
- apply throughput: commits applied per second when each poll finds one new commit (a following applier at
  checkpoint pace), (b) and (c);
- commit-to-found: from a commit's file appearing to a reader finding its unit in the store, with the applier
  following (`follow`, polls every 0.25 s) on a thread: p50 and p99 over `--samples` commits, (b) and (c).

Run: `python benchmarks/applier.py [--sizes 1000 10000 100000] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from flink_memory.memory_log import LogEntry, UnitRows
from flink_memory.records import MemoryUnit
from flink_memory.store import open_store
from flink_memory.store.applier import LOG_DIR, LogApplier

HOUR_S = 3600.0


def entry(agent: str, seq: int) -> LogEntry:
    unit = MemoryUnit(agent_id=agent, unit_id=f"u{seq}", source_id=f"u{seq}",
                      text=f"Unit {seq} of {agent}: Person{seq} paid {seq} EUR on the boat.")
    return LogEntry(by="batcher", agent_id=agent, seq=seq, units=UnitRows(agent_id=agent, seq=seq, upsert=[unit]))


def commit(folder: Path, name: str, entries: list[LogEntry], mtime: float | None = None) -> Path:
    """A committed part file, as Flink's file sink leaves it (written hidden, then renamed into place)."""
    hidden = folder / f".{name}.inprogress"
    hidden.write_text("".join(e.model_dump_json() + "\n" for e in entries))
    if mtime is not None:
        os.utime(hidden, (mtime, mtime))
    path = folder / name
    hidden.rename(path)
    return path


def todays_listing(folder: Path, applied: set[str]) -> list[Path]:
    """What the applier did each poll before this change (flink_memory/store/applier.py at 44ce3b1)."""
    found = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in applied]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def cpu_per_call(call: Any, repeat: int) -> float:
    """CPU seconds per call (this process), the mean of `repeat` calls."""
    started = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - started) / repeat


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Log:
    """A memory/ folder of `size` applied commits (one old agent per commit, never read again) and a store."""

    def __init__(self, root: Path, size: int, recent: int) -> None:
        self.output = root / "out"
        self.folder = self.output / LOG_DIR
        self.folder.mkdir(parents=True)
        self.store_path = str(root / "memory.sqlite")
        now = time.time()
        names = []
        for k in range(size):
            old = k < size - recent
            names.append(f"part-{k:07d}-0-{k}")
            commit(self.folder, names[-1], [entry(f"old-{k % 100}", 1)], now - 2 * HOUR_S if old else now - 60)
        with open_store(self.store_path, create=True) as store:
            store.apply_log({}, names)  # applied (their entries long ago; what is applied is not read again)
        self.seq = 0
        self.count = size

    def next_commit(self) -> tuple[str, Path]:
        """One more commit: the next unit of agent "live"."""
        self.seq += 1
        self.count += 1
        return f"u{self.seq}", commit(self.folder, f"part-{self.count:07d}-0-{self.count}", [entry("live", self.seq)])


def throughput(applier: LogApplier, log: Log, commits: int) -> float:
    """Commits applied per second, a poll per commit."""
    started = time.perf_counter()
    for _ in range(commits):
        log.next_commit()
        assert applier.poll() == 1
    return commits / (time.perf_counter() - started)


def commit_to_found(log: Log, keep_applied_s: float | None, samples: int) -> list[float]:
    """Seconds from a commit to a reader finding its unit, with the applier following on a thread."""
    stop = threading.Event()
    with open_store(log.store_path) as store, open_store(log.store_path) as reader:
        applier = LogApplier(store, log.folder, keep_applied_s=keep_applied_s)
        applier.poll()
        thread = threading.Thread(target=applier.follow, args=(stop,), daemon=True)
        thread.start()
        latencies = []
        for _ in range(samples):
            unit_id, _ = log.next_commit()
            written = time.perf_counter()
            while unit_id not in {u.unit_id for u, _ in reader.units("live")}:
                time.sleep(0.005)
            latencies.append(time.perf_counter() - written)
            time.sleep(0.1)  # (commits arrive apart, as checkpoints do)
        stop.set()
        thread.join()
    return latencies


def measure(size: int, recent: int, polls: int, commits: int, samples: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-applier-") as tmp:
        started = time.perf_counter()
        log = Log(Path(tmp), size, min(recent, size))
        made_s = time.perf_counter() - started
        with open_store(log.store_path) as store:
            applied = store.applied_files()
            today = cpu_per_call(lambda: todays_listing(log.folder, applied), polls)
            whole = LogApplier(store, log.folder, keep_applied_s=None)
            whole.poll()
            no_retire = cpu_per_call(whole.poll, polls)
            no_retire_tput = throughput(whole, log, commits)
        found_whole = commit_to_found(log, None, samples)
        with open_store(log.store_path) as store:
            ours = LogApplier(store, log.folder, keep_applied_s=HOUR_S)
            started = time.perf_counter()
            ours.poll()  # the one-off: the applied files older than an hour leave memory/
            retire_s = time.perf_counter() - started
            listed = len(ours.location.committed())
            retiring = cpu_per_call(ours.poll, polls)
            retiring_tput = throughput(ours, log, commits)
        found_ours = commit_to_found(log, HOUR_S, samples)
        with open_store(log.store_path) as store:  # every unit of every measured commit is there, once
            assert {u.unit_id for u, _ in store.units("live")} == {f"u{k}" for k in range(1, log.seq + 1)}
    return {
        "checkpoints": size, "recent": min(recent, size), "setup_s": round(made_s, 1),
        "poll_cpu_ms": {"todays_listing": today * 1e3, "no_retirement": no_retire * 1e3, "retiring": retiring * 1e3},
        "listed_per_poll": {"todays_listing": size, "retiring": listed},
        "retire_once_s": retire_s,
        "commits_per_s": {"no_retirement": no_retire_tput, "retiring": retiring_tput},
        "commit_to_found_s": {
            "no_retirement": {"p50": statistics.median(found_whole), "p99": percentile(found_whole, 0.99)},
            "retiring": {"p50": statistics.median(found_ours), "p99": percentile(found_ours, 0.99)}},
    }


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| checkpoints in the log | poll CPU, today's listing | poll CPU, no retirement | poll CPU, retiring "
            "| today / retiring | files listed per poll (today / retiring) | commits/s applied (no retirement / "
            "retiring) | commit-to-found p50 / p99 (no retirement) | commit-to-found p50 / p99 (retiring) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        poll, tput, found = r["poll_cpu_ms"], r["commits_per_s"], r["commit_to_found_s"]
        rows.append(
            f"| {r['checkpoints']:,} | {poll['todays_listing']:.2f} ms | {poll['no_retirement']:.2f} ms "
            f"| {poll['retiring']:.2f} ms | {poll['todays_listing'] / poll['retiring']:.1f}x "
            f"| {r['listed_per_poll']['todays_listing']:,} / {r['listed_per_poll']['retiring']:,} "
            f"| {tput['no_retirement']:.0f} / {tput['retiring']:.0f} "
            f"| {found['no_retirement']['p50']:.2f} / {found['no_retirement']['p99']:.2f} s "
            f"| {found['retiring']['p50']:.2f} / {found['retiring']['p99']:.2f} s |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--recent", type=int, default=720, help="commits of the last hour (kept in memory/)")
    parser.add_argument("--polls", type=int, default=20, help="idle polls timed per approach")
    parser.add_argument("--commits", type=int, default=50, help="commits applied one per poll, per approach")
    parser.add_argument("--samples", type=int, default=100, help="commit-to-found samples per approach")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results = []
    for size in args.sizes:
        results.append(measure(size, args.recent, args.polls, args.commits, args.samples))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
