"""Entry point for `flink run -py jobs/memory_summarization.py --input ... --output ...`.

Same flags as `flink-memory run`. On a cluster the LLM must be reachable from every TaskManager: set
llm.base_url (for example a `flink-memory serve-llm` service or any OpenAI-compatible endpoint). The store
follows the job's committed memory log (<output>/memory/): run `flink-memory apply --output DIR --follow`
beside the job (docker-compose.yml's store-applier does), where it reads the output directory. A restore
(`flink run -s SAVEPOINT`) passes the same path as --restore too: the job then writes a new branch of the
output's history (docs/recovery.md); without it, the job refuses an output that holds another job's memory.
"""

import argparse
import sys

from flink_memory.cli.args import add_job_arguments, job_config
from flink_memory.config import ConfigError
from flink_memory.flink.pipeline import build_job
from flink_memory.history import HistoryError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory_summarization", description=__doc__)
    add_job_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = job_config(args)
    except ConfigError as exc:
        print(f"memory_summarization: {exc}", file=sys.stderr)
        return 2
    try:
        env = build_job(config, args.input, args.output, follow=args.follow, restore=args.restore)
    except HistoryError as exc:  # (another job's output or store: docs/recovery.md)
        print(f"memory_summarization: {exc}", file=sys.stderr)
        return 2
    env.execute("flink-memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
