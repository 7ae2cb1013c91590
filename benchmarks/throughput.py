"""Throughput, overhead and calls of the streaming job on a local MiniCluster, as ratios measured in one run.

1. Concurrency: a scripted provider answers every call after a fixed latency. Achieved concurrency is the
   time calls were in flight, added up, over (the LLM phase x `llm.max_concurrency`); the LLM phase runs
   from the first call's start to the last call's end. 1.0 means the allowed concurrency was used all the
   time. Also measured with `job.execution_mode=process` (release 0.1.0's default), in the same script.
2. Overhead: with an instant provider, a bare PyFlink job (read, parse, key_by, a keyed count, file sink)
   against flink-memory on the same input and environment: bare wall time / ours (1.0: no overhead).
3. Calls: what the job paid against the least its input needs (full batches, the tree's merges and one
   final global per agent, from the batch counts the input implies).
4. Embeddings (`--embeddings`): the overhead workload with the default offline embedding model off and on,
   `--pairs` times in turn (the other cases run with `embeddings.provider=none`, so they measure the
   pipeline): the median of the pairs' wall time on / off, the store rows still without a vector when each
   run ended, and the model's passages/s on one core (measured alone, in the same script).
   `--embeddings-model NAME` runs another embeddings.model of the embedded provider in place of the default.

Run: `python benchmarks/throughput.py` (a few minutes on 2 cores); `--json PATH` writes the numbers. The
defaults are the workload of issue 11: 2 000 items of 50 agents in batches of 25 at 8 concurrent calls of
0.5 s, and 20 000 items of 100 agents in batches of 50 with an instant provider.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import batch_units, config_for, items, write_lines  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

from flink_memory.cli.run import Applier  # noqa: E402
from flink_memory.config import load_config  # noqa: E402
from flink_memory.flink.pipeline import build_job, create_environment, file_sink, file_source  # noqa: E402
from flink_memory.outputs import read_outputs  # noqa: E402
from flink_memory.summarize.prompts import request_purpose  # noqa: E402


def run_memory_job(workdir: Path, input_path: Path, server: ScriptedServer, *overrides: str) -> tuple[float, dict]:
    """The job on the input; embeddings off unless an override turns them on (the pipeline is measured)."""
    output = workdir / "out"
    config = config_for(server.base_url, "embeddings.provider=none", *overrides)
    started = time.perf_counter()
    env = build_job(config, str(input_path), str(output))
    output.mkdir(parents=True, exist_ok=True)
    store = config.store.location(str(output))
    applier = Applier(store, str(output), config) if store else None  # (as `flink-memory run`: the store
    env.execute("flink-memory-benchmark")  # follows the committed log beside the job)
    if applier is not None and (failed := applier.stop()) is not None:
        raise SystemExit(f"the store applier failed: {failed}")
    return time.perf_counter() - started, read_outputs(str(output))


def run_bare_job(workdir: Path, input_path: Path, server_url: str, *overrides: str) -> float:
    """Read, parse, key by agent, count per agent and write: the least a keyed job over this input does."""
    from pyflink.common import Types
    from pyflink.datastream.functions import KeyedProcessFunction
    from pyflink.datastream.state import ValueStateDescriptor

    class Count(KeyedProcessFunction):
        def open(self, runtime_context: Any) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value: Any, ctx: Any):
            seen = (self.count.value() or 0) + 1
            self.count.update(seen)
            yield f"{value[0]}\t{seen}"

    output = workdir / "bare"
    env = create_environment(config_for(server_url, *overrides), str(output))
    keyed = (
        file_source(env, str(input_path))
        .map(lambda line: (json.loads(line)["agent_id"], line),
             output_type=Types.TUPLE([Types.STRING(), Types.STRING()]))
        .key_by(lambda pair: pair[0], key_type=Types.STRING())
        .process(Count(), output_type=Types.STRING())
    )
    keyed.sink_to(file_sink(str(output / "counts"), "counts"))
    started = time.perf_counter()
    env.execute("bare-keyed-benchmark")
    return time.perf_counter() - started


def minimum_calls(agents: int, per_agent: int, max_items: int, fan_in: int) -> int:
    """Full batches, the merges of a fan_in tree over them, and one final global per agent with 2+ nodes."""
    batches = math.ceil(per_agent / max_items)
    merges, level = 0, batches
    while level >= fan_in:
        merges += level // fan_in
        level = level // fan_in + level % fan_in
    return agents * (batches + merges + (1 if level > 1 else 0))


def calls_by_kind(server: ScriptedServer) -> dict[str, int]:
    counts = dict.fromkeys(("batch", "part", "merge", "global"), 0)
    for body in server.requests:
        if (purpose := request_purpose(body["messages"])) is not None:
            counts[purpose] += 1
    return counts


def check_coverage(outputs: dict, expected_units: int, label: str) -> None:
    covered = sum(batch_units(outputs["summaries"]).values())
    if covered != expected_units:
        raise SystemExit(f"coverage broken ({label}): {covered} units in batch nodes, {expected_units} expected")


def concurrency_case(workdir: Path, records: list[dict], args: argparse.Namespace, *overrides: str) -> dict[str, Any]:
    input_path = write_lines(workdir / "input.jsonl", records)
    with ScriptedServer(latency_s=args.latency) as server:
        wall, outputs = run_memory_job(
            workdir, input_path, server, f"llm.max_concurrency={args.concurrency}",
            f"batching.max_items={args.max_items}", f"summarization.fan_in={args.fan_in}", *overrides)
        spans = list(server.spans)
        kinds = calls_by_kind(server)
    check_coverage(outputs, len(records), " ".join(overrides) or "defaults")
    start, end = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    busy = sum(e - s for s, e, _ in spans)
    phase = end - start
    minimum = minimum_calls(args.agents, args.items_per_agent, args.max_items, args.fan_in)
    return {"calls": len(spans), "calls_by_kind": kinds, "minimum_calls": minimum,
            "calls_over_minimum": round(len(spans) / minimum, 3), "llm_phase_s": round(phase, 2),
            "ideal_phase_s": round(len(spans) * args.latency / args.concurrency, 2), "job_wall_s": round(wall, 2),
            "achieved_concurrency": round(busy / phase, 2),
            "concurrency_ratio": round(busy / phase / args.concurrency, 3)}


def overhead_case(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    records = items(args.overhead_agents, args.overhead_items_per_agent)
    input_path = write_lines(workdir / "overhead.jsonl", records)
    settings = (f"batching.max_items={args.overhead_max_items}", f"summarization.fan_in={args.fan_in}")
    with ScriptedServer() as server:
        bare = run_bare_job(workdir / "bare", input_path, server.base_url)
        ours, outputs = run_memory_job(workdir / "ours", input_path, server, *settings)
        kinds = calls_by_kind(server)
        calls = server.count()
    check_coverage(outputs, len(records), "overhead")
    minimum = minimum_calls(args.overhead_agents, args.overhead_items_per_agent, args.overhead_max_items, args.fan_in)
    return {"items": len(records), "agents": args.overhead_agents, "bare_s": round(bare, 2),
            "flink_memory_s": round(ours, 2), "bare_over_ours": round(bare / ours, 3), "calls": calls,
            "calls_by_kind": kinds, "minimum_calls": minimum, "calls_over_minimum": round(calls / minimum, 3)}


def embeddings_case(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The overhead workload with the default offline embedding model on and off, `--pairs` times in turn
    (off, on, off, on, ...: the machine's drift falls on both): the median of the pairs' wall time ratios, and
    the vectors still missing when each run with them ended."""
    from flink_memory.store import open_store
    from flink_memory.store.schema import NODES

    records = items(args.overhead_agents, args.overhead_items_per_agent)
    input_path = write_lines(workdir / "embeddings.jsonl", records)
    settings = (f"batching.max_items={args.overhead_max_items}", f"summarization.fan_in={args.fan_in}")
    pairs, missing = [], []
    with ScriptedServer() as server:  # (not counted: the first job of a process pays the JVM's warm-up)
        run_memory_job(workdir / "warm-up", input_path, server, *settings)
    for pair in range(args.pairs):
        with ScriptedServer() as server:
            off_s, _ = run_memory_job(workdir / f"off-{pair}", input_path, server, *settings)
        with ScriptedServer() as server:
            on_s, outputs = run_memory_job(workdir / f"on-{pair}", input_path, server, *settings,
                                           "embeddings.provider=embedded", *model_settings(args))
        check_coverage(outputs, len(records), "embeddings")
        with open_store(str(workdir / f"on-{pair}" / "out" / "memory.sqlite")) as store:
            rows, embedded = store.connection.fetch(f"SELECT COUNT(*), COUNT(vector) FROM {NODES}", ())[0]
        pairs.append((off_s, on_s))
        missing.append(rows - embedded)
        print(f"  pair {pair + 1}: off {off_s:.2f} s, on {on_s:.2f} s = {on_s / off_s:.3f}x; {embedded} of {rows} "
              "store rows with a vector at the end", flush=True)
    per_core = embedding_rate([r["text"] for r in records[:PER_CORE_SAMPLE]], args)
    ratios = sorted(on / off for off, on in pairs)
    return {"pairs": [{"off_s": round(off, 2), "on_s": round(on, 2)} for off, on in pairs],
            "on_over_off_median": round(statistics.median(ratios), 3),
            "on_over_off_range": [round(ratios[0], 3), round(ratios[-1], 3)], "rows": rows,
            "rows_without_vector_at_end": missing, "passages_per_s_per_core": round(per_core, 1),
            "model": embedder_name(args)}


PER_CORE_SAMPLE = 300  # workload texts the embedding model alone embeds on one thread


def model_settings(args: argparse.Namespace) -> tuple[str, ...]:
    return (f"embeddings.model={args.embeddings_model}",) if args.embeddings_model else ()


def embedder_name(args: argparse.Namespace) -> str:
    from flink_memory.embeddings import embedder_for

    return embedder_for(load_config(None, list(model_settings(args)), environ={}).embeddings).name


def embedding_rate(texts: list[str], args: argparse.Namespace) -> float:
    """Passages per second of the embedding model on one thread, nothing else running."""
    from flink_memory.embeddings import embedder_for

    model = embedder_for(load_config(None, list(model_settings(args)), environ={}).embeddings)
    model.passages(["(loads the model)"])
    started = time.perf_counter()
    model.passages(texts)
    return len(texts) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.5, help="provider latency in seconds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-items", type=int, default=25)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--items-per-agent", type=int, default=40)
    parser.add_argument("--overhead-agents", type=int, default=100)
    parser.add_argument("--overhead-items-per-agent", type=int, default=200)
    parser.add_argument("--overhead-max-items", type=int, default=50)
    parser.add_argument("--no-process-mode", action="store_true", help="skip the process-mode comparison")
    parser.add_argument("--embeddings", action="store_true",
                        help="also run the overhead workload with the offline embedding model on")
    parser.add_argument("--only-embeddings", action="store_true", help="the embeddings case alone")
    parser.add_argument("--pairs", type=int, default=3, help="--embeddings: off/on runs in turn")
    parser.add_argument("--embeddings-model", help="--embeddings: this embeddings.model (default: the default's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flink-memory-bench-") as tmp:
        root = Path(tmp)
        if not args.only_embeddings:
            records = items(args.agents, args.items_per_agent)
            print(f"concurrency: {len(records)} items of {args.agents} agents, batches of {args.max_items}, "
                  f"llm.max_concurrency={args.concurrency}, provider latency {args.latency * 1000:.0f} ms", flush=True)
            variants = {"default": ()} if args.no_process_mode else {"default": (),
                                                                     "process_mode": ("job.execution_mode=process",)}
            for name, overrides in variants.items():
                case = concurrency_case(root / f"c-{name}", records, args, *overrides)
                results[f"concurrency_{name}"] = case
                print(f"  {name}: achieved concurrency {case['achieved_concurrency']} of {args.concurrency} "
                      f"(ratio {case['concurrency_ratio']}), LLM phase {case['llm_phase_s']} s (ideal "
                      f"{case['ideal_phase_s']} s), {case['calls']} calls = "
                      f"{case['calls_over_minimum']} x the minimum "
                      f"{case['minimum_calls']} {case['calls_by_kind']}", flush=True)
            print(f"overhead: {args.overhead_agents * args.overhead_items_per_agent} items of {args.overhead_agents} "
                  f"agents, batches of {args.overhead_max_items}, instant provider", flush=True)
            overhead = overhead_case(root / "overhead", args)
            results["overhead"] = overhead
            print(f"  bare read+parse+key_by+count job {overhead['bare_s']} s, "
                  f"flink-memory {overhead['flink_memory_s']} s:"
                  f" ratio bare / flink-memory {overhead['bare_over_ours']}; {overhead['calls']} calls = "
                  f"{overhead['calls_over_minimum']} x the minimum {overhead['minimum_calls']} "
                  f"{overhead['calls_by_kind']}",
                  flush=True)
        if args.embeddings or args.only_embeddings:
            print(f"embeddings: the overhead workload with {embedder_name(args)} off and on, {args.pairs} pairs",
                  flush=True)
            case = embeddings_case(root / "embeddings", args)
            results["embeddings"] = case
            print(f"  on / off: median {case['on_over_off_median']}x (pairs {case['on_over_off_range'][0]} to "
                  f"{case['on_over_off_range'][1]}); rows without a vector at the end "
                  f"{case['rows_without_vector_at_end']} of {case['rows']}; the model alone embeds "
                  f"{case['passages_per_s_per_core']} passages/s per core", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
