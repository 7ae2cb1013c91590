"""Throughput of this checkout against another revision's, on the overhead workload of throughput.py, in turns.

    python benchmarks/throughput_vs.py --baseline f540afc --pairs 3

A layout change (modules moved, messages typed, state schemas apart) must not cost throughput. This script
checks a revision out beside this one (`git worktree`, in a temporary folder), then runs the same job on the
same input with an instant provider, baseline and current in turn `--pairs` times (which goes first turns each
pair), each run in a process of its own whose Python path (the client's and the job's) holds only that checkout.
It prints each run's wall time, the ratio current / baseline pair by pair and their median (1.0: the same; the
spread of the ratios is the noise), and checks that both cover every item. The store and embeddings are off on
both sides: the pipeline is measured. `--json PATH` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import items, write_lines  # noqa: E402
from revisions import worktree  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

# Run inside one checkout: build the job with that checkout's code, run it, print the wall time.
RUN = """
import json, sys, time
sys.path.insert(0, sys.argv[1] + "/tests")
from jobkit import config_for
from flink_memory.flink import pipeline
from flink_memory.flink.pipeline import build_job
config = config_for(sys.argv[2], *sys.argv[5:])
started = time.perf_counter()
build_job(config, sys.argv[3], sys.argv[4]).execute("throughput-vs")
print(json.dumps({"wall_s": time.perf_counter() - started, "module": pipeline.__file__}))
"""


def covered(output: Path) -> int:
    """Units in the run's batch nodes (each item is one unit)."""
    total = 0
    for path in output.glob("summaries/**/*.jsonl"):
        for line in path.read_text().splitlines():
            node = json.loads(line)
            if node["kind"] == "batch" and not node.get("replaces"):
                total += len(node["children"])
    return total


def run(checkout: Path, url: str, input_path: Path, output: Path, settings: list[str]) -> float:
    paths = [str(checkout), *(p for p in site.getsitepackages() if os.path.isdir(p))]
    python_path = os.pathsep.join(paths)
    overrides = [*settings, f"job.python_path={python_path}"]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", RUN, str(checkout), url, str(input_path), str(output), *overrides],
                          env=env, cwd=checkout, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the job of {checkout} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["module"].startswith(str(checkout)):
        raise SystemExit(f"{checkout}'s run imported flink_memory from {result['module']}")
    return result["wall_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="f540afc", help="the revision to compare with (default: f540afc)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--items-per-agent", type=int, default=200)
    parser.add_argument("--max-items", type=int, default=50)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    settings = ["embeddings.provider=none", "store.enabled=false", f"batching.max_items={args.max_items}",
                f"summarization.fan_in={args.fan_in}"]
    expected = args.agents * args.items_per_agent
    with tempfile.TemporaryDirectory(prefix="throughput-vs-") as tmp, worktree(args.baseline) as baseline:
        work = Path(tmp)
        input_path = write_lines(work / "input.jsonl", items(args.agents, args.items_per_agent))
        walls: dict[str, list[float]] = {"baseline": [], "current": []}
        with ScriptedServer() as server:
            for pair in range(args.pairs):  # (the order turns each pair, so drift weighs on both sides)
                sides = [("baseline", baseline), ("current", ROOT)]
                for side, checkout in sides if pair % 2 == 0 else sides[::-1]:
                    output = work / f"{side}-{pair}"
                    walls[side].append(run(checkout, server.base_url, input_path, output, settings))
                    if (units := covered(output)) != expected:
                        raise SystemExit(f"{side} run {pair}: {units} items in batch nodes, {expected} expected")
                    print(f"pair {pair + 1}: {side:8s} {walls[side][-1]:6.1f} s", flush=True)
    ratios = [c / b for b, c in zip(walls["baseline"], walls["current"], strict=True)]
    result = {"baseline": args.baseline, "items": expected, "wall_s": walls,
              "ratios": [round(r, 3) for r in ratios], "median_ratio": round(statistics.median(ratios), 3)}
    print(f"{expected} items: current / baseline ({args.baseline}) wall time, pair by pair "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; median {result['median_ratio']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
