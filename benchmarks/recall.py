"""Recall of planted facts: the store's `recall` (top k live nodes) against the agent's global summary alone.

Each agent's input is a stream of notes. A planted fact is one note with a subject, a relation and an answer
("Kamirelso paid 4821937 EUR for the boat."); its distractors are similar sentences about other subjects
(the same templates, other names and answers), and `--mentions` further notes name the fact's subject in an
unrelated context, so the name alone does not single out the right node. Answers are names or numbers,
unique across the data set, so a text that holds one kept it rather than re-creating it.

After the job ran (the shipped pipeline, `build_job`), every planted fact is asked as a natural question
("How much did Kamirelso pay for the boat?"). It counts as recalled at k when its answer is in the text of one
of the first k nodes `store.recall` returns, and as kept by the global summary when its answer is in the
agent's current global node. "in any live node" is the ceiling for recall: the facts the summaries kept.

    python benchmarks/recall.py --sizes 100 1000                                # scripted provider
    python benchmarks/recall.py --ideal                                         # no job: see below
    python benchmarks/recall.py --provider embedded --sizes 40 --agents 1       # the bundled SmolLM2
    python benchmarks/recall.py --base-url http://host:8000/v1 --model my-model --sizes 200

`--ideal` runs no job: people with facts asked in the memory's words and in other words (only the person's
name shared with the memory), stored as the job would store them with an ideal extractive summarizer (every
note is a memory unit; batch, merge and global nodes hold their notes' text, so the ceiling is 1.00), and
recall@k measured by keyword, by vector and hybrid (weighted and reciprocal rank fusion) on the same store,
with the configured embedding model (embeddings.provider, default the embedded one), or with each of
`--models` side by side. Each fact is asked three ways: literal, in other words, and in other words again
with questions kept out of every choice of the static model's settings (`held out`).

    python benchmarks/recall.py --ideal --models e5-static all-minilm-l6-v2 multilingual-e5-small
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobkit import apply_store, batch_units, config_for, execute, write_lines  # noqa: E402
from strategies import add_job_arguments, fact_name, provider, settings  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for  # noqa: E402
from flink_memory.records import MemoryUnit, SummaryNode  # noqa: E402
from flink_memory.store import open_store  # noqa: E402

THINGS = ["boat", "car", "piano", "tractor", "laptop", "bicycle", "camera", "sofa"]
# (statement, question); {s} the subject, {a} the answer, {t} a thing. Answers are names or numbers.
TEMPLATES = [
    ("{s} paid {a} EUR for the {t}.", "How much did {s} pay for the {t}?", "number"),
    ("{s} moved to {a} last spring.", "Where did {s} move to?", "name"),
    ("The locker code of {s} is {a}.", "What is the locker code of {s}?", "number"),
    ("{s} hired {a} as an assistant.", "Who did {s} hire as an assistant?", "name"),
    ("{s} booked room {a} at the hotel.", "Which room did {s} book at the hotel?", "number"),
]
MENTIONS = ["{s} joined the weekly sync and listened.", "{s} asked about the schedule for the {t}.",
            "Someone sent {s} the usual status update.", "{s} was out of the office on Friday."]


@dataclass(frozen=True)
class Fact:
    agent_id: str
    question: str
    answer: str


class Names:
    """Unique invented names (never a dictionary word, so no stemming or stop list can touch them)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def __call__(self) -> str:
        name = fact_name(self.rng)
        while name in self.used:
            name = fact_name(self.rng)
        self.used.add(name)
        return name


def dataset(agents: int, items_per_agent: int, distractors: int, mentions: int,
            seed: int = 5) -> tuple[list[dict[str, Any]], list[Fact]]:
    """Notes per agent (facts, distractors and mentions shuffled together) and the planted facts."""
    rng = random.Random(seed)
    names = Names(rng)
    numbers = iter(rng.sample(range(100_000, 10_000_000), agents * items_per_agent * 2))
    per_fact = 1 + distractors + mentions
    records: list[dict[str, Any]] = []
    facts: list[Fact] = []

    def answer(kind: str) -> str:
        return names() if kind == "name" else str(next(numbers))

    for a in range(agents):
        agent = f"agent-{a}"
        notes: list[str] = []
        for _ in range(max(1, items_per_agent // per_fact)):
            statement, question, kind = rng.choice(TEMPLATES)
            subject, thing = names(), rng.choice(THINGS)
            fact_answer = answer(kind)
            notes.append(statement.format(s=subject, a=fact_answer, t=thing))
            facts.append(Fact(agent, question.format(s=subject, t=thing), fact_answer))
            for _ in range(distractors):  # the same sentence about another subject, with another answer
                notes.append(statement.format(s=names(), a=answer(kind), t=rng.choice(THINGS)))
            for _ in range(mentions):
                notes.append(rng.choice(MENTIONS).format(s=subject, t=rng.choice(THINGS)))
        while len(notes) < items_per_agent:  # pad with distractors of any template
            statement, _, kind = rng.choice(TEMPLATES)
            notes.append(statement.format(s=names(), a=answer(kind), t=rng.choice(THINGS)))
        rng.shuffle(notes)
        for i, text in enumerate(notes):
            day, minute = 1 + i * 28 // len(notes), i % 60
            records.append({"agent_id": agent, "id": f"n{i}", "text": text,
                            "ts": f"2026-02-{day:02d}T09:{minute:02d}:00Z"})
    return records, facts


def measure(store: Any, facts: list[Fact], k: int) -> dict[str, Any]:
    """Share of facts whose answer is in the top 1 / top k recalled nodes, in the global, in any live node."""
    at_1 = at_k = in_global = in_any = 0
    seconds = 0.0
    texts = {agent: [n.text for n in store.nodes(agent)] for agent in {f.agent_id for f in facts}}
    currents = {agent: store.current(agent) for agent in texts}
    for fact in facts:
        started = time.perf_counter()
        hits = store.recall(fact.agent_id, fact.question, k=k)
        seconds += time.perf_counter() - started
        found = [fact.answer in hit.text for hit in hits]
        at_1 += bool(found[:1] and found[0])
        at_k += any(found)
        current = currents[fact.agent_id]
        in_global += current is not None and fact.answer in current.text
        in_any += any(fact.answer in text for text in texts[fact.agent_id])
    total = len(facts)
    return {"facts": total, "recall_at_1": at_1 / total, "recall_at_k": at_k / total,
            "global_alone": in_global / total, "in_any_live_node": in_any / total,
            "query_ms": 1000 * seconds / total, "live_nodes_per_agent": sum(map(len, texts.values())) / len(texts)}


# (statement, question in the memory's words, question in other words: only {s} shared, kind of answer)
PERSON_FACTS = [
    ("{s} pays {a} EUR in rent every month.", "How much rent does {s} pay every month?",
     "What does the apartment of {s} cost?", "number"),
    ("{s} is married to {a}.", "Who is {s} married to?", "What is the name of the spouse of {s}?", "name"),
    ("{s} takes {a} tablets for blood pressure every morning.", "Which tablets does {s} take for blood pressure?",
     "What medication is {s} on?", "name"),
    ("{s} adopted a beagle puppy and named it {a}.", "What did {s} name the beagle puppy?",
     "What is the dog of {s} called?", "name"),
    ("{s} was born in the town of {a}.", "In which town was {s} born?", "Where does {s} come from originally?",
     "name"),
    ("{s} is allergic to {a} pollen.", "What pollen is {s} allergic to?", "Which plant makes {s} sneeze?", "name"),
    ("{s} drives a car with the licence plate {a}.", "What is the licence plate of the car {s} drives?",
     "What registration does the vehicle of {s} have?", "number"),
    ("The phone number of {s} is {a}.", "What is the phone number of {s}?", "How can I call {s}?", "number"),
]
# A second set of questions in other words, one per fact of PERSON_FACTS, written after the embedding models
# were chosen and never used to choose the static model's settings (`held out`).
HELD_OUT = ["How much money goes to the landlord of {s} each month?", "Who is the husband or wife of {s}?",
            "Which drug does {s} use against hypertension?", "What is the name of the pet of {s}?",
            "What is the birthplace of {s}?", "What gives {s} hay fever?",
            "Which number is on the vehicle of {s}?", "What number do I dial to reach {s}?"]
PERSON_NOTES = ["{s} joined the weekly sync and listened.", "{s} asked about the schedule for the trip.",
                "Someone sent {s} the usual status update.", "{s} was out of the office on Friday."]


@dataclass(frozen=True)
class Asked:
    agent_id: str
    literal: str
    other_words: str
    answer: str
    held_out: str


def people_dataset(agents: int, people: int, seed: int = 5) -> tuple[list[MemoryUnit], list[Asked]]:
    """Per agent, `people` persons with every fact of PERSON_FACTS and three unrelated notes each, shuffled."""
    rng = random.Random(seed)
    names = Names(rng)
    numbers = iter(rng.sample(range(100_000, 10_000_000), agents * people * len(PERSON_FACTS)))
    units: list[MemoryUnit] = []
    asked: list[Asked] = []
    for a in range(agents):
        agent, notes = f"agent-{a}", []
        for _ in range(people):
            subject = names()
            for (statement, literal, other, kind), held_out in zip(PERSON_FACTS, HELD_OUT):
                answer = names() if kind == "name" else str(next(numbers))
                notes.append(statement.format(s=subject, a=answer))
                asked.append(Asked(agent, literal.format(s=subject), other.format(s=subject), answer,
                                   held_out.format(s=subject)))
            notes += [note.format(s=subject) for note in rng.sample(PERSON_NOTES, 3)]
        rng.shuffle(notes)
        units += [MemoryUnit(agent_id=agent, unit_id=f"n{i}", source_id=f"n{i}", text=text,
                             ts=f"2026-02-{1 + i * 28 // len(notes):02d}T09:{i % 60:02d}:00Z")
                  for i, text in enumerate(notes)]
    return units, asked


def ideal_nodes(units: list[MemoryUnit], max_items: int, fan_in: int) -> list[SummaryNode]:
    """What the job writes with an extractive summarizer that keeps everything: batch nodes of `max_items`
    units, merges of `fan_in` batch nodes, one global per agent."""
    def node(agent: str, node_id: str, kind: str, level: int, children: list[Any], version: int | None = None
             ) -> SummaryNode:
        return SummaryNode(agent_id=agent, node_id=node_id, kind=kind, level=level, version=version,
                           children=[c[0] for c in children], text=" ".join(c[1] for c in children),
                           item_count=sum(c[2] for c in children), model="extractive", first_ts=children[0][3],
                           last_ts=children[-1][4])
    nodes: list[SummaryNode] = []
    for agent in sorted({u.agent_id for u in units}):
        mine = [(u.unit_id, u.text, 1, u.ts, u.ts) for u in units if u.agent_id == agent]
        batches = [node(agent, f"batch-{i // max_items + 1}", "batch", 1, mine[i:i + max_items])
                   for i in range(0, len(mine), max_items)]
        merges = [node(agent, f"merge-2-{i // fan_in + 1}", "merge", 2,
                       [(b.node_id, b.text, b.item_count, b.first_ts, b.last_ts) for b in batches[i:i + fan_in]])
                  for i in range(0, len(batches), fan_in)]
        top = [(m.node_id, m.text, m.item_count, m.first_ts, m.last_ts) for m in merges]
        nodes += [*batches, *merges, node(agent, "global-v1", "global", 3, top, version=1)]
    return nodes


MODES = [("keyword", "weighted"), ("vector", "weighted"), ("hybrid", "weighted"), ("hybrid", "rrf")]


WORDINGS = ("literal", "other_words", "held_out")


def run_ideal(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The ideal store once per embedding model of `--models` (the configured one when none is given)."""
    units, asked = people_dataset(args.agents, args.people)
    nodes = ideal_nodes(units, args.max_items, args.fan_in)
    models = []
    for position, model in enumerate(args.models or [None]):
        overrides = args.set + ([f"embeddings.model={model}"] if model else [])
        embedder = embedder_for(load_config(overrides=overrides).embeddings)
        started = time.perf_counter()
        with open_store(str(workdir / f"memory-{position}.sqlite"), create=True, embedder=embedder) as store:
            store.upsert_units(units)
            store.upsert(nodes)
            build_s = time.perf_counter() - started
            rows = []
            for mode, fusion in MODES:
                if mode != "keyword" and embedder is None:
                    continue
                for wording in WORDINGS:
                    rows.append(ideal_row(store, asked, args.k, mode, fusion, wording))
                    print(f"[recall] {embedder.name if embedder else 'none':<24} {rows[-1]['mode']:<17} "
                          f"{wording:<11} recall@1 {rows[-1]['recall_at_1']:.2f}  recall@{args.k} "
                          f"{rows[-1]['recall_at_k']:.2f}  {rows[-1]['query_ms']:.1f} ms", flush=True)
        models.append({"embedding_model": embedder.name if embedder else None, "build_s": build_s,
                       "texts_embedded": embedder.embedded if embedder else 0, "rows": rows})
    return {"units": len(units), "nodes": len(nodes), "facts": len(asked), "k": args.k, "models": models}


def ideal_row(store: Any, asked: list[Asked], k: int, mode: str, fusion: str, wording: str) -> dict[str, Any]:
    at_1 = at_k = 0
    seconds = 0.0
    for fact in asked:
        began = time.perf_counter()
        hits = store.recall(fact.agent_id, getattr(fact, wording), k=k, mode=mode, fusion=fusion)
        seconds += time.perf_counter() - began
        found = [fact.answer in h.text for h in hits]
        at_1 += bool(found[:1] and found[0])
        at_k += any(found)
    return {"mode": mode if mode != "hybrid" else f"hybrid ({fusion})", "wording": wording,
            "recall_at_1": at_1 / len(asked), "recall_at_k": at_k / len(asked),
            "query_ms": 1000 * seconds / len(asked)}


def ideal_markdown(results: dict[str, Any]) -> str:
    k, models = results["k"], results["models"]
    lines = [f"{results['facts']} facts, {results['units']} notes (memory units) and {results['nodes']} nodes; "
             + "; ".join(f"{m['embedding_model']}: store built and embedded in {m['build_s']:.1f} s "
                         f"({m['texts_embedded']} texts)" for m in models) + ".", "",
             "| ranking | question | " + " | ".join(f"{m['embedding_model']} recall@1 / @{k} / ms" for m in models)
             + " |", "|---|---|" + "---|" * len(models)]
    for i, row in enumerate(models[0]["rows"]):
        cells = [f"{m['rows'][i]['recall_at_1']:.2f} / {m['rows'][i]['recall_at_k']:.2f} / "
                 f"{m['rows'][i]['query_ms']:.1f}" if i < len(m["rows"]) else "n/a" for m in models]
        lines.append(f"| {row['mode']} | {row['wording'].replace('_', ' ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_size(base_url: str, args: argparse.Namespace, size: int, workdir: Path) -> dict[str, Any]:
    from flink_memory.flink.pipeline import build_job
    from flink_memory.outputs import read_outputs

    records, facts = dataset(args.agents, size, args.distractors, args.mentions)
    input_path = write_lines(workdir / f"{size}-input" / "part-0.jsonl", records)
    output = workdir / f"{size}-output"
    config = config_for(base_url, *settings(base_url, args))
    started = time.perf_counter()
    execute(build_job(config, str(input_path), str(output)), f"bench-recall-{size}", timeout_s=args.job_timeout_s)
    apply_store(config, output)
    wall = time.perf_counter() - started
    covered = sum(batch_units(read_outputs(str(output))["summaries"]).values())
    if covered != len(records):
        raise SystemExit(f"{size}: {covered} of {len(records)} notes in batch nodes")
    with open_store(str(output / "memory.sqlite")) as store:
        measured = measure(store, facts, args.k)
    return {"items_per_agent": size, "wall_s": wall, **measured}


def markdown(results: dict[str, Any]) -> str:
    k = results["k"]
    lines = [f"Provider: {results['provider']}, {results['agents']} agent(s), {results['distractors']} distractors "
             f"and {results['mentions']} mentions per fact, batch {results['max_items']}, fan-in {results['fan_in']}, "
             f"{results['max_output_tokens']} output tokens.", "",
             f"| items/agent | facts | live nodes/agent | in any live node | store recall@1 | store recall@{k} "
             f"| global summary alone | recall@{k} / global | query ms | job s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        ratio = f"{row['recall_at_k'] / row['global_alone']:.1f}x" if row["global_alone"] else "n/a (global 0)"
        lines.append(f"| {row['items_per_agent']} | {row['facts']} | {row['live_nodes_per_agent']:.0f} | "
                     f"{row['in_any_live_node']:.2f} | {row['recall_at_1']:.2f} | {row['recall_at_k']:.2f} | "
                     f"{row['global_alone']:.2f} | {ratio} | {row['query_ms']:.1f} | {row['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="notes per agent")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--distractors", type=int, default=4, help="similar notes about other subjects, per fact")
    parser.add_argument("--mentions", type=int, default=2, help="unrelated notes naming the fact's subject")
    parser.add_argument("--k", type=int, default=5)
    add_job_arguments(parser, latency_s=0.0)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--ideal", action="store_true", help="no job: an ideal extractive summary (see above)")
    parser.add_argument("--people", type=int, default=12, help="--ideal: persons per agent")
    parser.add_argument("--models", nargs="+", help="--ideal: embedding models (embeddings.model) side by side, "
                        "e.g. e5-static multilingual-e5-small")
    parser.add_argument("--embeddings", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="--ideal: a setting of the embeddings section, e.g. embeddings.provider=none")
    args = parser.parse_args(argv)
    if args.ideal:
        with tempfile.TemporaryDirectory() as tmp:
            results = run_ideal(args, Path(tmp))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2))
        print(ideal_markdown(results))
        return 0
    results: dict[str, Any] = {"provider": args.base_url or args.provider, "agents": args.agents, "k": args.k,
                               "distractors": args.distractors, "mentions": args.mentions,
                               "max_items": args.max_items, "fan_in": args.fan_in,
                               "max_output_tokens": args.max_output_tokens, "rows": []}
    with provider(args.provider, args.base_url, args.latency, args.context_window) as base_url, \
            tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            row = run_size(base_url, args, size, Path(tmp))
            results["rows"].append(row)
            print(f"[recall] {size:>6} notes/agent  facts {row['facts']:>4}  recall@1 {row['recall_at_1']:.2f}  "
                  f"recall@{args.k} {row['recall_at_k']:.2f}  global {row['global_alone']:.2f}  "
                  f"any node {row['in_any_live_node']:.2f}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
