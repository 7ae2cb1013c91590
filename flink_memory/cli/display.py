"""How `show` and `recall` print nodes and hits on a terminal: one-line descriptions, the indented live tree and
the recall table. Display only; what is live and how hits rank are the store's rules (flink_memory.store.rules)."""

from __future__ import annotations

from flink_memory.records import SummaryNode
from flink_memory.store.rules import Recalled


def snippet(text: str, width: int) -> str:
    """A text on one line, cut to `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def describe(node: SummaryNode) -> str:
    """A node in one line, without its text: id, kind, version, level, units, time range."""
    version = f" v{node.version}" if node.version is not None else ""
    return (f"{node.node_id} ({node.kind}{version}, level {node.level}, {node.item_count} units, "
            f"{node.first_ts or '?'} .. {node.last_ts or '?'})")


def tree_lines(tree: list[tuple[int, SummaryNode, int]], width: int = 100) -> list[str]:
    """`walk_tree` output as indented lines: the node, the start of its text, children not stored."""
    lines = []
    for depth, node, missing in tree:
        note = f" [{missing} children not stored]" if missing else ""
        lines.append(f"{'  ' * depth}{describe(node)}{note}: {snippet(node.text, width)}")
    return lines


def recall_table(hits: list[Recalled], width: int = 80) -> list[str]:
    """Recall hits as a table: rank, score, kind, level, node id, time range, the start of the text."""
    rows = [("#", "score", "kind", "level", "node", "from", "to", "text")]
    rows += [(str(i), f"{h.score:.4g}", h.kind, str(h.level), h.node_id, h.first_ts or "?", h.last_ts or "?",
              snippet(h.text, width)) for i, h in enumerate(hits, 1)]
    widths = [max(len(row[c]) for row in rows) for c in range(7)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row[:7], widths)) + "  " + row[7] for row in rows]
