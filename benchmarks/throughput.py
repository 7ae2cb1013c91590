"""Throughput and overhead of the streaming job on a local MiniCluster, as ratios.

1. Concurrency: a scripted provider answers every call after a fixed latency. The batcher's throughput
   (items summarized per second while batch calls run) is compared with the ideal
   `max_concurrency x max_items / latency`; the same job with `max_concurrency=1` runs in the same script
   as the serial baseline.
2. Overhead: with an instant provider, the job's wall time is compared with a bare PyFlink job that reads
   the same file, parses it, keys it by agent_id and writes it to a file sink, on the same environment.
Both also run two variants of the default (process mode, `job.bundle_size=1`): `job.bundle_size=100`
(faster, but not restore-safe on PyFlink 2.3, see README) and `job.execution_mode=thread`.

Run: `python benchmarks/throughput.py` (about two minutes on 2 cores). `--json PATH` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import batch_units, config_for, items, write_lines  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

from flink_memory.cli import read_outputs  # noqa: E402
from flink_memory.flink.pipeline import build_job, create_environment, file_sink, file_source  # noqa: E402
from flink_memory.summarize.prompts import is_batch_request, item_lines  # noqa: E402

# Alternatives to the default (process mode, job.bundle_size=1), measured in the same script.
VARIANTS = {"bundle_size_100": ("job.bundle_size=100",), "thread_mode": ("job.execution_mode=thread",)}


def run_memory_job(workdir: Path, input_path: Path, server: ScriptedServer, *overrides: str) -> tuple[float, dict]:
    output = workdir / "out"
    config = config_for(server.base_url, *overrides)
    started = time.perf_counter()
    build_job(config, str(input_path), str(output)).execute("flink-memory-benchmark")
    return time.perf_counter() - started, read_outputs(str(output))


def run_bare_job(workdir: Path, input_path: Path, server_url: str, *overrides: str) -> float:
    """Read, parse, key by agent and write: the least a keyed job over this input does."""
    from pyflink.common import Types

    output = workdir / "bare"
    env = create_environment(config_for(server_url, *overrides), str(output))
    lines = file_source(env, str(input_path))
    keyed = (
        lines.map(lambda line: (json.loads(line)["agent_id"], line),
                  output_type=Types.TUPLE([Types.STRING(), Types.STRING()]))
        .key_by(lambda pair: pair[0], key_type=Types.STRING())
        .map(lambda pair: pair[1], output_type=Types.STRING())
    )
    keyed.sink_to(file_sink(str(output / "lines"), "lines"))
    started = time.perf_counter()
    env.execute("bare-keyed-benchmark")
    return time.perf_counter() - started


def check_coverage(outputs: dict, expected_units: int, overrides: tuple[str, ...]) -> None:
    covered = sum(batch_units(outputs["summaries"]).values())
    if covered != expected_units:
        raise SystemExit(f"coverage broken with {overrides or 'the defaults'}: {covered} units in batch nodes, "
                         f"{expected_units} expected")


def batch_phase(server: ScriptedServer) -> tuple[float, int, int]:
    """Seconds from the first batch call's start to the last one's end, batch calls, items in them."""
    spans = [(start, end, body) for start, end, body in server.spans if is_batch_request(body["messages"])]
    items_in = sum(len(item_lines(body["messages"])) for _, _, body in spans)
    return max(e for _, e, _ in spans) - min(s for s, _, _ in spans), len(spans), items_in


def concurrency_case(workdir: Path, input_path: Path, latency_s: float, concurrency: int, max_items: int,
                     expected_units: int, *overrides: str) -> dict[str, Any]:
    with ScriptedServer(latency_s=latency_s) as server:
        wall, outputs = run_memory_job(
            workdir, input_path, server, f"llm.max_concurrency={concurrency}", f"batching.max_items={max_items}",
            "batching.flush_after_s=3600", "summarization.fan_in=8", *overrides)
        seconds, calls, items_in = batch_phase(server)
        check_coverage(outputs, expected_units, overrides)
        if items_in != expected_units:
            raise SystemExit(f"coverage broken: {items_in} units in batch prompts, {expected_units} expected")
        ideal = concurrency * max_items / latency_s
        measured = items_in / seconds
        return {"max_concurrency": concurrency, "batch_calls": calls, "all_calls": server.count(),
                "max_in_flight": server.max_in_flight, "batch_phase_s": round(seconds, 2),
                "job_wall_s": round(wall, 2), "items_per_s": round(measured, 1), "ideal_items_per_s": ideal,
                "ratio_to_ideal": round(measured / ideal, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="provider latency in seconds")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-items", type=int, default=5)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--items-per-agent", type=int, default=40)
    parser.add_argument("--overhead-items-per-agent", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flink-memory-bench-") as tmp:
        root = Path(tmp)
        records = items(args.agents, args.items_per_agent)
        input_path = write_lines(root / "concurrency.jsonl", records)
        batches = args.agents * math.ceil(args.items_per_agent / args.max_items)
        print(f"concurrency: {len(records)} items, {args.agents} agents, {batches} batches of "
              f"{args.max_items}, provider latency {args.latency * 1000:.0f} ms", flush=True)
        for concurrency in (args.concurrency, 1):
            case = concurrency_case(root / f"c{concurrency}", input_path, args.latency, concurrency,
                                    args.max_items, len(records))
            results[f"concurrency_{concurrency}"] = case
            print(f"  max_concurrency={concurrency}: {case['items_per_s']} items/s, ideal "
                  f"{case['ideal_items_per_s']:.0f}, ratio {case['ratio_to_ideal']}, max in flight "
                  f"{case['max_in_flight']}", flush=True)
        parallel, serial = results[f"concurrency_{args.concurrency}"], results["concurrency_1"]
        results["speedup_over_serial"] = round(parallel["items_per_s"] / serial["items_per_s"], 2)
        print(f"  speedup of max_concurrency={args.concurrency} over 1: {results['speedup_over_serial']}x")
        for name, overrides in VARIANTS.items():
            case = concurrency_case(root / f"c-{name}", input_path, args.latency, args.concurrency, args.max_items,
                                    len(records), *overrides)
            results[f"concurrency_{args.concurrency}_{name}"] = case
            print(f"  max_concurrency={args.concurrency} with {' '.join(overrides)}: ratio {case['ratio_to_ideal']}",
                  flush=True)

        records = items(4, args.overhead_items_per_agent)
        input_path = write_lines(root / "overhead.jsonl", records)
        print(f"overhead: {len(records)} items, instant provider", flush=True)
        with ScriptedServer() as server:
            bare = run_bare_job(root / "bare", input_path, server.base_url)
            ours, outputs = run_memory_job(root / "ours", input_path, server)
            check_coverage(outputs, len(records), ())
            calls = server.count()
            overhead = {"items": len(records), "bare_s": round(bare, 2), "flink_memory_s": round(ours, 2),
                        "llm_calls": calls, "ratio": round(ours / bare, 2)}
            print(f"  bare read+key_by job {bare:.1f} s, flink-memory {ours:.1f} s ({calls} calls): ratio "
                  f"{overhead['ratio']}", flush=True)
            for name, overrides in VARIANTS.items():
                wall, variant_outputs = run_memory_job(root / f"o-{name}", input_path, server, *overrides)
                check_coverage(variant_outputs, len(records), overrides)
                overhead[f"{name}_s"] = round(wall, 2)
                overhead[f"{name}_over_default"] = round(wall / ours, 2)
                print(f"  with {' '.join(overrides)}: {wall:.1f} s, {overhead[f'{name}_over_default']} of the "
                      f"default's time", flush=True)
            results["overhead"] = overhead
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
