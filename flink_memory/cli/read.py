"""`flink-memory show` and `flink-memory recall`: an agent's memory from the live-memory store, printed; and
`flink-memory embed`, which gives a vector to the rows a run left without one. A missing store or agent is a
message and an exit code, not a traceback."""

from __future__ import annotations

import argparse
import sys

from flink_memory.cli.display import describe, recall_table, tree_lines
from flink_memory.store import MemoryStore, Recalled, StoreError, open_store
from flink_memory.store.rules import walk_tree

# Exit codes of `show` and `recall` (0: printed); 2 is argparse's for a wrong command line.
NO_MATCH, STORE_UNAVAILABLE, NO_MEMORY = 1, 3, 4


def _fail(code: int, message: str) -> int:
    print(f"flink-memory: {message}", file=sys.stderr)
    return code


def recall(store: MemoryStore, args: argparse.Namespace) -> list[Recalled]:
    """`recall`: by meaning too when the store holds vectors (or --mode asks), with the configured model."""
    from flink_memory.config import load_config

    mode = args.mode or ("hybrid" if store.embedding_model() else "keyword")
    if mode != "keyword":
        _load_embedder(store, args)
    diversity = args.diversity
    if diversity is None:
        diversity = load_config(args.config, args.overrides).recall.diversity
    return store.recall(args.agent, args.query, k=args.k, mode=mode, diversity=diversity)


def _load_embedder(store: MemoryStore, args: argparse.Namespace) -> None:
    """The configured embedding model (--config, --set) on the store; a model that cannot load is a StoreError."""
    from flink_memory.config import load_config
    from flink_memory.embeddings import EmbeddingError, embedder_for

    try:
        store.embedder = embedder_for(load_config(args.config, args.overrides).embeddings)
    except EmbeddingError as exc:
        raise StoreError(str(exc)) from None


def embed_rows(args: argparse.Namespace) -> int:
    """`embed`: vectors for the stored rows that have none, agent by agent, each agent's in one transaction
    (safe beside a running job); with --replace, first drop every vector (for a new embeddings.model)."""
    try:
        with open_store(args.store) as store:
            _load_embedder(store, args)
            if store.embedder is None:
                return _fail(STORE_UNAVAILABLE, "embeddings.provider is none: no model to embed with")
            if args.replace:
                if args.agent:
                    return _fail(STORE_UNAVAILABLE, "--replace re-embeds the whole store: it takes no --agent")
                old = store.embedding_model()
                print(f"dropped {store.forget_vectors()} vectors of {old}", file=sys.stderr)
            agents = args.agent or store.agents()
            done = 0
            for agent in agents:
                done += store.embed_pending([agent])
    except StoreError as exc:
        return _fail(STORE_UNAVAILABLE, str(exc))
    print(f"embedded {done} rows of {len(agents)} agents with {store.embedder.name}")
    return 0


def read_memory(args: argparse.Namespace) -> int:
    """`show` and `recall`: read the live-memory store; a missing store or agent is a message, not a traceback."""
    try:
        store = open_store(args.store)
    except StoreError as exc:
        return _fail(STORE_UNAVAILABLE, str(exc))
    with store:
        if args.agent not in store.agents():
            return _fail(NO_MEMORY, f"agent {args.agent!r} has no memory in {store.location}")
        current = store.current(args.agent)
        forgotten = None
        if current is not None and current.item_count == 0:
            forgotten = f"agent {args.agent!r} has an empty memory ({current.node_id}: forgotten)"
        if args.command == "recall":  # (after a forget, new input may be in batch nodes before the next global)
            try:
                hits = recall(store, args)
            except StoreError as exc:
                return _fail(STORE_UNAVAILABLE, str(exc))
            if not hits and forgotten:
                return _fail(NO_MEMORY, forgotten)
            if not hits:
                return _fail(NO_MATCH, f"nothing in the memory of {args.agent!r} matches {args.query!r}")
            print("\n".join(h.model_dump_json() for h in hits) if args.json else "\n".join(recall_table(hits)))
            return 0
        if current is None:
            return _fail(NO_MEMORY, f"agent {args.agent!r} has no global summary yet "
                                    f"({len(store.nodes(args.agent))} live nodes; try recall)")
        if forgotten:
            return _fail(NO_MEMORY, forgotten)
        tree = walk_tree(current, lambda n: store.children(args.agent, n.node_id)) if args.tree else [(0, current, 0)]
        if args.json:
            print("\n".join(node.model_dump_json() for _, node, _ in tree))
        elif args.tree:
            print("\n".join(tree_lines(tree)))
        else:
            print(f"{args.agent}: {describe(current)}")
            print(current.text)
    return 0
