"""`flink-memory serve` (the memory as an HTTP API and MCP tools) and `flink-memory keys` (its keys)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from flink_memory.cli.args import positive
from flink_memory.service.keys import KeysError, add_key, load_keys, revoke_key


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's): `serve --workers`' default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (no affinity on macOS or Windows)
        return max(1, os.cpu_count() or 1)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """The `serve` and `keys` subcommands."""
    serve = commands.add_parser("serve", help="serve agents' memory: HTTP JSON API under /v1 and MCP at /mcp "
                                "(or MCP over stdio)")
    serve.add_argument("--store", required=True, help="SQLite file (<output>/memory.sqlite) or postgresql:// URL")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but loopback needs --keys")
    serve.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    serve.add_argument("--keys", metavar="FILE", help="service keys (flink-memory keys add): each reads and writes "
                       "only the agents it names; without it, every agent, loopback only")
    serve.add_argument("--input", metavar="DIR|kafka://HOST:PORT/TOPIC",
                       help="where writes go: the directory the job follows, or its input topic (none: read-only)")
    serve.add_argument("--read-only", action="store_true", help="refuse writes (403)")
    serve.add_argument("--stdio", action="store_true", help="MCP over stdin/stdout for a local assistant")
    serve.add_argument("--agent", help="with --stdio: the one agent the tools serve (default: any, named per call)")
    serve.add_argument("--threads", type=positive, metavar="N", help="reads served at once, each on its own store "
                       "connection (default: the CPU cores + 1); more requests wait their turn")
    serve.add_argument("--workers", type=positive, default=machine_cores(), metavar="N", help="HTTP: processes "
                       "sharing the port, each with its own store connections and caches (default: the cores this "
                       "process may run on; a process serves on about one core)")
    serve.add_argument("--open", action="store_true", help="open the browser page (/ui/) once the server answers")
    serve.add_argument("--config", help="for the embeddings.* settings of recall by meaning")
    serve.add_argument("--set", dest="overrides", action="append", default=[])
    serve.set_defaults(handler=run_serve)
    keys = commands.add_parser("keys", help="service keys of `serve --keys FILE`: add, list, revoke")
    actions = keys.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="make a key for these agents (ids, or prefixes ending in *); prints it once")
    add.add_argument("agents", nargs="+", metavar="AGENT_ID")
    listing = actions.add_parser("list", help="the keys (ids and agents; never a key)")
    revoke = actions.add_parser("revoke", help="remove a key (a running server stops accepting it at once)")
    revoke.add_argument("key_id")
    for action in (add, listing, revoke):
        action.add_argument("--keys", required=True, metavar="FILE")
    keys.set_defaults(handler=run_keys)


def run_keys(args: argparse.Namespace) -> int:
    try:
        if args.action == "add":
            key, entry = add_key(args.keys, args.agents)
            print(key)
            print(f"key {entry.id} for {', '.join(entry.agents)}: shown once, only its digest is kept in {args.keys}",
                  file=sys.stderr)
        elif args.action == "list":
            for entry in load_keys(args.keys).keys:
                print(f"{entry.id}  {entry.created}  {' '.join(entry.agents)}")
        else:
            entry = revoke_key(args.keys, args.key_id)
            print(f"revoked key {entry.id} ({', '.join(entry.agents)})", file=sys.stderr)
    except KeysError as exc:
        print(f"flink-memory: {exc}", file=sys.stderr)
        return 2
    return 0


def open_when_up(page: str, wait_s: float = 30.0) -> None:
    """Open `page` in the default browser once the server answers it (a browser that cannot start: a note)."""
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(page, timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    if not webbrowser.open(page):
        print(f"[flink-memory] no browser to open here: open {page}", file=sys.stderr)


def run_serve(args: argparse.Namespace) -> int:
    from flink_memory.service.server import ServeError, ServeOptions, one_blas_thread, serve_http, serve_stdio

    one_blas_thread()  # (before the embeddings load numpy)
    from flink_memory.config import load_config
    from flink_memory.embeddings import EmbeddingError, embedder_for
    from flink_memory.service.writer import WriteFailed

    try:
        config = load_config(args.config, args.overrides)
        options = ServeOptions(store=args.store, host=args.host, port=args.port, keys=args.keys, input=args.input,
                               read_only=args.read_only, agent=args.agent, threads=args.threads,
                               diversity=config.recall.diversity, workers=args.workers,
                               applier_warn_after_s=config.store.applier_warn_after_s)
        embedder = embedder_for(config.embeddings)
        if not args.stdio:
            host = f"[{args.host}]" if ":" in args.host else args.host
            page = f"http://{host}:{args.port}/ui/"
            print(f"[flink-memory] serving {args.store}: the API at http://{host}:{args.port}/v1, the page at {page}",
                  file=sys.stderr)
            if args.open:
                threading.Thread(target=open_when_up, args=(page,), name="open-page", daemon=True).start()
        (serve_stdio if args.stdio else serve_http)(options, embedder)
    except (ServeError, KeysError, WriteFailed, EmbeddingError, ValueError) as exc:
        print(f"flink-memory: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
