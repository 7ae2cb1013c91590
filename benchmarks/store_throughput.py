"""The job's records/s with the store on, against a baseline checkout (by default the release before the store
followed the committed log), run in the same script: pairs of runs, baseline and ours in turn.

Each run is the overhead workload of benchmarks/throughput.py (20 000 items of 100 agents, batches of 50, an
instant provider) in a process of its own, with the store on, timed until the store holds everything: for a
checkout that writes the store from its committed memory log, the job with its store applier beside it (as
`flink-memory run` does) until the last commit is applied; for one that writes the store from inside the job,
the job alone. Both stores are checked against the changelog's live view at the end.

Run: `python benchmarks/store_throughput.py [--baseline REF] [--pairs 3] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from revisions import worktree

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "f540afc"  # main before the store followed the committed memory log (issue 31)


def child(workdir: Path, agents: int, per_agent: int) -> None:
    """One timed run in this process (the checkout on PYTHONPATH is the one measured): prints a JSON line."""
    sys.path.insert(0, str(Path.cwd() / "tests"))  # (the measured checkout's test kit)
    from jobkit import config_for, items, write_lines
    from scripted_server import ScriptedServer

    import flink_memory
    from flink_memory.flink.pipeline import build_job
    from flink_memory.outputs import read_outputs
    from flink_memory.store import live_view, open_store

    try:
        from flink_memory.store.applier import LOG_DIR, LogApplier
    except ImportError:  # a checkout whose job writes the store itself
        LogApplier = None  # noqa: N806
    records = items(agents, per_agent)
    input_path = write_lines(workdir / "input.jsonl", records)
    output = workdir / "out"
    store_url = str(output / "memory.sqlite")
    with ScriptedServer() as server:
        config = config_for(server.base_url, "embeddings.provider=none", "batching.max_items=50",
                            "summarization.fan_in=8")
        started = time.perf_counter()
        env = build_job(config, str(input_path), str(output))
        if LogApplier is None:
            env.execute("store-throughput")
        else:
            import threading

            output.mkdir(parents=True, exist_ok=True)
            with open_store(store_url, create=True) as store:
                applier, stop = LogApplier(store, output / LOG_DIR), threading.Event()
                thread = threading.Thread(target=applier.follow, args=(stop,))
                thread.start()
                env.execute("store-throughput")
                stop.set()
                thread.join()
        wall = time.perf_counter() - started
    live = live_view(read_outputs(str(output))["summaries"])
    with open_store(store_url) as store:
        stored = {(a, n.node_id): n for a in store.agents() for n in store.nodes(a)}
        units = sum(len(store.units(a)) for a in store.agents())
    print(json.dumps({"wall_s": wall, "items": len(records), "store_equals_live_view": stored == live,
                      "units": units, "committed_log": LogApplier is not None,
                      "package": list(flink_memory.__path__)}))


def run(checkout: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, str(ROOT / "benchmarks" / "store_throughput.py"), "--child", str(workdir),
               "--agents", str(args.agents), "--items-per-agent", str(args.items_per_agent)]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"run in {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="a git ref of this repository")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--items-per-agent", type=int, default=200)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.agents, args.items_per_agent)
        return 0
    with tempfile.TemporaryDirectory(prefix="flink-memory-store-bench-") as tmp, worktree(args.baseline) as base:
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "ours": []}
        for pair in range(args.pairs):
            for name, checkout in (("baseline", base), ("ours", ROOT)):
                result = run(checkout, Path(tmp) / f"{name}-{pair}", args)
                runs[name].append(result)
                print(f"  {name} run {pair + 1}: {result['items'] / result['wall_s']:.0f} records/s "
                      f"({result['wall_s']:.1f} s; store equals the live view: "
                      f"{result['store_equals_live_view']})", flush=True)
    rates = {name: [r["items"] / r["wall_s"] for r in results] for name, results in runs.items()}
    ratios = [o / b for o, b in zip(rates["ours"], rates["baseline"])]
    summary = {"baseline": args.baseline, "pairs": args.pairs,
               "baseline_records_per_s": round(statistics.median(rates["baseline"]), 1),
               "ours_records_per_s": round(statistics.median(rates["ours"]), 1),
               "ours_over_baseline_median": round(statistics.median(ratios), 3),
               "ratios": [round(r, 3) for r in ratios],
               "stores_equal_live_view": all(r["store_equals_live_view"] for rs in runs.values() for r in rs)}
    print(f"store on, records/s (median of {args.pairs}): baseline {args.baseline} "
          f"{summary['baseline_records_per_s']}, ours {summary['ours_records_per_s']}: ours / baseline "
          f"{summary['ours_over_baseline_median']} (pairs {summary['ratios']}); every store equals its live view: "
          f"{summary['stores_equal_live_view']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
