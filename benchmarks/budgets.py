"""How much of the context window flink-memory uses, against a one-request-per-agent baseline.

A stand-in provider counts tokens as characters / 4 (close to real BPE on English), refuses a prompt + max_tokens
above its window with HTTP 400 (as llama.cpp does) and has no /tokenize, so the job counts with its
calibrated estimate. The workload: many agents, items of mixed size (one or two sentences, dated over
several days) and one huge item of 900 sentences: about 1 000 items and 50 000 tokens by default. The baseline
puts all of an agent's items in one request
with the same prompt format; it is counted, not sent, when it does not fit.

    python benchmarks/budgets.py                       # 6 agents x 167 items, window 2048, output 256
    python benchmarks/budgets.py --agents 2 --items-per-agent 100 --json out/budgets.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import batch_units, execute, write_lines  # noqa: E402
from scripted_server import ScriptedServer, chars_per_token, prompt_count  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.flink.pipeline import build_job  # noqa: E402
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


def flink_memory(records: list[dict[str, Any]], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with ScriptedServer(count=COUNT, context_window=args.context_window) as server:
        config = load_config(None, [
            "llm.provider=openai", f"llm.base_url={server.base_url}", f"llm.context_window={args.context_window}",
            f"llm.max_output_tokens={args.max_output_tokens}", f"batching.max_items={args.max_items}",
            "journal.path=null", "checkpointing.interval_s=0", "job.poll_interval_ms=20",
            "batching.flush_after_s=3600", "summarization.global_refresh_s=3600"], environ={})
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
    sources = {(agent, unit.split("#")[0]) for agent, unit in covered}
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
            "truncated": int(stats.get("truncated", 0)), "wall_s": wall, "units": units}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--items-per-agent", type=int, default=167)
    parser.add_argument("--huge-sentences", type=int, default=900)
    parser.add_argument("--context-window", type=int, default=2048)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--max-items", type=int, default=50)
    parser.add_argument("--job-timeout-s", type=float, default=3600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    records = dataset(args.agents, args.items_per_agent, args.huge_sentences)
    base = baseline(records, args)
    with tempfile.TemporaryDirectory() as tmp:
        ours = flink_memory(records, args, Path(tmp))
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


if __name__ == "__main__":
    sys.exit(main())
