"""flink-memory: run the job locally, serve the embedded model, read an agent's memory (show, recall), serve
it to agents over HTTP and MCP (serve, keys)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flink_memory.cli.args import add_job_arguments, positive, show_config
from flink_memory.cli.read import embed_rows, read_memory
from flink_memory.cli.run import apply_log, run_job, serve_llm
from flink_memory.cli.serve import add_commands as add_service_commands
from flink_memory.config import ConfigError
from flink_memory.history import HistoryError


def main(argv: list[str] | None = None) -> int:
    """The `flink-memory` command line: parse it, run the command, return its exit code."""
    logging.basicConfig(level=os.environ.get("FLINK_MEMORY_LOG", "WARNING"))
    parser = argparse.ArgumentParser(prog="flink-memory", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the job on a local MiniCluster")
    add_job_arguments(run)
    run.add_argument("--ask", metavar="QUESTION", help="end the report with this question recalled from the "
                     "memory of the agent it shows (the live store)")
    run.add_argument("--progress-every", type=float, metavar="SECONDS",
                     help="seconds between progress lines (default: 1 on a terminal, rewritten in place; 10 in a log)")
    run.set_defaults(handler=run_job)
    serve = commands.add_parser("serve-llm", help="serve the embedded model over the OpenAI API (by default "
                                "with the configuration's llm.context_window and llm.embedded_* settings)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 inside a container)")
    serve.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    serve.add_argument("--model", help="a GGUF file (default: llm.embedded_model_path, else the bundled SmolLM2)")
    serve.add_argument("--context-window", type=positive, help="default: llm.context_window")
    serve.add_argument("--threads", type=positive, help="default: llm.embedded_threads")
    serve.add_argument("--parallel", type=positive, help="default: llm.embedded_parallel")
    serve.add_argument("--config")
    serve.add_argument("--set", dest="overrides", action="append", default=[])
    serve.set_defaults(handler=serve_llm)
    show_memory = commands.add_parser("show", help="print an agent's current memory (its live global summary)")
    show_memory.add_argument("agent")
    show_memory.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    show_memory.add_argument("--json", action="store_true", help="the node as a summaries/ JSON line")
    show_memory.add_argument("--tree", action="store_true", help="the live tree below it (with --json: one line each)")
    show_memory.set_defaults(handler=read_memory)
    recall = commands.add_parser("recall", help="the agent's live memory units and summary nodes that best match "
                                 "a question")
    recall.add_argument("agent")
    recall.add_argument("query", help="a question or keywords, in plain language")
    recall.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    recall.add_argument("--k", type=positive, default=5, help="how many units and nodes (default 5)")
    recall.add_argument("--mode", choices=["hybrid", "keyword", "vector"],
                        help="keyword, by meaning (vector) or both (hybrid); default: hybrid when the store holds "
                             "vectors, else keyword")
    recall.add_argument("--diversity", type=float, metavar="0..1",
                        help="how much results that repeat the matching memories of results above them give way "
                             "(0: relevance alone; 1, the default recall.diversity: no slot)")
    recall.add_argument("--json", action="store_true",
                        help="JSON lines: node_id, kind (unit | batch | merge | global), level, text, score, "
                             "first_ts, last_ts, for a unit covered_by, and folds (what a hit stands for)")
    recall.add_argument("--config", help="for the embeddings.* settings of a query by meaning")
    recall.add_argument("--set", dest="overrides", action="append", default=[])
    recall.set_defaults(handler=read_memory)
    embed = commands.add_parser("embed", help="give a vector to the store's rows that have none (a bounded run "
                                "ends without waiting long for them)")
    embed.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    embed.add_argument("--agent", action="append", help="only this agent's rows; repeatable (default: every agent)")
    embed.add_argument("--replace", action="store_true", help="re-embed every row with the configured model (after "
                       "a change of embeddings.model; stop the job or restart it with the new model first)")
    embed.add_argument("--config", help="for the embeddings.* settings")
    embed.add_argument("--set", dest="overrides", action="append", default=[])
    embed.set_defaults(handler=embed_rows)
    apply = commands.add_parser("apply", help="write the store from the memory log a job committed (what a run "
                                "does on a thread; on a cluster, run it beside the job with --follow)")
    apply.add_argument("--output", required=True,
                       help="the job's output: a path, file://... or s3://... (its memory/ folder)")
    apply.add_argument("--store", help="SQLite file or postgresql:// URL (default: store.url, else "
                       "<output>/memory.sqlite)")
    apply.add_argument("--follow", action="store_true", help="keep applying new commits until stopped")
    apply.add_argument("--every", type=float, default=0.25, metavar="SECONDS", help="how often to look (--follow)")
    apply.add_argument("--config", help="for the store.* and embeddings.* settings of a job whose output has no "
                       "flink-memory.json (older releases); else they must match it")
    apply.add_argument("--set", dest="overrides", action="append", default=[])
    apply.set_defaults(handler=apply_log)
    add_service_commands(commands)
    show = commands.add_parser("config", help="print the effective configuration and its fingerprints")
    show.add_argument("--config")
    show.add_argument("--set", dest="overrides", action="append", default=[])
    show.set_defaults(handler=show_config)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ConfigError, HistoryError) as exc:
        print(f"flink-memory: {exc}", file=sys.stderr)
        return 2
