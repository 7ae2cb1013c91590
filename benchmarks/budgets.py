"""How much of the context window flink-memory uses, against a one-request-per-agent baseline.

A stand-in provider counts tokens as characters / 4 (close to real BPE on English), refuses a prompt + max_tokens
above its window with HTTP 400 (as llama.cpp does) and has no /tokenize, so the job counts with its
calibrated estimate. The workload: many agents, items of mixed size (one or two sentences, dated over
several days) and one huge item of 900 sentences: about 1 000 items and 50 000 tokens by default. The baseline
puts all of an agent's items in one request
with the same prompt format; it is counted, not sent, when it does not fit.

    python benchmarks/budgets.py                       # 6 agents x 167 items, window 2048, output 256
    python benchmarks/budgets.py --agents 2 --items-per-agent 100 --json out/budgets.json
    python benchmarks/budgets.py --runs 10             # the same input 10 times: the spread of calls across runs
    python benchmarks/budgets.py --runs 10 --shape mixed   # the same volume, interleaved, the huge item first

With --runs, each run starts from nothing (no journal) with another provider latency (each answer delayed at
random, up to 0, 0.2 or 0.5 s) and, every other run, two subtasks: the same input must send the same requests
(docs/token-budgets.md), so the spread of calls and prompt tokens across runs is 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import batch_units, execute, write_lines  # noqa: E402
from scripted_server import Reply, ScriptedServer, chars_per_token, fact_keeping_summary, prompt_count  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.flink.pipeline import build_job  # noqa: E402
from flink_memory.ids import UnitId  # noqa: E402
from flink_memory.llm.runtime import read_stats  # noqa: E402
from flink_memory.outputs import read_outputs  # noqa: E402
from flink_memory.summarize.batching import unit_entry  # noqa: E402
from flink_memory.summarize.prompts import messages_for, request_purpose  # noqa: E402

COUNT = chars_per_token(4)
SUBJECTS = ["Alice", "Bob", "the Lisbon office", "project Orion", "the billing team", "Dana", "the vendor"]
VERBS = ["moved the review to", "paid the invoice on", "asked for a refund on", "approved the budget on",
         "reported an outage on", "signed the contract on"]


def sentence(rng: random.Random, day: int) -> str:
    return (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} 2026-03-{day:02d} for {rng.randint(10, 9999)} EUR, "
            f"reference {rng.randint(100000, 999999)}.")


LLAMAINDEX = {"calls": 42, "prompt_tokens": 52962}  # TreeSummarize on the default workload (issue 33; not run here)


def mixed(agents: int, items_per_agent: int, huge_sentences: int, seed: int = 5) -> list[dict[str, Any]]:
    """The same volume in another shape: agents' items interleaved at random as they would arrive, of one or
    two sentences, and agent 0's first item the huge one, so it is batched before any batch has reported."""
    rng = random.Random(seed)
    queues = []
    for a in range(agents):
        items = []
        for i in range(items_per_agent):
            day = 1 + i * 28 // items_per_agent
            size = huge_sentences if (a == 0 and i == 0) else rng.choice([1, 1, 1, 2])
            items.append({"agent_id": f"agent-{a}", "id": f"m{i}", "ts": f"2026-03-{day:02d}T{8 + i % 10:02d}:00:00Z",
                          "text": " ".join(sentence(rng, day) for _ in range(size))})
        queues.append(items[::-1])
    records = []
    while any(queues):
        records.append(rng.choice([q for q in queues if q]).pop())
    return records


def dataset(agents: int, items_per_agent: int, huge_sentences: int, seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for a in range(agents):
        for i in range(items_per_agent):
            day = 1 + i * 28 // items_per_agent
            huge = a == 0 and i == items_per_agent // 2
            size = huge_sentences if huge else rng.choice([1, 1, 1, 2])
            text = " ".join(sentence(rng, day) for _ in range(size))
            records.append({"agent_id": f"agent-{a}", "id": f"m{i}",
                            "ts": f"2026-03-{day:02d}T{8 + i % 10:02d}:00:00Z", "text": text})
    return records


def baseline(records: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """One request per agent holding all its items, counted as the provider counts it."""
    sizes = []
    for agent in sorted({r["agent_id"] for r in records}):
        entries = [unit_entry({"text": r["text"], "ts": r["ts"]}) for r in records if r["agent_id"] == agent]
        sizes.append(prompt_count(messages_for("batch", entries, args.max_output_tokens), COUNT))
    over = sum(1 for s in sizes if s + args.max_output_tokens > args.context_window)
    return {"calls": len(sizes), "prompt_tokens": sum(sizes), "largest_prompt": max(sizes), "over_window": over}


def late(max_delay_s: float, seed: int) -> Any:
    """The stand-in summarizer, answering each call after a random delay of up to `max_delay_s`."""
    rng, lock = random.Random(seed), threading.Lock()

    def script(body: dict[str, Any]) -> Reply:
        with lock:
            delay = rng.uniform(0, max_delay_s)
        return Reply(text=fact_keeping_summary(body, COUNT), delay_s=delay)

    return script


def flink_memory(records: list[dict[str, Any]], args: argparse.Namespace, workdir: Path, max_delay_s: float = 0.0,
                 parallelism: int = 1, seed: int = 0) -> dict[str, Any]:
    with ScriptedServer(late(max_delay_s, seed), count=COUNT, context_window=args.context_window) as server:
        config = load_config(None, [
            "llm.provider=openai", f"llm.base_url={server.base_url}", f"llm.context_window={args.context_window}",
            f"llm.max_output_tokens={args.max_output_tokens}", f"batching.max_items={args.max_items}",
            "journal.path=null", "checkpointing.interval_s=0", "job.poll_interval_ms=20",
            f"job.parallelism={parallelism}", "batching.flush_after_s=3600",
            "summarization.global_refresh_s=3600"], environ={})
        input_path = write_lines(workdir / "input" / "part-0.jsonl", records)
        output = workdir / "output"
        started = time.perf_counter()
        execute(build_job(config, str(input_path), str(output)), "bench-budgets", timeout_s=args.job_timeout_s)
        wall = time.perf_counter() - started
        sent = [b for b in server.requests if b not in server.rejected]
        sizes = [prompt_count(b["messages"], COUNT) for b in sent]
        over = sum(1 for b, s in zip(sent, sizes) if s + b["max_tokens"] > args.context_window)
        rejected = len(server.rejected)
    nodes = read_outputs(str(output))["summaries"]
    stats = read_stats(str(output))
    covered = batch_units(nodes)
    sources = {(agent, UnitId.parse(unit).record) for agent, unit in covered}
    if any(n != 1 for n in covered.values()) or sources != {(r["agent_id"], r["id"]) for r in records}:
        raise SystemExit("coverage broken: a record is missing from the batch nodes or a unit is in two")
    units = len(covered)
    # the prompt budget of a summary request, as the provider counts: window - max_tokens
    budget = args.context_window - args.max_output_tokens
    summary_sizes = [s for b, s in zip(sent, sizes) if "response_format" not in b]
    by_kind: dict[str, list[int]] = {}
    for body, size in zip(sent, sizes):
        kind = request_purpose(body["messages"]) or "plan"
        calls, tokens = by_kind.setdefault(kind, [0, 0])
        by_kind[kind] = [calls + 1, tokens + size]
    return {"calls": len(sent), "prompt_tokens": sum(sizes), "largest_prompt": max(sizes),
            "largest_over_budget": max(summary_sizes) / budget, "over_window": over, "rejected": rejected,
            "calls_by_kind": {k: sum(1 for n in nodes if n["kind"] == k) for k in ("batch", "merge", "global")},
            "requests_by_kind": {k: {"calls": c, "prompt_tokens": t} for k, (c, t) in sorted(by_kind.items())},
            "truncated": int(stats.get("truncated", 0)), "wall_s": wall, "units": units,
            "first_report_wait_s": stats.get("first_report_wait_ms", 0) / 1000,
            "max_first_report_wait_s": stats.get("max_first_report_wait_ms", 0) / 1000,
            "requests": sorted(json.dumps(b, sort_keys=True) for b in sent)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--items-per-agent", type=int, default=167)
    parser.add_argument("--huge-sentences", type=int, default=900)
    parser.add_argument("--context-window", type=int, default=2048)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--max-items", type=int, default=50)
    parser.add_argument("--job-timeout-s", type=float, default=3600)
    parser.add_argument("--runs", type=int, default=1, help="runs of the same input (latency and subtasks varied)")
    parser.add_argument("--shape", choices=["even", "mixed"], default="even",
                        help="even: agent after agent, the huge item in the middle; mixed: see mixed()")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.shape == "mixed":
        records = mixed(args.agents, args.items_per_agent, args.huge_sentences)
    else:
        records = dataset(args.agents, args.items_per_agent, args.huge_sentences)
    if args.runs > 1:
        return repeated(records, args)
    base = baseline(records, args)
    with tempfile.TemporaryDirectory() as tmp:
        ours = flink_memory(records, args, Path(tmp))
    del ours["requests"]  # (compared across runs only: --runs)
    ratios = {"calls_over_baseline": ours["calls"] / base["calls"],
              "prompt_tokens_over_baseline_input": ours["prompt_tokens"] / base["prompt_tokens"],
              "largest_request_over_budget": ours["largest_over_budget"]}
    results = {"workload": {"agents": args.agents, "items_per_agent": args.items_per_agent,
                            "huge_sentences": args.huge_sentences, "context_window": args.context_window,
                            "max_output_tokens": args.max_output_tokens},
               "baseline": base, "flink_memory": ours, "ratios": ratios}
    window = args.context_window
    print(f"{args.agents} agents x {args.items_per_agent} items (one of {args.huge_sentences} sentences), "
          f"window {window}, output {args.max_output_tokens}, provider counts chars/4\n")
    print("| run | calls | prompt tokens | largest prompt / window | requests over the window |")
    print("|---|---|---|---|---|")
    print(f"| one request per agent (all items) | {base['calls']} | {base['prompt_tokens']} | "
          f"{base['largest_prompt'] / window:.2f} | {base['over_window']} of {base['calls']} |")
    print(f"| flink-memory | {ours['calls']} | {ours['prompt_tokens']} | {ours['largest_prompt'] / window:.2f} | "
          f"{ours['over_window']} (provider refused {ours['rejected']}) |")
    print(f"\nflink-memory / baseline: calls {ratios['calls_over_baseline']:.2f}x, prompt tokens "
          f"{ratios['prompt_tokens_over_baseline_input']:.2f}x the single-request input; largest summary request "
          f"{ratios['largest_request_over_budget']:.2f} of the prompt budget (window - max_tokens); nodes "
          f"{ours['calls_by_kind']}, {ours['truncated']} truncated, {ours['units']} units, {ours['wall_s']:.0f} s")
    print("requests by kind (calls / prompt tokens): " + ", ".join(
        f"{kind} {v['calls']} / {v['prompt_tokens']}" for kind, v in ours["requests_by_kind"].items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def repeated(records: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """The same input `--runs` times from nothing, each with another latency and every other one on two
    subtasks: the requests of every run, and their spread."""
    delays = [0.0, 0.2, 0.5]
    runs = []
    for run in range(args.runs):
        delay, parallelism = delays[run % len(delays)], 1 + run % 2
        with tempfile.TemporaryDirectory() as tmp:
            ours = flink_memory(records, args, Path(tmp), delay, parallelism, seed=run)
        runs.append({"run": run + 1, "max_delay_s": delay, "parallelism": parallelism,
                     **{k: v for k, v in ours.items() if k != "requests"}, "requests": ours["requests"]})
        print(f"run {run + 1}: {ours['calls']} calls, {ours['prompt_tokens']} prompt tokens, {ours['wall_s']:.0f} s",
              file=sys.stderr)
    calls = [r["calls"] for r in runs]
    tokens = [r["prompt_tokens"] for r in runs]
    distinct = len({tuple(r["requests"]) for r in runs})
    shape = f"{args.agents} agents x {args.items_per_agent} items ({args.shape})"
    print(f"{shape} ({len(records)} items, one of {args.huge_sentences} sentences), window {args.context_window}, "
          f"output {args.max_output_tokens}, provider counts chars/4, {args.runs} runs from nothing\n")
    print("| run | answers delayed up to | subtasks | calls | prompt tokens | largest prompt / window | refused "
          "| wall | held for first reports (longest) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['run']} | {r['max_delay_s']} s | {r['parallelism']} | {r['calls']} | {r['prompt_tokens']} | "
              f"{r['largest_prompt'] / args.context_window:.2f} | {r['rejected']} | {r['wall_s']:.1f} s | "
              f"{r['max_first_report_wait_s']:.2f} s |")
    print(f"\ncalls {min(calls)} to {max(calls)} (spread {max(calls) - min(calls)}), prompt tokens {min(tokens)} to "
          f"{max(tokens)} (spread {max(tokens) - min(tokens)}); {distinct} distinct set(s) of requests in "
          f"{args.runs} runs; every run <= {LLAMAINDEX['calls']} calls: {max(calls) <= LLAMAINDEX['calls']}, "
          f"fewer prompt tokens than LlamaIndex's {LLAMAINDEX['prompt_tokens']}: "
          f"{max(tokens) < LLAMAINDEX['prompt_tokens']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": [{k: v for k, v in r.items() if k != "requests"} for r in runs],
                                         "calls_spread": max(calls) - min(calls),
                                         "prompt_tokens_spread": max(tokens) - min(tokens),
                                         "distinct_request_sets": distinct}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
