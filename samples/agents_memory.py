"""A Flink Agents agent that remembers through flink-memory, in one Flink job (docs/flink-agents.md).

The agent (flink_memory.agents.example.RememberingAgent: fixed rules, no LLM) reads users' turns from a
followed directory, keyed by agent; the statements it decides to remember go, keyed by agent, into flink-memory's
operators in the same job, which summarize them (the bundled SmolLM2, or --set llm.base_url=...) into the store;
the questions it gets later are answered by recall from that store, through its vector store. Prints what the
agent remembered (units and batch nodes in the store) and what it recalled, then stops the job.

    make agents-sample        # or: .venv-agents/bin/python samples/agents_memory.py --output out/agents-sample
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flink_memory.agents.example import RememberingAgent, decide
from flink_memory.agents.pipeline import add_agent_memory
from flink_memory.cli.run import Applier, end_local_jvm
from flink_memory.config import load_config
from flink_memory.flink.pipeline import create_environment, file_sink, file_source
from flink_memory.llm.llamacpp import start_local_model
from flink_memory.store import open_store

TURNS = [
    {"agent_id": "ana", "id": "t1", "ts": "2026-03-02T09:00:00Z",
     "text": "Hi!"},
    {"agent_id": "ana", "id": "t2", "ts": "2026-03-02T09:01:00Z",
     "text": "My daughter Lea starts school in Porto in September."},
    {"agent_id": "ana", "id": "t3", "ts": "2026-03-02T09:02:00Z",
     "text": "I am allergic to peanuts and to shellfish."},
    {"agent_id": "ana", "id": "t4", "ts": "2026-03-02T09:03:00Z",
     "text": "Thanks, that helps."},
    {"agent_id": "ana", "id": "t5", "ts": "2026-03-02T09:04:00Z",
     "text": "Our team meeting moved to Thursdays at 10:30."},
    {"agent_id": "ben", "id": "t1", "ts": "2026-03-02T10:00:00Z",
     "text": "I drive a blue Volvo from 2019."},
    {"agent_id": "ben", "id": "t2", "ts": "2026-03-02T10:01:00Z",
     "text": "ok"},
    {"agent_id": "ben", "id": "t3", "ts": "2026-03-02T10:02:00Z",
     "text": "My landlord Mr. Okafor raised the rent to 1,200 EUR."},
    {"agent_id": "ben", "id": "t4", "ts": "2026-03-02T10:03:00Z",
     "text": "I run the Berlin half marathon on April 5."},
]
QUESTIONS = [
    {"agent_id": "ana", "id": "q1", "text": "Which foods must I avoid?"},
    {"agent_id": "ben", "id": "q1", "text": "Which car do I drive?"},
    # ana's question, asked by ben: nothing of hers comes back
    {"agent_id": "ben", "id": "q2", "text": "Which foods must I avoid?"},
]
SETTINGS = ["batching.max_items=2", "batching.flush_after_s=2", "summarization.global_refresh_s=2",
            "checkpointing.interval_s=2", "llm.max_output_tokens=120", "journal.path=null", "job.parallelism=1"]


def publish(inbox: Path, name: str, turns: list[dict]) -> None:
    """A new file in the followed directory, whole at once (hidden while written)."""
    tmp = inbox / f".{name}"
    tmp.write_text("".join(json.dumps(t) + "\n" for t in turns))
    tmp.rename(inbox / name)


def outcomes(output: Path) -> list[dict]:
    """What the agent did, as committed so far (the file sink commits on checkpoints)."""
    return [json.loads(line) for path in sorted((output / "agent-outcomes").rglob("*.jsonl"))
            if not path.name.startswith(".") for line in path.read_text().splitlines() if line.strip()]


def at_least(found: list[dict], count: int) -> list[dict] | None:
    return found if len(found) >= count else None


def wait(what: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(1)
    return None


def remembered(store_url: str, expected: dict[str, set[str]]) -> dict[str, list[tuple[str, str, str | None]]] | None:
    """Each agent's units (id, text, batch node), once every expected unit is committed in a batch node."""
    try:
        with open_store(store_url) as store:
            found = {agent: [(u.unit_id, u.text, batch) for u, batch in store.units(agent)] for agent in expected}
    except Exception:  # noqa: BLE001 - (the job has not created the store yet)
        return None
    done = all({uid for uid, _, batch in units if batch} >= expected[agent] for agent, units in found.items())
    return found if done else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="out/agents-sample")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the summaries")
    args = parser.parse_args()
    started = time.monotonic()
    root = Path(args.output).resolve()
    shutil.rmtree(root, ignore_errors=True)
    inbox, output = root / "inbox", root / "output"
    inbox.mkdir(parents=True)
    config = load_config(None, SETTINGS + args.overrides)
    model = start_local_model(config)  # the bundled model for the summaries, unless llm.base_url is set
    if model is not None:
        print(f"[sample] the bundled model {model.model_path.name} on {model.base_url}", file=sys.stderr)
    store_url = config.store.location(str(output))
    env = create_environment(config, str(output))
    streams = add_agent_memory(env, file_source(env, str(inbox), follow=True), RememberingAgent(store_url),
                               config, str(output))
    streams.outcomes.sink_to(file_sink(str(output / "agent-outcomes"), "outcomes")).uid("agent-outcomes-sink")
    publish(inbox, "turns-1.jsonl", TURNS)
    client = env.execute_async("agent-memory-sample")
    applier = Applier(store_url, str(output), config)
    try:
        acting = sum(decide(t["text"]) != "skip" for t in TURNS)  # (small talk gets no output)
        acted = wait(lambda: at_least(outcomes(output), acting), args.timeout)
        if acted is None:
            print(f"the agent's decisions were not committed within {args.timeout:g} s", file=sys.stderr)
            return 1
        print(f"[sample] {time.monotonic() - started:.0f} s: the agent's decisions committed", file=sys.stderr)
        decided = {(o["agent_id"], o["turn"]): o["decision"] for o in acted}
        for turn in TURNS:
            print(f"{turn['agent_id']} said {turn['text']!r}: {decided.get((turn['agent_id'], turn['id']), 'let go')}")
        expected = {agent: {turn for (a, turn), d in decided.items() if a == agent and d == "remember"}
                    for agent in sorted({t["agent_id"] for t in TURNS})}
        found = wait(lambda: remembered(store_url, expected), args.timeout)
        if found is None:
            print(f"the summaries were not in the store within {args.timeout:g} s", file=sys.stderr)
            return 1
        print(f"[sample] {time.monotonic() - started:.0f} s: its memory summarized into the store", file=sys.stderr)
        for agent, units in found.items():
            print(f"remembered by {agent} (memory units in the store, and the batch node of each):")
            for uid, text, batch in units:
                print(f"  {uid:4} {batch or '-':13} {text}")
        publish(inbox, "turns-2.jsonl", QUESTIONS)
        asked = {(q["agent_id"], q["id"]) for q in QUESTIONS}
        answers = wait(lambda: at_least([o for o in outcomes(output) if o["decision"] == "recall"
                                         and (o["agent_id"], o["turn"]) in asked], len(asked)), 300)
        if answers is None:
            print("the agent's answers were not committed within 300 s", file=sys.stderr)
            return 1
        for answer in sorted(answers, key=lambda o: (o["agent_id"], o["turn"])):
            print(f"{answer['agent_id']} asked {answer['question']!r}; recalled:")
            for hit in answer["recalled"] or [{"kind": "-", "id": "-", "text": "(nothing of its own memory)"}]:
                print(f"  {hit['kind']:6} {hit['id']:13} {hit['text'][:90]}")
    finally:
        client.cancel().result()
        applier.stop()
        # the cancelled job's workers (in the JVM) hold connections to the model's port: end the JVM first,
        # then the model's server, whose destructor waits for its connections
        took = end_local_jvm()
        if model is not None:
            model.close()
        print(f"[sample] {time.monotonic() - started:.0f} s: stopped the job, its JVM ({took:.1f} s) and the model",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
