"""flink-memory's operators inside someone else's PyFlink job.

This job has its own input (support-desk events, not our record format), its own steps before the
memory operators (turn events into memory records) and after them (keep each customer's newest global
summary as a small tuple), and its own sink. Run it with an OpenAI-compatible endpoint:

    python jobs/reuse_example.py --base-url http://127.0.0.1:8080/v1
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pyflink.common import Types
from pyflink.datastream import DataStream, StreamExecutionEnvironment

from flink_memory.config import Config, load_config
from flink_memory.flink.pipeline import add_memory_operators, flink_configuration

EVENTS = [
    {"customer": "acme", "ticket": 1, "at": "2026-03-01T09:00:00Z", "body": "Acme reports login failures since v2.4."},
    {"customer": "acme", "ticket": 2, "at": "2026-03-02T10:00:00Z", "body": "Acme's admin Dana asks for SSO by May 1."},
    {"customer": "globex", "ticket": 3, "at": "2026-03-01T11:00:00Z",
     "body": "Globex renewed 40 seats for EUR 12,000."},
    {"customer": "acme", "ticket": 4, "at": "2026-03-03T08:30:00Z", "body": "Fix for the login bug shipped in v2.4.1."},
    {"customer": "globex", "ticket": 5, "at": "2026-03-04T16:00:00Z",
     "body": "Globex wants an invoice per department."},
]


def event_to_memory(event: dict[str, Any]) -> dict[str, Any]:
    """A support event becomes a memory item of the customer's agent."""
    return {"agent_id": f"support-{event['customer']}", "id": f"ticket-{event['ticket']}", "ts": event["at"],
            "text": event["body"], "metadata": {"source": "support-desk"}}


def global_rows(node_json: str):
    """Only global nodes, as (agent_id, version, text)."""
    node = json.loads(node_json)
    if node["kind"] == "global":
        yield node["agent_id"], node["version"], node["text"]


def customer_memory(events: DataStream, config: Config) -> DataStream:
    """Events in, (agent_id, version, global summary) out; dead letters are printed by the TaskManager."""
    records = events.map(event_to_memory).name("support-event-to-memory")
    streams = add_memory_operators(records, config, bounded=True)  # (a collection ends)
    streams.dead_letters.print("dead-letter")
    return streams.summaries.flat_map(
        global_rows, output_type=Types.TUPLE([Types.STRING(), Types.INT(), Types.STRING()])
    ).name("keep-global-summaries")


def environment(config: Config) -> StreamExecutionEnvironment:
    """Our settings for the Python workers (interpreter, execution mode, bundles) and checkpointing; a job
    of yours may add its own to the same Configuration."""
    env = StreamExecutionEnvironment.get_execution_environment(flink_configuration(config, None))
    env.set_parallelism(1)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    config = load_config(None, ["llm.provider=openai", f"llm.base_url={args.base_url}", f"llm.model={args.model}",
                                "batching.max_items=2", "summarization.fan_in=2", "journal.path=null"])
    env = environment(config)
    events = env.from_collection(EVENTS)
    with customer_memory(events, config).execute_and_collect("support-memory") as results:
        latest: dict[str, tuple[int, str]] = {}
        for agent, version, text in results:
            if version > latest.get(agent, (0, ""))[0]:
                latest[agent] = (version, text)
    for agent, (version, text) in sorted(latest.items()):
        print(f"{agent} (v{version}): {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
