"""Vector search methods on a PostgreSQL store built by recall_latency.py: latency and agreement with exact search.

    flock /tmp/heavy.lock python benchmarks/pgvector_search.py --store postgresql://... [--agent agent-0]

For one agent, `--questions` questions (three words of one of its units, embedded with the default model) are
searched for their 50 nearest rows by each method: exactly in PostgreSQL (the agent's rows sorted by distance),
exactly in the reader (a matrix of the agent's vectors, as SQLite's store does), and by the agent's bucket's
HNSW index (flink_memory/store/pgvector.py) at several `hnsw.ef_search`, with and without the iterative scan.
`top 5`: the share of the exact top 5 among the 5 best rows found; `top 50`: of the exact 50.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for  # noqa: E402
from flink_memory.store import pgvector  # noqa: E402
from flink_memory.store.schema import NODES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="postgresql:// URL of a store with pgvector")
    parser.add_argument("--agent", default="agent-0")
    parser.add_argument("--questions", type=int, default=60)
    args = parser.parse_args(argv)
    embedder = embedder_for(load_config(None, [], environ={}).embeddings)
    assert embedder is not None
    conn = psycopg.connect(args.store, autocommit=True)
    started = time.perf_counter()
    rows = conn.cursor(binary=True).execute(f"SELECT node_id, vector FROM {NODES} WHERE agent_id = %s AND vector IS "
                                            "NOT NULL", (args.agent,)).fetchall()
    keys = [key for key, _ in rows]
    index = {key: i for i, key in enumerate(keys)}
    matrix = np.stack([pgvector.from_binary(v) for _, v in rows]).astype(np.float32)
    print(f"the reader's matrix: {len(keys)} vectors read in {time.perf_counter() - started:.2f} s, "
          f"{matrix.nbytes / 1e6:.0f} MB")
    texts = [row[0] for row in conn.execute(f"SELECT text FROM {NODES} WHERE agent_id = %s LIMIT 3000",
                                            (args.agent,)).fetchall()]
    rng = random.Random(5)
    questions = [embedder.query("What about " + " ".join(rng.sample(t.rstrip(".").split(), 3)) + "?")
                 for t in rng.sample(texts, min(args.questions, len(texts)))]
    bucket = conn.execute(f"SELECT {pgvector.BUCKET.replace('agent_id', '%s::text')}", (args.agent,)).fetchone()[0]
    nearest = pgvector.NEAREST.format(dim=embedder.dim, bucket=bucket)

    def exact(question: Any, n: int) -> list[str]:
        scores = matrix @ question
        top = np.argpartition(-scores, n)[:n]
        return [keys[i] for i in top[np.argsort(-scores[top])]]

    def sql(statement: str, settings: list[str]) -> Callable[[Any], list[str]]:
        def search(question: Any) -> list[str]:
            with conn.transaction():
                for setting in settings:
                    conn.execute(setting)
                return [row[0] for row in conn.cursor(binary=True).execute(
                    statement, (args.agent, pgvector.text(question), 50), prepare=False).fetchall()]
        return search

    methods: dict[str, Callable[[Any], list[str]]] = {
        "exact in PostgreSQL": sql(pgvector.EXACT, []),
        "exact in the reader": lambda question: exact(question, 50),
    }
    for ef in (40, 160, 240, 400):
        methods[f"bucket's HNSW, iterative, ef_search {ef}"] = sql(nearest, [
            "SET LOCAL hnsw.iterative_scan = relaxed_order", f"SET LOCAL hnsw.ef_search = {ef}",
            "SET LOCAL enable_sort = off"])
    for ef in (400, 1000):
        methods[f"bucket's HNSW, ef_search {ef}"] = sql(nearest, [f"SET LOCAL hnsw.ef_search = {ef}",
                                                                    "SET LOCAL enable_sort = off"])
    for name, search in methods.items():
        times, top5, top50 = [], 0.0, 0.0
        for question in questions:
            started = time.perf_counter()
            found = search(question)
            times.append(1000 * (time.perf_counter() - started))
            best = sorted(found, key=lambda key: -float(matrix[index[key]] @ question))[:5]
            top5 += len(set(best) & set(exact(question, 5))) / 5
            top50 += len(set(found) & set(exact(question, 50))) / 50
        times.sort()
        print(f"{name:42s} p50 {times[len(times) // 2]:6.1f} ms  p99 {times[int(len(times) * 0.99)]:6.1f} ms  "
              f"top 5 {top5 / len(questions):.3f}  top 50 {top50 / len(questions):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
