"""Entry point for `flink run -py jobs/agents_memory.py --input DIR --output DIR`: a Flink Agents agent
(flink_memory.agents.example.RememberingAgent, or --agent MODULE:CLASS taking the store URL) over the users'
turns of a followed directory, composed with flink-memory's operators in one job (docs/flink-agents.md).

Turns are JSON lines `{"agent_id", "id", "text", "ts"?}`. What the agent remembers is summarized into the
store (store.url, default <output>/memory.sqlite), which the agent recalls from; what it did with each turn is
in <output>/agent-outcomes/. Needs the flink-agents jars in the job's Python environment (`make agents-jars`).
As for jobs/memory_summarization.py: set llm.base_url to a model every TaskManager reaches, and run
`flink-memory apply --output DIR --follow` beside the job for the store. The input is followed, so the job
runs until cancelled: SIGINT or SIGTERM cancels it and the script exits 0 once it has ended.
"""

import argparse
import importlib
import sys
from pathlib import Path

from flink_memory.agents.example import RememberingAgent
from flink_memory.agents.pipeline import add_agent_memory
from flink_memory.cli.run import wait_or_cancel
from flink_memory.config import ConfigError, load_config
from flink_memory.flink.pipeline import create_environment, file_sink, file_source


def agent_class(spec: str | None) -> type:
    if spec is None:
        return RememberingAgent
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agents_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="directory of JSON-lines turns, followed")
    parser.add_argument("--output", required=True, help="output directory (summaries/, memory/, agent-outcomes/)")
    parser.add_argument("--config", help="YAML config file (default: conf/flink-memory.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--agent", metavar="MODULE:CLASS", help="the agent class (not in __main__)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        store = config.store.location(args.output)
    except ConfigError as exc:
        print(f"agents_memory: {exc}", file=sys.stderr)
        return 2
    env = create_environment(config, args.output)
    streams = add_agent_memory(env, file_source(env, args.input, follow=True), agent_class(args.agent)(store),
                               config, args.output)
    root = args.output if "://" in args.output else str(Path(args.output).resolve())
    streams.outcomes.sink_to(file_sink(f"{root.rstrip('/')}/agent-outcomes", "outcomes")).uid(
        "flink-memory-agent-outcomes-sink")
    client = env.execute_async("flink-memory-agents")
    wait_or_cancel(client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
