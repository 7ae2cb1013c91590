"""The report `flink-memory run` prints when the job ends: what was summarized, the LLM calls and tokens it
cost, where the output is, and the live tree of the agent with the most merges (its global, merges and
batches, with unit counts and time ranges) followed by its current memory."""

from __future__ import annotations

from pathlib import Path

from flink_memory.cli.display import recall_table, tree_lines
from flink_memory.cli.progress import KINDS
from flink_memory.config import EmbeddingsConfig
from flink_memory.outputs import latest_globals, read_outputs
from flink_memory.records import SummaryNode
from flink_memory.store import StoreError, open_store
from flink_memory.store.rules import live_view, walk_tree


def featured_agent(nodes: list[dict]) -> str | None:
    """The agent whose tree the report shows: the one with the most live merges (then the first by id)."""
    live = live_view(nodes).values()
    globals_ = latest_globals(nodes)
    merges = {agent: sum(1 for n in live if n.agent_id == agent and n.kind == "merge") for agent in globals_}
    return min(globals_, key=lambda a: (-merges[a], a)) if globals_ else None


def report(output_dir: str, wall_s: float) -> str:
    """The report of a finished run over `output_dir`, which took `wall_s` seconds."""
    from flink_memory.llm.runtime import read_stats

    outputs = read_outputs(output_dir)
    nodes = outputs["summaries"]
    kinds = {k: sum(1 for n in nodes if n["kind"] == k) for k in ("batch", "merge", "global")}
    live_nodes = live_view(nodes)
    live = live_nodes.values()  # a revised batch and the one it replaced hold the same units once
    units = sum(n.item_count for n in live if n.kind == "batch")
    stats = read_stats(output_dir)
    globals_ = latest_globals(nodes)
    by_kind = ", ".join(f"{k} {int(stats[f'calls_{k}'])}" for k in KINDS if stats.get(f"calls_{k}"))
    lines = [
        "flink-memory run finished",
        f"  memory units summarized : {units} ({len(globals_)} agents)",
        f"  summary nodes           : {kinds['batch']} batch, {kinds['merge']} merge, {kinds['global']} global",
        f"  manifests / dead letters: {len(outputs['manifests'])} / {len(outputs['dead-letters'])}",
        f"  LLM calls               : {int(stats.get('calls', 0))} ({by_kind or 'none'}; "
        f"{int(stats.get('journal_hits', 0))} answered from the journal, {int(stats.get('failures', 0))} failed, "
        f"{int(stats.get('retries', 0))} retried)",
        f"  tokens                  : {int(stats.get('prompt_tokens', 0))} prompt, "
        f"{int(stats.get('completion_tokens', 0))} completion",
        f"  wall time               : {wall_s:.1f} s",
        f"  output                  : {Path(output_dir).resolve()}/{{summaries,manifests,dead-letters,memory}}",
    ]
    agent = featured_agent(nodes)
    if agent is not None:
        merges = sum(1 for n in live if n.agent_id == agent and n.kind == "merge")
        node = SummaryNode.model_validate(globals_[agent])

        def children(parent: SummaryNode) -> list[SummaryNode]:
            return [live_nodes[(agent, c)] for c in parent.children if (agent, c) in live_nodes]

        lines.append(f"  live tree of {agent} ({merges} merges):")
        lines.extend("    " + line for line in tree_lines(walk_tree(node, children), width=60))
        lines.append(f"  global summary of {agent} (v{node.version}, {node.item_count} units):")
        lines.append("    " + node.text.strip().replace("\n", "\n    "))
    return "\n".join(lines)


def ask(store_url: str, agent_id: str, question: str, embeddings: EmbeddingsConfig, k: int = 3) -> list[str]:
    """One recall on the finished run's store, as the report's last lines: by meaning too when the store
    holds vectors (with the configured model), else by keyword."""
    from flink_memory.embeddings import EmbeddingError, embedder_for

    try:
        with open_store(store_url) as store:
            mode = "hybrid" if store.embedding_model() else "keyword"
            if mode == "hybrid":
                store.embedder = embedder_for(embeddings)
            hits = store.recall(agent_id, question, k=k, mode=mode)
    except (StoreError, EmbeddingError) as exc:
        return [f"  recall {question!r}: {exc}"]
    head = f"  recall {agent_id} {question!r} ({mode}, top {k}):"
    return [head, *("    " + line for line in recall_table(hits, width=60))] if hits else [f"{head} no match"]


def vectors_line(store_url: str) -> str:
    """How many of the store's rows have a vector, and what gives the rest one."""
    try:
        with open_store(store_url) as store:
            rows, embedded = store.vector_counts()
    except StoreError as exc:
        return f"  vectors                 : {exc}"
    rest = f"; the rest are found by keyword until `flink-memory embed --store {store_url}`" if embedded < rows else ""
    return f"  vectors                 : {embedded} of {rows} store rows{rest}"
