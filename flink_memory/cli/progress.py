"""The progress line of `flink-memory run`: the job's counters, polled from the local cluster's REST API."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flink_memory.topology import PARSE_OPERATOR

KINDS = ("plan", "batch", "part", "merge", "global")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


def count_lines(path: str) -> int | None:
    """Lines of a bounded local input (a file, or the files of a folder); None when it cannot be read here."""
    root = Path(path.removeprefix("file://"))
    # (Flink's file source skips names starting with "." or "_", as this count does)
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and not any(part.startswith((".", "_"))
                                                              for part in p.relative_to(root).parts)
    ) if root.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                total += block.count(b"\n")
    return total


def time_left_s(s: dict[str, float], concurrency: int) -> float | None:
    """Seconds until the calls queued or running now are answered, at the mean latency so far (None before
    any call ended). Work those answers start (merges, globals) comes on top."""
    calls, open_calls = s.get("llm_calls", 0), s.get("llm_in_flight", 0)
    if calls <= 0 or open_calls <= 0:
        return None
    mean_s = s.get("llm_call_ms", 0) / calls / 1000
    return -(-open_calls // max(1, concurrency)) * mean_s


def records_read_metric(ids: list[str]) -> str | None:
    """The REST id of the parse operator's numRecordsIn among a vertex's metric ids (None if not there).

    Flink counts it on the Java side for each element, so it is exact at once, unlike a Python counter
    handed to Flink in batches. The REST API writes an operator's name with ", " as "__": fused with the
    Python operators before it (memory-to-json), the parse operator's name ends "__parse-validate", and
    the fused operator's input count is still the records read."""
    for metric in ids:
        operator, _, name = metric.rpartition(".")
        if name == "numRecordsIn" and (operator == PARSE_OPERATOR or operator.endswith(f"__{PARSE_OPERATOR}")):
            return metric
    return None


class ProgressLine:
    """Polls the local cluster's REST API for the job's counters and reports them.

    On a terminal: one line, rewritten every second. Otherwise (a log, CI): a line every 10 seconds. Calls
    are counted when they end (in every phase, the end of a bounded input included); once a bounded input
    has been read, the line says how long the calls queued or running will take at the latency so far.
    """

    NAMES = ("dead_letters", "units_in", "batches", "merges", "globals", "llm_in_flight",
             "pending_keys", "llm_calls", "llm_call_ms", *(f"llm_calls_{k}" for k in KINDS))

    def __init__(self, port: int, job_id: str, stream: Any = sys.stderr, total: int | None = None,
                 concurrency: int = 1, every_s: float | None = None,
                 note: Callable[[], str | None] | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.note = note  # more to say at the end of the line (the store's lag when no applier takes commits)
        self.job_id = job_id
        self.stream = stream
        self.total = total
        self.concurrency = concurrency
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every_s = every_s if every_s else 1.0 if self.tty else 10.0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
    def start(self) -> ProgressLine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def snapshot(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        job = _get_json(f"{self.base}/jobs/{self.job_id}")
        for vertex in job.get("vertices", []):
            url = f"{self.base}/jobs/{self.job_id}/vertices/{vertex['id']}/subtasks/metrics"
            available = [m["id"] for m in _get_json(url)]
            wanted = [m for m in available if m.rsplit(".", 1)[-1] in self.NAMES and "flink_memory" in m]
            read = records_read_metric(available)
            if read is not None:
                wanted.append(read)
            if not wanted:
                continue
            for metric in _get_json(f"{url}?get={','.join(wanted)}&agg=sum"):
                name = "records_in" if metric["id"] == read else metric["id"].rsplit(".", 1)[-1]
                totals[name] = totals.get(name, 0) + float(metric.get("sum", 0))
        return totals

    def line(self, s: dict[str, float]) -> str:
        read = int(s.get("records_in", 0))
        elapsed = time.monotonic() - self.started
        if self.total:
            records = f"records {read}/{self.total}"
            if 0 < read < self.total:
                records += f" (input ends in ~{elapsed * (self.total - read) / read:.0f} s)"
        else:
            records = f"records {read}"
        by_kind = ", ".join(f"{k} {int(s[f'llm_calls_{k}'])}" for k in KINDS if s.get(f"llm_calls_{k}"))
        calls = f"{int(s.get('llm_calls', 0))}" + (f" ({by_kind})" if by_kind else "")
        line = (f"[flink-memory] {elapsed:5.0f} s | {records} | dead letters {int(s.get('dead_letters', 0))}"
                f" | batches {int(s.get('batches', 0))} | merges {int(s.get('merges', 0))}"
                f" | globals {int(s.get('globals', 0))} | calls {calls}"
                f" | in flight {int(s.get('llm_in_flight', 0))}")
        left = time_left_s(s, self.concurrency) if self.total and read >= self.total else None
        note = self.note() if self.note is not None else None
        return (line + (f" | ~{left:.0f} s left for the calls in flight" if left is not None else "")
                + (f" | {note}" if note else ""))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                text = self.line(self.snapshot())
            except (OSError, ValueError, KeyError):
                continue
            self.stream.write(f"\r\033[K{text}" if self.tty else text + "\n")
            self.stream.flush()
