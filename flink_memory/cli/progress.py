"""The progress line of `flink-memory run`: the job's counters, polled from the local cluster's REST API."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

KINDS = ("plan", "batch", "part", "merge", "global")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


def count_lines(path: str) -> int | None:
    """Lines of a bounded local input (a file, or the files of a folder); None when it cannot be read here."""
    root = Path(path.removeprefix("file://"))
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                total += block.count(b"\n")
    return total


class ProgressLine:
    """Polls the local cluster's REST API for the job's counters and reports them.

    On a terminal: one line, rewritten every second. Otherwise (a log, CI): a line every 30 seconds.
    """

    NAMES = ("records_in", "dead_letters", "units_in", "batches", "merges", "globals", "llm_in_flight",
             "pending_keys", *(f"llm_calls_{k}" for k in KINDS))

    def __init__(self, port: int, job_id: str, stream: Any = sys.stderr, total: int | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.job_id = job_id
        self.stream = stream
        self.total = total
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every_s = 1.0 if self.tty else 30.0
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
            if not wanted:
                continue
            for metric in _get_json(f"{url}?get={','.join(wanted)}&agg=sum"):
                name = metric["id"].rsplit(".", 1)[-1]
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
        calls = ", ".join(f"{k} {int(s[f'llm_calls_{k}'])}" for k in KINDS if s.get(f"llm_calls_{k}"))
        return (f"[flink-memory] {elapsed:5.0f} s | {records} | dead letters {int(s.get('dead_letters', 0))}"
                f" | batches {int(s.get('batches', 0))} | merges {int(s.get('merges', 0))}"
                f" | globals {int(s.get('globals', 0))} | calls {calls or 0}"
                f" | in flight {int(s.get('llm_in_flight', 0))}")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                text = self.line(self.snapshot())
            except (OSError, ValueError, KeyError):
                continue
            self.stream.write(f"\r\033[K{text}" if self.tty else text + "\n")
            self.stream.flush()
