"""Stores for the browser page's tests and screenshots, made without the LLM or Flink.

`sample_store`: the sample's input (samples/memories.jsonl) run through the job's stages in memory
(flink_memory.local) with `make run`'s settings and a summarizer that keeps its input's lines, then an update
and a deletion of agent-0 (so its history has remade nodes), applied to a SQLite store through the committed
memory log as the job's applier does, with the default embedding model's vectors.

`large_store`: one agent of `units` memory units under a full tree (batches of 50, merges of 8, a global),
written straight into the store's table as its writes make the rows, in one transaction of plain inserts (the
store's upserts check each row against replaced nodes and pending deletions: 10 s for 100 000 units, this a few),
for the page's load time.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from stagekit import Pipeline, cfg, keeping_answer

from flink_memory.embeddings.static import StaticE5
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store import open_store
from flink_memory.store.applier import LOG_DIR, apply_committed
from flink_memory.store.schema import COLUMNS, NODES, node_row, unit_row

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "memories.jsonl"
CHANGES = [{"agent_id": "agent-0", "id": "a0-m001", "ts": "2026-03-03T09:00:00Z",
            "text": "Chen Wei moved to Vancouver in March and now prefers meetings after 10:00."},
           {"agent_id": "agent-0", "id": "a0-m002", "deleted": True}]


def sample_store(output: Path) -> str:
    """The sample's store at `output`/memory.sqlite (with the job's memory log in `output`/memory/)."""
    run = Pipeline(cfg("batching.max_items=10", "summarization.fan_in=4", "batching.flush_after_s=60"),
                   keeping_answer, bounded=False)
    run.feed(*[line for line in SAMPLE.read_text().splitlines() if line.strip()]).settle()
    run.feed(*CHANGES).settle().end()
    folder = output / LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory-0001-0-1.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in run.log))
    location = str(output / "memory.sqlite")
    with open_store(location, create=True, embedder=StaticE5()) as store:
        apply_committed(store, output)
        store.embed_pending(store.agents())
    return location


def large_store(location: str, agent: str = "big", units: int = 100_000, batch: int = 50, fan_in: int = 8) -> str:
    """One agent of `units` units under batches, merges and a global, written directly."""
    open_store(location, create=True).close()
    rows = [MemoryUnit(agent_id=agent, unit_id=f"u{i:06d}", source_id=f"u{i:06d}",
                       text=f"Note {i}: customer {i % 977} paid {i % 313} EUR for order {i}.",
                       ts=f"2026-01-{1 + i * 28 // units:02d}T00:00:00Z") for i in range(units)]
    level = []
    for b in range(0, units, batch):
        group = rows[b:b + batch]
        level.append(SummaryNode(agent_id=agent, node_id=f"batch-{b // batch:06d}", kind="batch", level=1,
                                 children=[u.unit_id for u in group], text=f"Orders {b} to {b + len(group) - 1}.",
                                 item_count=len(group), first_ts=group[0].ts, last_ts=group[-1].ts, model="m"))
    nodes = list(level)
    depth = 1
    while len(level) > fan_in:
        depth += 1
        level = [SummaryNode(agent_id=agent, node_id=f"merge-{depth}-{m // fan_in:06d}", kind="merge",
                             level=depth, children=[n.node_id for n in level[m:m + fan_in]],
                             text=f"Merged orders of level {depth}, part {m // fan_in}.",
                             item_count=sum(n.item_count for n in level[m:m + fan_in]),
                             first_ts=level[m].first_ts, last_ts=level[min(m + fan_in, len(level)) - 1].last_ts,
                             model="m") for m in range(0, len(level), fan_in)]
        nodes += level
    nodes.append(SummaryNode(agent_id=agent, node_id="global-1", kind="global", level=depth + 1, version=1,
                             children=[n.node_id for n in level], text=f"All {units} orders.",
                             item_count=units, first_ts=rows[0].ts, last_ts=rows[-1].ts, model="m"))
    # the rows as the store's writes make them (schema.unit_row, node_row), in one transaction of plain inserts
    covered = {unit: node.node_id for node in nodes if node.kind == "batch" for unit in node.children}
    columns = ", ".join((*COLUMNS, "covered_by"))
    with closing(sqlite3.connect(location)) as db, db:
        db.executemany(f"INSERT INTO {NODES} ({columns}) VALUES ({', '.join('?' for _ in range(len(COLUMNS) + 1))})",
                       [(*unit_row(u), covered[u.unit_id]) for u in rows] + [(*node_row(n), None) for n in nodes])
    return location
