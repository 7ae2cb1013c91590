"""Configuration from the command line: the job's flags (shared by `flink-memory run` and
jobs/memory_summarization.py for `flink run -py`), the effective config they give, and the `config` command
that prints it. Loading the budget and fingerprint code waits until a command needs it, so `show` and `recall`
start without it."""

from __future__ import annotations

import argparse
import json

from flink_memory.config import Config, load_config


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's flags: shared by `flink-memory run` and jobs/memory_summarization.py (flink run -py)."""
    parser.add_argument("--input", required=True, help="a JSON-lines file, a directory of them, or "
                        "kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC] (see source.kafka.*)")
    parser.add_argument("--output", required=True, help="output directory (summaries/, manifests/, dead-letters/)")
    parser.add_argument("--config", help="YAML config file (default: conf/flink-memory.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting; repeatable")
    parser.add_argument("--follow", action="store_true", help="keep watching the input directory for new files")
    parser.add_argument("--parallelism", type=positive, help="shorthand for --set job.parallelism=N")
    parser.add_argument("--restore", metavar="PATH", help="resume from a retained checkpoint or a savepoint")


def job_config(args: argparse.Namespace) -> Config:
    """The job's effective config from its flags, refused here if a request could not fit the budget."""
    from flink_memory import topology

    overrides = list(args.overrides)
    if args.parallelism is not None:
        overrides.append(f"job.parallelism={args.parallelism}")
    config = load_config(args.config, overrides)
    topology.check(config)
    config.store.location(args.output)  # (refuses an output it cannot put the store next to)
    return config


def show_config(args: argparse.Namespace) -> int:
    """`config`: the effective configuration as JSON and the fingerprints of the chunking and summary policies."""
    from flink_memory import topology
    from flink_memory.chunking.plans import chunking_fingerprint
    from flink_memory.summarize.prompts import summarization_fingerprint

    config = load_config(args.config, args.overrides)
    topology.check(config)  # (what `run` would refuse, refused here too)
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    print(f"chunking fingerprint      {chunking_fingerprint(config)}")
    print(f"summarization fingerprint {summarization_fingerprint(config)}")
    return 0
