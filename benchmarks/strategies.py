"""Memory strategies compared on the same data and the same provider: cost, request size, fact retention.

- single-pass: all of an agent's items in one request (what Apache Flink Agents' compaction did). Once
  the request would exceed the context window it is not sent and the strategy is reported as failed.
- batched: the flink-memory job with `summarization.depth: single` (batch summaries, no tree; its memory is
  all batch summaries, though the job also makes a global from them).
- hierarchical: the flink-memory job as shipped (batch summaries merged into a global summary per agent).

Each item plants facts (a unique name and a unique amount, beside a date); retention is the share of planted
facts still present in the strategy's final summaries (the global summary, all batch summaries, or the
single-pass answer), and "final memory / window" is the size of those summaries (per agent) against the
context window: what an agent would have to read back.
Providers: `scripted` (a fact-keeping stand-in with fixed latency, CI-sized), `embedded` (the bundled
SmolLM2 on this CPU), or `--base-url URL` for any OpenAI-compatible endpoint.

    python benchmarks/strategies.py --sizes 100 1000 10000 --out out/bench-strategies
    python benchmarks/strategies.py --provider embedded --sizes 20 --agents 1 --out out/bench-embedded

Writes results.json, results.md and cost_vs_items.png / retention_vs_items.png into --out.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import execute, write_lines  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.flink.pipeline import build_job  # noqa: E402
from flink_memory.llm.chat_client import LLMClient  # noqa: E402
from flink_memory.llm.runtime import read_stats  # noqa: E402
from flink_memory.outputs import latest_globals, read_outputs  # noqa: E402
from flink_memory.requests import LLMCallError, RequestFactory  # noqa: E402
from flink_memory.summarize.batching import unit_entry  # noqa: E402
from flink_memory.summarize.prompts import SUMMARY_PROMPT_VERSION, messages_for  # noqa: E402
from flink_memory.tokens.budget import RequestTooLarge  # noqa: E402
from flink_memory.tokens.estimate import estimate_messages, estimate_tokens  # noqa: E402

STRATEGIES = ("single_pass", "batched", "hierarchical")
SYLLABLES = ["ka", "to", "mi", "rel", "an", "so", "vi", "da", "lor", "en", "ti", "ba", "nu", "qua", "ze"]
ACTIONS = ["paid", "was refunded", "approved a budget of", "quoted", "invoiced"]


def fact_name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(5)).capitalize()


def dataset(agents: int, items_per_agent: int, seed: int = 7) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Items with planted facts, and the facts per agent. Names and amounts are unique across the data set,
    so a fact found in a summary was kept, not re-created by a lookalike from another item."""
    rng = random.Random(seed)
    total = agents * items_per_agent
    amounts = iter(rng.sample(range(100_000, 10_000_000), total))
    names: set[str] = set()
    records, facts = [], {}
    for a in range(agents):
        agent = f"agent-{a}"
        facts[agent] = []
        for i in range(items_per_agent):
            name = fact_name(rng)
            while name in names:
                name = fact_name(rng)
            names.add(name)
            amount = str(next(amounts))
            date = f"20{rng.randint(20, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            text = (f"Note {i}: {name} {rng.choice(ACTIONS)} {amount} EUR on {date}; "
                    f"the team discussed follow-ups and routine status updates.")
            records.append({"agent_id": agent, "id": f"n{i}", "ts": f"{date}T12:00:00Z", "text": text})
            facts[agent] += [name, amount]
    return records, facts


def retention(texts: list[str], facts: list[str]) -> float:
    joined = "\n".join(texts)
    return sum(1 for fact in facts if fact in joined) / len(facts) if facts else 0.0


@contextmanager
def provider(kind: str, base_url: str | None, latency_s: float, context_window: int) -> Iterator[str]:
    """The base URL of the chosen provider, started for the duration of the benchmark when it is local."""
    if base_url:
        yield base_url
    elif kind == "scripted":
        with ScriptedServer(latency_s=latency_s) as server:
            yield server.base_url
    else:
        from flink_memory.llm.llamacpp import EmbeddedServer

        server = EmbeddedServer(context_window=context_window, parallel=2, threads=2)
        try:
            yield server.base_url + "/v1"
        finally:
            server.close()


def settings(base_url: str, args: argparse.Namespace) -> list[str]:
    return ["llm.provider=openai", f"llm.base_url={base_url}", f"llm.model={args.model}",
            f"llm.context_window={args.context_window}", f"llm.max_output_tokens={args.max_output_tokens}",
            f"llm.max_concurrency={args.concurrency}", f"batching.max_items={args.max_items}",
            f"summarization.fan_in={args.fan_in}", "journal.path=null", "checkpointing.interval_s=0",
            "job.poll_interval_ms=20", "llm.timeout_s=900"]


def add_job_arguments(parser: argparse.ArgumentParser, latency_s: float) -> None:
    """The provider and the job settings (see `settings`), shared by the benchmarks that run the job."""
    parser.add_argument("--provider", choices=["scripted", "embedded"], default="scripted")
    parser.add_argument("--base-url", help="any OpenAI-compatible endpoint (overrides --provider)")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--latency", type=float, default=latency_s, help="scripted provider latency per call (s)")
    parser.add_argument("--context-window", type=int, default=8192)
    parser.add_argument("--max-output-tokens", type=int, default=384)
    parser.add_argument("--max-items", type=int, default=50)
    parser.add_argument("--fan-in", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--job-timeout-s", type=float, default=3600)


def usage(stats: dict[str, float]) -> dict[str, int]:
    """Calls and tokens paid."""
    return {key: int(stats.get(key, 0)) for key in ("calls", "prompt_tokens", "completion_tokens")}


def single_pass(records: list[dict[str, Any]], facts: dict[str, list[str]], base_url: str,
                args: argparse.Namespace) -> dict[str, Any]:
    config = load_config(None, settings(base_url, args), environ={})
    factory = RequestFactory.from_config(config.llm)
    client = LLMClient(config.llm, base_url)
    started = time.perf_counter()
    answers, failures, largest = {}, [], 0
    for agent in facts:
        entries = [unit_entry({"unit_id": r["id"], "ts": r["ts"], "text": r["text"]})
                   for r in records if r["agent_id"] == agent]
        messages = messages_for("batch", entries, config.llm.max_output_tokens)
        size = estimate_messages(messages) + config.llm.max_output_tokens
        largest = max(largest, size)
        try:
            answers[agent] = client.complete(factory.build(messages, prompt_version=SUMMARY_PROMPT_VERSION)).text
        except (RequestTooLarge, LLMCallError) as exc:
            failures.append(f"{agent}: {exc}")
    stats = client.stats.snapshot()
    client.close()
    kept = [retention([answers[a]], f) if a in answers else 0.0 for a, f in facts.items()]
    return {**usage(stats), "largest_request": largest,
            "wall_s": time.perf_counter() - started, "retention": sum(kept) / len(kept),
            "failed": bool(failures), "failure": failures[0] if failures else None,
            "memory_tokens": max((estimate_tokens(t) for t in answers.values()), default=0)}


def job_strategy(records: list[dict[str, Any]], facts: dict[str, list[str]], base_url: str,
                 args: argparse.Namespace, depth: str, workdir: Path) -> dict[str, Any]:
    input_path = write_lines(workdir / f"{depth}-input" / "part-0.jsonl", records)
    output = workdir / f"{depth}-output"
    config = load_config(None, settings(base_url, args) + [f"summarization.depth={depth}"], environ={})
    started = time.perf_counter()
    execute(build_job(config, str(input_path), str(output)), f"bench-{depth}", timeout_s=args.job_timeout_s)
    wall = time.perf_counter() - started
    nodes = read_outputs(str(output))["summaries"]
    stats = read_stats(str(output))
    if depth == "hierarchical":
        finals = {a: [n["text"]] for a, n in latest_globals(nodes).items()}
    else:
        finals = {a: [n["text"] for n in nodes if n["agent_id"] == a and n["kind"] == "batch"] for a in facts}
    kept = [retention(finals.get(a, []), f) for a, f in facts.items()]
    covered = sum(len(n["children"]) for n in nodes if n["kind"] == "batch")
    if covered != len(records):
        raise SystemExit(f"{depth}: {covered} of {len(records)} items in batch nodes")
    return {**usage(stats), "largest_request": int(stats.get("max_prompt_tokens", 0)) + args.max_output_tokens,
            "wall_s": wall, "retention": sum(kept) / len(kept), "failed": False, "failure": None,
            "memory_tokens": max(sum(estimate_tokens(t) for t in texts) for texts in finals.values()),
            "merges": sum(1 for n in nodes if n["kind"] == "merge")}


def markdown(results: dict[str, Any]) -> str:
    window = results["context_window"]
    lines = [f"Provider: {results['provider']}, context window {window}, batch {results['max_items']}, "
             f"fan-in {results['fan_in']}, {results['agents']} agent(s).", "",
             "| items/agent | strategy | calls | prompt tokens | completion tokens | largest request / window "
             "| retention | final memory / window | wall s | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        status = "FAILED: " + row["failure"].split(": ", 1)[-1][:70] if row["failed"] else "ok"
        lines.append(f"| {row['items_per_agent']} | {row['strategy']} | {row['calls']} | {row['prompt_tokens']} | "
                     f"{row['completion_tokens']} | {row['largest_request'] / window:.2f} | "
                     f"{row['retention']:.2f} | {row['memory_tokens'] / window:.2f} | {row['wall_s']:.1f} | {status} |")
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for metric, label, name in (("prompt_tokens", "prompt tokens (all calls)", "cost_vs_items.png"),
                                ("retention", "share of planted facts kept", "retention_vs_items.png")):
        figure, axis = plt.subplots(figsize=(6, 4))
        for strategy in STRATEGIES:
            rows = [r for r in results["rows"] if r["strategy"] == strategy]
            sent = [r for r in rows if not r["failed"]]
            axis.plot([r["items_per_agent"] for r in sent], [r[metric] for r in sent], marker="o", label=strategy)
            failed = [r for r in rows if r["failed"]]
            if failed and metric == "prompt_tokens":  # what the request would have needed: never sent
                axis.scatter([r["items_per_agent"] for r in failed], [r["largest_request"] for r in failed],
                             marker="x", color="red", zorder=3, label=f"{strategy}: over the window, not sent")
            elif failed:
                axis.scatter([r["items_per_agent"] for r in failed], [0 for _ in failed], marker="x", color="red",
                             zorder=3, label=f"{strategy}: failed (overflow)")
        if metric == "prompt_tokens":
            axis.set_yscale("log")
        axis.set_xscale("log")
        axis.set_xlabel("items per agent")
        axis.set_ylabel(label)
        axis.set_title(f"{label} ({results['provider']})")
        axis.grid(alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
        made.append(out / name)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--agents", type=int, default=2)
    add_job_arguments(parser, latency_s=0.02)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-strategies")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"provider": args.base_url or args.provider, "context_window": args.context_window,
                               "max_output_tokens": args.max_output_tokens, "max_items": args.max_items,
                               "fan_in": args.fan_in, "agents": args.agents, "rows": []}
    with provider(args.provider, args.base_url, args.latency, args.context_window) as base_url, \
            tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            records, facts = dataset(args.agents, size)
            workdir = Path(tmp) / str(size)
            for strategy in STRATEGIES:
                if strategy == "single_pass":
                    measured = single_pass(records, facts, base_url, args)
                else:
                    depth = "single" if strategy == "batched" else "hierarchical"
                    measured = job_strategy(records, facts, base_url, args, depth, workdir)
                row = {"items_per_agent": size, "strategy": strategy, **measured}
                results["rows"].append(row)
                print(f"[strategies] {size:>6} items/agent  {strategy:<12} calls {row['calls']:>5}  "
                      f"prompt tokens {row['prompt_tokens']:>9}  largest/window "
                      f"{row['largest_request'] / args.context_window:5.2f}  retention {row['retention']:.2f}  "
                      f"{'FAILED (overflow)' if row['failed'] else 'ok'}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(markdown(results))
    if not args.no_plots:
        plots(results, args.out)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
