"""Recall latency at scale: one agent with many units in a store of many rows, through the Python API.

    flock /tmp/heavy.lock python benchmarks/recall_latency.py --rows 1000000 --agent-units 100000

Builds a store (SQLite; PostgreSQL with --postgres URL) of `--rows` memory units: `--agent-units` of them
belong to the measured agent, the rest to `--others` other agents. Rows go in through `upsert_units` (the
job's write path: full-text index included), in chunks, timed as rows/s. Their vectors are random unit
vectors of the embedding model's dimension, written through the store's own vector statement: embedding a
million texts with the offline model is not possible here (about 30 passages/s per core), and the cost of a
search does not depend on what the vectors hold. Then `--queries` distinct questions (three words of one of
the agent's units) are recalled in each mode (hybrid, keyword, vector) with the real embedding model, each
mode embedding its questions anew (the embedder's cache is cleared), so each timing of a mode by meaning
includes embedding the question. Printed per mode: p50/p99 and the share of questions whose unit (the one
its words were drawn from) is in the top 5; then the embedding's own p50/p99. The first recall (which loads
the agent's vectors) is reported on its own.

`--reuse PATH` measures a store this benchmark built before (read only, no build): the questions come from
the same rows a build samples (every 100th of agent-0's units), so a reused store gets the same questions.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for, to_bytes  # noqa: E402
from flink_memory.records import MemoryUnit  # noqa: E402
from flink_memory.store import open_store  # noqa: E402
from flink_memory.store.sql import NODES, SET_META, SET_VECTOR, text_digest  # noqa: E402

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu", "bra", "del", "for", "gin", "hal", "jor"]


def vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def texts(rng: random.Random, vocab: list[str], n: int) -> list[str]:
    """Sentences of 8 to 16 words drawn with a Zipf-like skew (a few words are in most rows)."""
    weights = [1 / (i + 1) for i in range(len(vocab))]
    out = []
    for _ in range(n):
        out.append(" ".join(rng.choices(vocab, weights, k=rng.randint(8, 16))) + ".")
    return out


def build(location: str, args: argparse.Namespace, dim: int, model: str) -> tuple[dict[str, Any], list[str]]:
    rng = random.Random(7)
    vocab = vocabulary(rng, args.vocabulary)
    others = max(1, args.others)
    per_other = (args.rows - args.agent_units) // others
    plan = [("agent-0", args.agent_units)] + [(f"other-{i}", per_other) for i in range(others)]
    vectors_rng = np.random.default_rng(7)
    rows = write_s = vector_s = 0.0
    sample: list[str] = []
    with open_store(location, create=True) as store:
        store._write([], [(store._sql(SET_META), ("embedding_model", model)),
                          (store._sql(SET_META), ("embedding_dim", str(dim)))])
        for agent, count in plan:
            for start in range(0, count, args.chunk):
                batch = texts(rng, vocab, min(args.chunk, count - start))
                units = [MemoryUnit(agent_id=agent, unit_id=f"u{start + i}", source_id=f"u{start + i}", text=t,
                                    ts="2026-01-01T00:00:00Z") for i, t in enumerate(batch)]
                if agent == "agent-0":
                    sample.extend(batch[:: max(1, len(batch) // 50)])
                started = time.perf_counter()
                store.upsert_units(units)
                write_s += time.perf_counter() - started
                matrix = vectors_rng.standard_normal((len(units), dim), dtype=np.float32)
                matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
                started = time.perf_counter()
                store._write([agent], [(store._sql(SET_VECTOR), (to_bytes(v), agent, f"unit:{u.unit_id}",
                                                                 text_digest(u.text))) for u, v in zip(units, matrix)])
                vector_s += time.perf_counter() - started
                rows += len(units)
            print(f"  {agent}: {count} rows ({rows:.0f} in all, {rows / (write_s + vector_s):.0f} rows/s)",
                  file=sys.stderr, flush=True) if agent == "agent-0" or int(agent.split("-")[1]) % 100 == 99 else None
    return {"rows": int(rows), "rows_per_s_text": rows / write_s, "rows_per_s_vectors": rows / vector_s,
            "rows_per_s": rows / (write_s + vector_s), "build_s": write_s + vector_s}, sample


def sample_keys(agent_units: int, chunk: int) -> list[str]:
    """The unit ids of the texts `build` samples, in its order: every 100th of agent-0's units (by number)."""
    return [f"u{start + i}" for start in range(0, agent_units, chunk)
            for i in range(0, min(chunk, agent_units - start), max(1, min(chunk, agent_units - start) // 50))]


def reused_sample(location: str, agent_units: int, chunk: int) -> list[str]:
    """The texts `build` samples, read back from a store it built."""
    with open_store(location) as store:
        found = dict(store._fetch(f"SELECT node_id, text FROM {NODES} WHERE agent_id = 'agent-0'", ()))
    keys = [f"unit:{key}" for key in sample_keys(agent_units, chunk)]
    missing = [key for key in keys if key not in found]
    if missing:
        raise SystemExit(f"{location} is not a store of --agent-units {agent_units}: no {missing[0]} of agent-0")
    return [found[key] for key in keys]


def measure(location: str, embedder: Any, questions: list[tuple[str, str]], mode: str) -> dict[str, Any]:
    """Latency of recall in one mode, and how often the top 5 holds the unit a question was made from."""
    embedder._cache.clear()  # every mode embeds its questions (the cache would serve the modes after the first)
    with open_store(location, embedder=embedder) as store:
        started = time.perf_counter()
        store.recall("agent-0", "warm up the first question", k=5, mode=mode)
        first_ms = 1000 * (time.perf_counter() - started)
        times, found = [], 0
        for source, question in questions:
            started = time.perf_counter()
            hits = store.recall("agent-0", question, k=5, mode=mode)
            times.append(1000 * (time.perf_counter() - started))
            assert hits, question
            found += source in {hit.node_id for hit in hits}
    times.sort()
    return {"mode": mode, "queries": len(times), "first_ms": first_ms, "p50_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))], "mean_ms": statistics.fmean(times),
            "source_at_5": found / len(questions)}


def measure_embedding(embedder: Any, questions: list[tuple[str, str]]) -> dict[str, Any]:
    """The part of a recall by meaning that no store can speed up: embedding the question."""
    embedder._cache.clear()
    times = []
    for _, question in questions:
        started = time.perf_counter()
        embedder.query(question)
        times.append(1000 * (time.perf_counter() - started))
    times.sort()
    return {"p50_ms": statistics.median(times), "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--agent-units", type=int, default=100_000)
    parser.add_argument("--others", type=int, default=900, help="other agents sharing the rest of the rows")
    parser.add_argument("--vocabulary", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=5000, help="units per upsert_units call")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--store", help="SQLite path or postgresql:// URL (default: a temporary SQLite file)")
    parser.add_argument("--reuse", metavar="PATH", help="measure this store, built before by this benchmark with "
                        "the same --agent-units and --chunk (read only, nothing built)")
    parser.add_argument("--threads", type=int, help="CPU threads of the embedded model (embeddings.threads; "
                        "default: the configuration's)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    overrides = [f"embeddings.threads={args.threads}"] if args.threads else []
    embedder = embedder_for(load_config(None, overrides, environ={}).embeddings)
    assert embedder is not None
    built: dict[str, Any]
    if args.reuse:
        location = args.reuse
        built, sample = {"reused": location}, reused_sample(location, args.agent_units, args.chunk)
    else:
        location = args.store or str(Path(tempfile.mkdtemp(prefix="recall-latency-")) / "memory.sqlite")
        built, sample = build(location, args, embedder.dim, embedder.name)
        print(f"built {built['rows']} rows in {built['build_s']:.0f} s: {built['rows_per_s']:.0f} rows/s "
              f"({built['rows_per_s_text']:.0f} rows/s text and index, {built['rows_per_s_vectors']:.0f} rows/s "
              "vectors)", flush=True)
    rng = random.Random(11)
    questions = []  # (the unit it was made from, question)
    sources = list(zip(sample_keys(args.agent_units, args.chunk), sample))
    for key, text in rng.sample(sources, min(args.queries, len(sources))):
        words = text.rstrip(".").split()
        questions.append((key, "What about " + " ".join(rng.sample(words, 3)) + "?"))
    results = {"store": "postgresql" if "://" in location else "sqlite", "agent_units": args.agent_units,
               "model": embedder.name, "threads": args.threads, **built, "recall": []}
    for mode in ("hybrid", "keyword", "vector"):
        row = measure(location, embedder, questions, mode)
        results["recall"].append(row)
        print(f"{mode:8s} p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms  mean {row['mean_ms']:.1f} ms  "
              f"(first recall {row['first_ms']:.0f} ms, {row['queries']} questions; the top 5 holds the question's "
              f"unit for {row['source_at_5']:.3f})", flush=True)
    results["embedding"] = embedding = measure_embedding(embedder, questions)
    print(f"the questions' embedding alone: p50 {embedding['p50_ms']:.1f} ms  p99 {embedding['p99_ms']:.1f} ms",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
