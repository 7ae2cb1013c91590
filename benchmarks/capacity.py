"""CPU cost of each part of the pipeline per item, and of recall per request: the figures of the capacity page.

The job's workload of `throughput.py` (items of many agents, batches of 50, an instant provider) runs through
the stage cores in memory (flink_memory.local: the topology without Flink, so each part is timed alone), then
into a SQLite store as the applier writes it. Each part is CPU time of this process (`time.process_time`) over
the items: reading a line as the bare job does (`json.loads`, the baseline every part is a ratio of), parsing
and validating it, each stage's core, the store's writes with the default model's vectors, the model alone,
and recall (keyword and hybrid) on the store. What Flink adds (serialization, timers, state backend, sinks) is
the rest of `throughput.py`'s whole-job figure.

    python benchmarks/capacity.py                     # 20 000 items of 100 agents
    python benchmarks/capacity.py --items 2000 --json out/capacity.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jobkit import items  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for  # noqa: E402
from flink_memory.local import LocalPipeline, LocalStage  # noqa: E402
from flink_memory.records import MemoryUnit, SummaryNode, parse_line  # noqa: E402
from flink_memory.requests import ChatRequest, ChatResult  # noqa: E402
from flink_memory.store import open_store  # noqa: E402


def instant(request: ChatRequest) -> ChatResult:
    """A provider that answers at once with a short summary."""
    return ChatResult(text=f"Summary of {len(request.messages[-1][1])} characters.", prompt_tokens=100,
                      completion_tokens=8, model="instant")


def cpu(call: Callable[[], Any]) -> float:
    started = time.process_time()
    call()
    return time.process_time() - started


def timed_stages(pipeline: LocalPipeline) -> dict[str, float]:
    """CPU seconds spent in each stage's activations (the core and its state, not the runner)."""
    spent: dict[str, float] = defaultdict(float)
    for stage in pipeline.stages:
        activate = stage.activate

        def timed(*args: Any, _stage: LocalStage = stage, _activate: Any = activate, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return _activate(*args, **kwargs)
            finally:
                spent[_stage.name] += time.process_time() - started

        stage.activate = timed  # type: ignore[method-assign]
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--recalls", type=int, default=500)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    config = load_config(None, ["batching.max_items=50"], environ={})
    lines = [json.dumps(r) for r in items(args.agents, args.items // args.agents)]
    n = len(lines)
    costs: dict[str, float] = {}
    costs["read (json.loads: the baseline)"] = cpu(lambda: [json.loads(line) for line in lines]) / n
    costs["parse and validate"] = cpu(lambda: [parse_line(line) for line in lines]) / n
    pipeline = LocalPipeline(config, instant)
    spent = timed_stages(pipeline)
    pipeline.feed(*lines).end()
    for name, seconds in spent.items():
        costs[f"stage: {name}"] = seconds / n
    units = [MemoryUnit(agent_id=r["agent_id"], unit_id=r["id"], source_id=r["id"], text=r["text"], ts=r["ts"])
             for r in map(json.loads, lines)]
    nodes = [SummaryNode.model_validate(node) for node in pipeline.summaries]
    embedder = embedder_for(config.embeddings)
    assert embedder is not None
    with tempfile.TemporaryDirectory() as tmp:
        location = str(Path(tmp) / "memory.sqlite")
        with open_store(location, create=True) as store:
            costs["store: write (no vectors)"] = cpu(lambda: (store.upsert_units(units), store.upsert(nodes))) / n
        with open_store(str(Path(tmp) / "vectors.sqlite"), create=True, embedder=embedder) as store:
            costs["store: write with vectors (e5-static)"] = cpu(
                lambda: (store.upsert_units(units), store.upsert(nodes))) / n
        texts = [u.text for u in units]
        fresh = embedder_for(config.embeddings)
        assert fresh is not None
        costs["embedding alone (e5-static, per passage)"] = cpu(lambda: fresh.passages(texts)) / n
        rng = random.Random(5)
        questions = [" ".join(rng.sample(u.text.split(), 3)) for u in rng.sample(units, args.recalls)]
        agents = [f"agent-{rng.randrange(args.agents)}" for _ in questions]
        per_request: dict[str, float] = {}
        with open_store(str(Path(tmp) / "vectors.sqlite"), embedder=embedder) as store:
            for mode in ("keyword", "hybrid"):
                for agent in set(agents):  # (each reader loads an agent's vectors once)
                    store.recall(agent, "warm up", mode=mode)
                per_request[f"recall: {mode}"] = cpu(
                    lambda mode=mode: [store.recall(a, q, k=5, mode=mode) for a, q in zip(agents, questions)]
                ) / len(questions)
    baseline = costs["read (json.loads: the baseline)"]
    calls = pipeline.calls()
    print(f"{n} items of {args.agents} agents, {calls} LLM calls ({calls / n:.3f} per item), an instant provider")
    print(f"{'part':45s} {'us of CPU per item':>20s} {'x the baseline':>15s}")
    for name, seconds in costs.items():
        print(f"{name:45s} {seconds * 1e6:20.1f} {seconds / baseline:15.1f}")
    core = sum(v for k, v in costs.items() if k.startswith(("parse", "stage:")))
    print(f"{'the cores together (parse and stages)':45s} {core * 1e6:20.1f} {core / baseline:15.1f}")
    for name, seconds in per_request.items():
        print(f"{name:45s} {seconds * 1e6:20.1f} us of CPU per request")
    if args.json:
        Path(args.json).write_text(json.dumps({"items": n, "agents": args.agents, "calls": calls,
                                               "per_item_s": costs, "per_request_s": per_request}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
