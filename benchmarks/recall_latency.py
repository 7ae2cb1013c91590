"""Recall latency at scale: one agent with many units in a store of many rows, through the Python API.

    flock /tmp/heavy.lock python benchmarks/recall_latency.py --rows 1000000 --agent-units 100000

Builds a store (SQLite; PostgreSQL with --store postgresql://...) of `--rows` memory units: `--agent-units` of them
belong to the measured agent, the rest to `--others` other agents. Rows go in through `upsert_units` (the
job's write path: full-text index included), in chunks, timed as rows/s. Their vectors are the texts' own,
by the configured embedding model (`--vectors model`, the default: the static model embeds a million texts
in about a minute), written through the store's own vector statement; or synthetic unit vectors of the
model's dimension (for a model too slow to embed a million texts): `--vectors structured`, of a low
intrinsic dimension, as text embeddings are (a 32-dimensional gaussian mapped into the model's space, plus
noise), or `--vectors random` (no near neighbours, which an approximate index cannot find).
`--bulk` (PostgreSQL) loads the vectors first and builds the HNSW index after, timed on its own. Then
`--queries` distinct questions (three words of one of the agent's units) are recalled in hybrid mode with the real
embedding model, so each timing includes embedding the question; p50/p99 are printed per mode. The first recall
(which loads the agent's vectors) is
reported on its own. Vector recall is checked against an exact search over the agent's vectors: the share
of the exact top 5 that `recall(mode="vector", k=5)` returns (1.0 for an exact search; below it, what an
approximate index such as PostgreSQL's HNSW misses).

`--baseline REV` also measures another revision's recall on the same store and questions (checked out beside
this one): per mode, `--rounds` times, the baseline and this checkout in turn (which goes first turns each
round), each in a process whose flink_memory is its own; it prints both sides' p50 and p99 and the ratio of
this checkout's p50 to the baseline's, round by round and their median (on a shared machine the latency of
one run drifts by a fifth from one minute to the next: a ratio of runs side by side holds where two runs
minutes apart do not).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from revisions import worktree  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for  # noqa: E402
from flink_memory.records import MemoryUnit  # noqa: E402
from flink_memory.store import open_store  # noqa: E402
from flink_memory.store.schema import SET_VECTOR, text_digest  # noqa: E402

LATENT, NOISE = 32, 0.3  # the synthetic vectors' intrinsic dimension and noise


def vocabulary(rng: random.Random, size: int) -> list[str]:
    """`size` English words (the static model's word list: the most frequent first), shuffled."""
    from importlib import resources

    listed = json.loads(resources.files("flink_memory.embeddings").joinpath("data", "e5-static.json").read_text())
    words = [w for w in listed["words"] if w.isalpha()][:size]
    rng.shuffle(words)
    return words


def texts(rng: random.Random, vocab: list[str], n: int) -> list[str]:
    """Sentences of 8 to 16 words drawn with a Zipf-like skew (a few words are in most rows)."""
    cumulative = list(itertools.accumulate(1 / (i + 1) for i in range(len(vocab))))  # (the same draws as weights)
    out = []
    for _ in range(n):
        out.append(" ".join(rng.choices(vocab, cum_weights=cumulative, k=rng.randint(8, 16))) + ".")
    return out


def build(location: str, args: argparse.Namespace,
          embedder: Any) -> tuple[dict[str, Any], list[str], list[str], np.ndarray]:
    rng = random.Random(7)
    vocab = vocabulary(rng, args.vocabulary)
    others = max(1, args.others)
    per_other = (args.rows - args.agent_units) // others
    plan = [("agent-0", args.agent_units)] + [(f"other-{i}", per_other) for i in range(others)]
    vectors_rng = np.random.default_rng(7)
    basis = vectors_rng.standard_normal((LATENT, embedder.dim), dtype=np.float32) / np.sqrt(LATENT)
    rows = write_s = vector_s = 0.0
    sample: list[str] = []
    keys: list[str] = []  # agent-0's rows and their vectors, for the exact search quality is measured against
    matrices: list[np.ndarray] = []
    with (open_store(location, create=True) if not args.existing else Unwritten()) as store:
        store.vectors.check_model(embedder, record=True)  # the model and dimension (on PostgreSQL: the HNSW index)
        if args.bulk and not args.existing:
            drop_index(store)
        for agent, count in plan:
            for start in range(0, count, args.chunk):
                batch = texts(rng, vocab, min(args.chunk, count - start))
                units = [MemoryUnit(agent_id=agent, unit_id=f"u{start + i}", source_id=f"u{start + i}", text=t,
                                    ts="2026-01-01T00:00:00Z") for i, t in enumerate(batch)]
                if agent == "agent-0":
                    sample.extend(batch[:: max(1, len(batch) // 50)])
                    keys.extend(f"u{start + i}" for i in range(len(units)))
                started = time.perf_counter()
                store.upsert_units(units)
                write_s += time.perf_counter() - started
                matrix = (embedder.passages(batch) if args.vectors == "model"
                          else unit_vectors(vectors_rng, len(units), basis, args.vectors))
                if agent == "agent-0":
                    matrices.append(matrix)
                started = time.perf_counter()
                sql, value = store.connection.sql(SET_VECTOR), store.vectors.column.value
                store.connection.write([agent], [(sql, (value(v), agent, f"unit:{u.unit_id}", text_digest(u.text)))
                                                 for u, v in zip(units, matrix)])
                vector_s += time.perf_counter() - started
                rows += len(units)
            print(f"  {agent}: {count} rows ({rows:.0f} in all, {rows / (write_s + vector_s):.0f} rows/s)",
                  file=sys.stderr, flush=True) if agent == "agent-0" or int(agent.split("-")[1]) % 100 == 99 else None
        index_s = index(store, embedder.dim) if args.bulk and not args.existing else 0.0
    return {"rows": int(rows), "rows_per_s_text": rows / write_s, "rows_per_s_vectors": rows / vector_s,
            "rows_per_s": rows / (write_s + vector_s + index_s), "build_s": write_s + vector_s + index_s,
            "index_s": index_s, "vectors": args.vectors}, sample, keys, np.concatenate(matrices)


class Unwritten:
    """(--existing) A store that takes the build's writes and keeps none: the rows are already there."""

    def __enter__(self) -> Unwritten:
        return self

    def __exit__(self, *_exc: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self  # (any part's any method: does nothing)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def unit_vectors(rng: np.random.Generator, n: int, basis: np.ndarray, kind: str) -> np.ndarray:
    """n unit vectors: random, or of low intrinsic dimension (a gaussian of len(basis) dimensions through
    `basis`, plus noise of NOISE per dimension)."""
    dim = basis.shape[1]
    if kind == "random":
        matrix = rng.standard_normal((n, dim), dtype=np.float32)
    else:
        matrix = rng.standard_normal((n, len(basis)), dtype=np.float32) @ basis
        matrix += NOISE * rng.standard_normal((n, dim), dtype=np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def drop_index(store: Any) -> None:
    """(--bulk) No HNSW index while the rows go in: it is built after, as for a store converted from bytes."""
    from flink_memory.store.pgvector import BUCKETS, INDEX

    if getattr(store.connection, "vector_kind", None) is not None and store.connection.vector_kind.extension:
        store.connection.run(lambda conn: [conn.execute(f"DROP INDEX IF EXISTS {INDEX}_{b}") for b in range(BUCKETS)])


def index(store: Any, dim: int) -> float:
    """(--bulk) Build the HNSW index over the loaded vectors; its seconds."""
    from flink_memory.store import pgvector

    if getattr(store.connection, "vector_kind", None) is None or not store.connection.vector_kind.extension:
        return 0.0
    started = time.perf_counter()
    store.connection.run(lambda conn: pgvector.create_index(conn, dim))
    print(f"  HNSW index built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return time.perf_counter() - started


def questions(sample: list[str], n: int, seed: int = 11) -> list[str]:
    """Up to `n` distinct questions, each three words of one of the sampled texts ("What about w1 w2 w3?"):
    one per text while the texts last, then more from the same texts (other words) until a pass over them
    finds no new one. (A fixed 50 passes gave 2 396 questions from 50 texts: a service fast enough asked more
    in a short run, so some twice.)"""
    rng = random.Random(seed)
    found: dict[str, None] = {}
    sources = rng.sample(sample, min(n, len(sample)))
    while True:
        before = len(found)
        for text in sources:
            words = text.rstrip(".").split()
            found.setdefault("What about " + " ".join(rng.sample(words, 3)) + "?")
            if len(found) == n:
                return list(found)
        if len(found) == before:
            return list(found)
        sources = sample


def measure(location: str, embedder: Any, questions: list[str], mode: str, diversity: float) -> dict[str, Any]:
    """Latency of recall in one mode; every mode embeds its questions anew (the embedder's cache would serve
    the modes after the first, leaving the question's embedding out of their timings)."""
    embedder._cache.clear()
    with open_store(location, embedder=embedder) as store:
        started = time.perf_counter()
        store.recall("agent-0", "warm up the first question", k=5, mode=mode)
        first_ms = 1000 * (time.perf_counter() - started)
        times = []
        for question in questions:
            started = time.perf_counter()
            hits = store.recall("agent-0", question, k=5, mode=mode, diversity=diversity)
            times.append(1000 * (time.perf_counter() - started))
            assert hits, question
    times.sort()
    return {"mode": mode, "diversity": diversity, "queries": len(times), "first_ms": first_ms,
            "p50_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))], "mean_ms": statistics.fmean(times)}


# One mode's recall in a process of its own, whose flink_memory is the checkout on its PYTHONPATH (imported
# first, so this script's own path entry does not take its place).
RUN = """
import json, sys
import flink_memory
sys.path.insert(0, sys.argv[1])
import recall_latency
from flink_memory.config import load_config
from flink_memory.embeddings import embedder_for
spec = json.loads(open(sys.argv[2]).read())
embedder = embedder_for(load_config(None, [], environ={}).embeddings)
row = recall_latency.measure(spec["location"], embedder, spec["questions"], spec["mode"], spec["diversity"])
print(json.dumps({**row, "module": flink_memory.__file__}))
"""


def measure_in(checkout: Path, spec: Path) -> dict[str, Any]:
    """`measure` run by `checkout`'s code (a process of its own)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", RUN, str(Path(__file__).parent), str(spec)], env=env,
                          cwd=checkout, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the recall of {checkout} failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if not row.pop("module").startswith(str(checkout)):
        raise SystemExit(f"{checkout}'s run did not import its own flink_memory")
    return row


def against(baseline: Path, location: str, asked: list[str], modes: list[tuple[str, float]], rounds: int,
            workdir: Path) -> list[dict[str, Any]]:
    """Each mode measured by the baseline and this checkout in turn, `rounds` times."""
    results = []
    for mode, diversity in modes:
        spec = workdir / "spec.json"
        spec.write_text(json.dumps({"location": location, "questions": asked, "mode": mode, "diversity": diversity}))
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
        for turn in range(rounds):
            sides = [("baseline", baseline), ("current", ROOT)]
            for side, checkout in sides if turn % 2 == 0 else sides[::-1]:
                runs[side].append(measure_in(checkout, spec))
        ratios = [c["p50_ms"] / b["p50_ms"] for b, c in zip(runs["baseline"], runs["current"], strict=True)]
        row = {"mode": mode, "diversity": diversity, "runs": runs, "p50_ratios": [round(r, 3) for r in ratios],
               "median_p50_ratio": round(statistics.median(ratios), 3)}
        results.append(row)
        latencies = {side: ", ".join("{p50_ms:.1f}/{p99_ms:.1f}".format(**r) for r in rows)
                     for side, rows in runs.items()}
        print(f"{mode:8s} diversity {diversity:g}: p50/p99 ms, baseline {latencies['baseline']}; current "
              f"{latencies['current']}; current / baseline p50 {', '.join(f'{r:.3f}' for r in ratios)}, median "
              f"{row['median_p50_ratio']:.3f}", flush=True)
    return results


def agreement(location: str, embedder: Any, questions: list[str], keys: list[str], matrix: np.ndarray) -> float:
    """The share of the exact top 5 (by cosine over the agent's vectors) that vector recall returns."""
    found = 0
    with open_store(location, embedder=embedder) as store:
        for question in questions:
            scores = matrix @ embedder.query(question)
            exact = {keys[i] for i in np.argsort(-scores)[:5]}
            found += len(exact & {h.node_id for h in store.recall("agent-0", question, k=5, mode="vector")})
    return found / (5 * len(questions))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--agent-units", type=int, default=100_000)
    parser.add_argument("--others", type=int, default=900, help="other agents sharing the rest of the rows")
    parser.add_argument("--vocabulary", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=5000, help="units per upsert_units call")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--store", help="SQLite path or postgresql:// URL (default: a temporary SQLite file)")
    parser.add_argument("--vectors", choices=("model", "structured", "random"), default="model",
                        help="model: the texts' vectors by the configured model; else synthetic (see above)")
    parser.add_argument("--bulk", action="store_true", help="PostgreSQL: build the HNSW index after the rows")
    parser.add_argument("--existing", action="store_true",
                        help="the store was built by this script with the same arguments: measure only")
    parser.add_argument("--diversity", type=float, nargs="+", default=[1.0],
                        help="recall.diversity values to measure in turn (e.g. 0 1: relevance alone as the baseline)")
    parser.add_argument("--baseline", help="also measure this revision's recall, in turns with this checkout's")
    parser.add_argument("--rounds", type=int, default=3, help="--baseline: turns of each side per mode")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--embeddings-model", help="this embeddings.model in place of the default's (not with "
                        "--baseline); with a transformer, --vectors structured (it would embed for hours)")
    args = parser.parse_args(argv)
    if args.embeddings_model and args.baseline:
        parser.error("--embeddings-model and --baseline do not go together")
    overrides = [f"embeddings.model={args.embeddings_model}"] if args.embeddings_model else []
    embedder = embedder_for(load_config(None, overrides, environ={}).embeddings)
    assert embedder is not None
    workdir = Path(tempfile.mkdtemp(prefix="recall-latency-"))
    location = args.store or str(workdir / "memory.sqlite")
    built, sample, keys, matrix = build(location, args, embedder)
    print(f"built {built['rows']} rows in {built['build_s']:.0f} s: {built['rows_per_s']:.0f} rows/s "
          f"({built['rows_per_s_text']:.0f} rows/s text and index, {built['rows_per_s_vectors']:.0f} rows/s vectors)",
          flush=True)
    asked = questions(sample, args.queries)
    results = {"store": "postgresql" if "://" in location else "sqlite", "agent_units": args.agent_units,
               "model": embedder.name, **built, "recall": []}
    for mode, diversity in [(m, d) for m in ("hybrid", "keyword", "vector") for d in args.diversity]:
        row = measure(location, embedder, asked, mode, diversity)
        results["recall"].append(row)
        print(f"{mode:8s} diversity {diversity:g}: p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms  "
              f"mean {row['mean_ms']:.1f} ms  "
              f"(first recall {row['first_ms']:.0f} ms, {row['queries']} questions)", flush=True)
    if args.baseline:
        with worktree(args.baseline) as baseline:
            results["against"] = {"baseline": args.baseline, "modes": against(
                baseline, location, asked, [(row["mode"], row["diversity"]) for row in results["recall"]],
                args.rounds, workdir)}
    results["vector_top5_agreement"] = agreement(location, embedder, asked, keys, matrix)
    print(f"vector recall returns {results['vector_top5_agreement']:.3f} of the exact top 5", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
