"""What a reader waits for, with the store following the committed log: a followed directory, `flink-memory
run --follow` (an instant provider) and `flink-memory serve` over HTTP.

1. Write to found: an agent writes a fact over HTTP (POST /v1/agents/{id}/memories, which the service turns
   into a file in the followed directory) and recalls it over HTTP every 20 ms until the fact comes back as a
   unit (a provisional row until its checkpoint commits). The job's source lists the followed directory every
   `source.follow_interval_s` (1 s): 0.5 s on average, and up to 1 s, of any store design's figure.
2. Commit to visible: for every summary node live at the end, the time from its commit (its part file appears
   in summaries/ or memory/, whichever first) to its visibility in the store (polled every 50 ms, as is the
   output folder). A node replaced in the commit that brought it is never live in the store, by design.

Run: `python benchmarks/store_latency.py [--writes 40] [--json PATH]` (about two minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import cli_command, spawn  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402
from servicekit import call, serving  # noqa: E402

from flink_memory.cli import main as cli  # noqa: E402
from flink_memory.outputs import read_outputs  # noqa: E402
from flink_memory.service.server import ServeOptions  # noqa: E402
from flink_memory.store import live_view, open_store  # noqa: E402

AGENT = "courier"
FOLLOW_INTERVAL_S = 1.0  # how often the job's source lists the followed directory (source.follow_interval_s)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Watcher(threading.Thread):
    """First sight of each node: in the committed output folders and in the store."""

    def __init__(self, output: Path, store: str) -> None:
        super().__init__(daemon=True)
        self.output, self.store = output, store
        self.committed: dict[str, float] = {}
        self.visible: dict[str, float] = {}
        self.read: set[Path] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            now = time.monotonic()
            for folder, key in (("summaries", "node_id"), ("memory", "node")):
                for path in (self.output / folder).glob("[!.]*") if (self.output / folder).exists() else ():
                    if path in self.read:
                        continue
                    self.read.add(path)
                    for line in path.read_text().splitlines():
                        data = json.loads(line)
                        node_id = data[key] if key == "node_id" else (data.get("node") or {}).get("node_id")
                        if node_id:
                            self.committed.setdefault(node_id, now)
            try:
                with open_store(self.store) as store:
                    for node in store.nodes(AGENT):
                        self.visible.setdefault(node.node_id, time.monotonic())
            except Exception:  # noqa: BLE001 - (the store is not created yet)
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flink-memory-latency-") as tmp:
        root = Path(tmp)
        inbox, output, keys = root / "inbox", root / "out", root / "keys.json"
        inbox.mkdir()
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            cli(["keys", "add", AGENT, "--keys", str(keys)])
        key = printed.getvalue().strip()
        store = str(output / "memory.sqlite")
        with ScriptedServer() as llm:
            command = cli_command(inbox, output, llm, None, "embeddings.provider=none", "batching.max_items=5",
                                  "batching.flush_after_s=1", "summarization.global_refresh_s=1",
                                  "summarization.fan_in=2", args=("--follow",))
            job = spawn(command, root / "job.log")
            watcher = Watcher(output, store)
            watcher.start()
            found: list[float] = []
            try:
                with serving(ServeOptions(store=store, input=str(inbox), keys=str(keys))) as url:
                    deadline = time.monotonic() + 180
                    while call(f"{url}/v1/health")[1].get("store") != "ok":
                        if time.monotonic() > deadline:
                            raise SystemExit("the job did not create the store in 180 s")
                        time.sleep(0.2)
                    for i in range(-1, args.writes):  # (write -1: the first through the job, reported alone)
                        word = f"Qz{i + 1:03d}marker"
                        posted = time.monotonic()
                        status, _ = call(f"{url}/v1/agents/{AGENT}/memories", "POST",
                                         {"id": f"fact{i + 1}", "text": f"The courier code {word} opens gate {i}."},
                                         key)
                        assert status == 202, status
                        while True:
                            status, answer = call(f"{url}/v1/agents/{AGENT}/recall", "POST",
                                                  {"question": word, "k": 3}, key)
                            if status == 200 and any(word in h["text"] and h["kind"] == "unit"
                                                     for h in answer["hits"]):
                                break
                            if time.monotonic() - posted > 60:
                                raise SystemExit(f"write {i} not found in 60 s")
                            time.sleep(0.02)
                        if i < 0:
                            first = time.monotonic() - posted
                        else:
                            found.append(time.monotonic() - posted)
                        time.sleep(0.3 + (i % 7) * 0.1)  # writes at varied moments of the listing cycle
                    deadline = time.monotonic() + 60  # the last nodes: their commit and their application
                    time.sleep(12)  # (the last writes' nodes: their batch closes, their checkpoint commits)
                    while time.monotonic() < deadline:
                        live = {n for _, n in live_view(read_outputs(str(output))["summaries"])}
                        if watcher.committed and live <= set(watcher.visible):
                            break
                        time.sleep(0.5)
            finally:
                watcher.stop.set()
                os.kill(job.pid, signal.SIGTERM)
                job.wait(120)
        live = {node_id for (_, node_id) in live_view(read_outputs(str(output))["summaries"])}
    lags = [watcher.visible[n] - t for n, t in watcher.committed.items() if n in watcher.visible and n in live]
    result = {
        "writes": args.writes,
        "write_to_found_p50_s": round(statistics.median(found), 3),
        "write_to_found_p99_s": round(percentile(found, 0.99), 3),
        "write_to_found_max_s": round(max(found), 3),
        "write_to_found_slowest_s": [round(x, 3) for x in sorted(found)[-3:]],
        "first_write_to_found_s": round(first, 3),
        "source_listing_interval_s": FOLLOW_INTERVAL_S,
        "nodes": len(lags),
        "commit_to_visible_p50_s": round(statistics.median(lags), 3) if lags else None,
        "commit_to_visible_p99_s": round(percentile(lags, 0.99), 3) if lags else None,
        "commit_to_visible_max_s": round(max(lags), 3) if lags else None,
        "live_nodes_never_visible": len(live - set(watcher.visible)),
    }
    print(f"write (HTTP) to found (recall over HTTP), {args.writes} writes: p50 {result['write_to_found_p50_s']} s, "
          f"p99 {result['write_to_found_p99_s']} s, slowest {result['write_to_found_slowest_s']}; the first write "
          f"{result['first_write_to_found_s']} s (the job's source lists the followed directory every "
          f"{FOLLOW_INTERVAL_S} s: {FOLLOW_INTERVAL_S / 2} s on average, and up to {FOLLOW_INTERVAL_S} s, of each)")
    print(f"summary node commit to store visibility, {result['nodes']} nodes: p50 {result['commit_to_visible_p50_s']} "
          f"s, p99 {result['commit_to_visible_p99_s']} s, max {result['commit_to_visible_max_s']} s; live at the end "
          f"and never seen in the store: {result['live_nodes_never_visible']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
