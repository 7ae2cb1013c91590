"""Questions with several answers: how many of the answers that exist recall's top 5 holds, with results that
cover distinct memory (recall.diversity 1, the default) against relevance alone (0, the baseline), in the same
run, on SQLite and on PostgreSQL, by keyword and hybrid. The store is built as the job builds it with an ideal
extractive summarizer (benchmarks/recall.py --ideal: every note a memory unit; batch nodes of 10 notes, merges
of 4 and a global hold their notes' text), and again with the scripted provider's summaries (the names and
numbers of what a node covers: short texts, as a terse model writes, which rank high by keyword).

Per agent: facts of one kind planted several times in their own notes ("The vault code of the garage is 4821.",
four of them; rebooked flights; what one colleague said; what was lent to whom), asked once each ("What are my
vault codes?"); and persons with several facts each, asked about as a whole ("What do I know about Kamirelso?").
An answer counts when its text (a unique name or number) is in one of the first 5 results. The one-answer
questions of benchmarks/recall.py --ideal (literal and in other words) are measured the same way, to show that
they stay where they are, and each recall's time is averaged per setting.

Run: `python benchmarks/recall_diverse.py [--agents 2] [--json PATH]` (a few minutes: the embedding model).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recall import PERSON_FACTS, PERSON_NOTES, Names, ideal_nodes, people_dataset  # noqa: E402
from scripted_server import _FACT  # noqa: E402

from flink_memory.config import load_config  # noqa: E402
from flink_memory.embeddings import embedder_for  # noqa: E402
from flink_memory.records import MemoryUnit  # noqa: E402
from flink_memory.store import open_store  # noqa: E402

PLACES = ["garage", "cellar", "office", "gym locker", "bike shed", "attic", "boathouse", "studio"]
# (statement, question, answer kind, how many): one question per kind, every planted answer expected
KINDS = [
    ("The vault code of the {p} is {a}.", "What are my vault codes?", "number", 4),
    ("My flight {a} was rebooked to a later departure.", "Which of my flights were rebooked?", "number", 3),
    ("{c} said the launch of project {a} slips a week.", "What did {c} say?", "name", 3),
    ("I lent my {p} key to {a}.", "Who did I lend keys to?", "name", 3),
]
FILLER = ["The weather was grey all morning.", "Lunch was soup and bread again.", "The train was on time today.",
          "I watered the plants on the balcony.", "The meeting ended early for once.",
          "I read two chapters before bed.", "The printer jammed twice this afternoon."]
K = 5
MAX_ITEMS, FAN_IN = 10, 4


def multi_dataset(agents: int, people: int, seed: int = 11
                  ) -> tuple[list[MemoryUnit], list[tuple[str, str, list[str]]]]:
    """Notes per agent and the questions with their answers: (agent, question, answers)."""
    rng = random.Random(seed)
    names = Names(rng)
    numbers = iter(rng.sample(range(1000, 10_000_000), 10_000))
    units: list[MemoryUnit] = []
    asked: list[tuple[str, str, list[str]]] = []
    for a in range(agents):
        agent, notes = f"agent-{a}", []
        colleague = names()
        for statement, question, kind, count in KINDS:
            answers = [names() if kind == "name" else str(next(numbers)) for _ in range(count)]
            places = rng.sample(PLACES, count)
            notes += [statement.format(a=answer, p=place, c=colleague) for answer, place in zip(answers, places)]
            asked.append((agent, question.format(c=colleague), answers))
        for _ in range(people):
            subject, answers = names(), []
            for statement, _literal, _other, kind in PERSON_FACTS:
                answer = names() if kind == "name" else str(next(numbers))
                notes.append(statement.format(s=subject, a=answer))
                answers.append(answer)
            notes += [note.format(s=subject) for note in rng.sample(PERSON_NOTES, 2)]
            asked.append((agent, f"What do I know about {subject}?", answers))
        notes += [rng.choice(FILLER) for _ in range(len(notes) // 2)]
        rng.shuffle(notes)
        units += [MemoryUnit(agent_id=agent, unit_id=f"n{i}", source_id=f"n{i}", text=text,
                             ts=f"2026-03-{1 + i * 28 // len(notes):02d}T10:{i % 60:02d}:00Z")
                  for i, text in enumerate(notes)]
    return units, asked


def kept_nodes(units: list[MemoryUnit]) -> list[Any]:
    """The nodes with the scripted provider's summaries instead (tests/scripted_server.py: the names and numbers
    of what they cover, deduplicated): short texts, as a terse model writes, which rank high by keyword."""
    nodes = ideal_nodes(units, MAX_ITEMS, FAN_IN)
    return [n.model_copy(update={"text": "Summary: " + " ".join(dict.fromkeys(_FACT.findall(n.text)))}) for n in nodes]


SUMMARIZERS = {"extractive": lambda units: ideal_nodes(units, MAX_ITEMS, FAN_IN), "names and numbers": kept_nodes}


def build(location: str, units: list[MemoryUnit], embedder: Any, summarizer: str) -> Any:
    store = open_store(location, create=True, embedder=embedder)
    store.upsert_units(units)
    store.upsert(SUMMARIZERS[summarizer](units))
    return store


def timed_recall(store: Any, agent: str, question: str, mode: str, diversity: float, seconds: list[float]) -> list[Any]:
    began = time.perf_counter()
    hits = store.recall(agent, question, k=K, mode=mode, diversity=diversity)
    seconds.append(time.perf_counter() - began)
    return hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--people", type=int, default=6, help="persons with several facts, per agent")
    parser.add_argument("--one-answer-people", type=int, default=12, help="benchmarks/recall.py --ideal's persons")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from pgserver import start_postgres, stop_postgres

    embedder = embedder_for(load_config().embeddings)
    multi_units, multi_asked = multi_dataset(args.agents, args.people)
    one_units, one_asked = people_dataset(args.agents, args.one_answer_people)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flink-memory-diverse-") as tmp:
        pg_base = Path(tempfile.mkdtemp(prefix="flink-memory-pg-"))
        pg_url = start_postgres(str(pg_base))
        try:
            import psycopg

            for summarizer, backend in [(s, b) for s in SUMMARIZERS for b in ("sqlite", "postgresql")]:
                locations = {}
                for name in ("multi", "one"):
                    database = f"diverse_{name}_{len(rows)}"
                    with psycopg.connect(pg_url, autocommit=True) as conn:
                        conn.execute(f"CREATE DATABASE {database}")
                    locations[name] = {"sqlite": str(Path(tmp) / f"{database}.sqlite"),
                                       "postgresql": pg_url.rsplit("/", 1)[0] + f"/{database}"}
                multi = build(locations["multi"][backend], multi_units, embedder, summarizer)
                one = build(locations["one"][backend], one_units, embedder, summarizer)
                for mode in ("keyword", "hybrid"):
                    # (a warm-up: every question embedded once, each agent's vectors loaded, before any timing)
                    for agent, question, _ in multi_asked:
                        multi.recall(agent, question, k=K, mode=mode)
                    for fact in one_asked:
                        for question in (fact.literal, fact.other_words):
                            one.recall(fact.agent_id, question, k=K, mode=mode)
                    for diversity in (0.0, 1.0):
                        seconds: list[float] = []
                        found = existing = 0
                        for agent, question, answers in multi_asked:
                            text = " ".join(h.text for h in timed_recall(multi, agent, question, mode, diversity,
                                                                           seconds))
                            found += sum(answer in text for answer in answers)
                            existing += len(answers)
                        at5 = {}
                        for wording in ("literal", "other_words"):
                            hits = 0
                            for fact in one_asked:
                                got = timed_recall(one, fact.agent_id, getattr(fact, wording), mode, diversity, seconds)
                                hits += any(fact.answer in h.text for h in got)
                            at5[wording] = hits / len(one_asked)
                        rows.append({"summaries": summarizer, "store": backend, "mode": mode, "diversity": diversity,
                                     "answers_found": found, "answers": existing,
                                     "multi_answer_share": round(found / existing, 3),
                                     "one_answer_literal": round(at5["literal"], 3),
                                     "one_answer_other_words": round(at5["other_words"], 3),
                                     "recall_ms": round(1000 * statistics.mean(seconds), 2)})
                        r = rows[-1]
                        print(f"[diverse] {summarizer:<17} {backend:<10} {mode:<7} diversity {diversity:.0f}: "
                              f"answers in the top {K} "
                              f"{found}/{existing} = {r['multi_answer_share']:.2f}; one answer: literal "
                              f"{r['one_answer_literal']:.2f}, other words {r['one_answer_other_words']:.2f}; "
                              f"{r['recall_ms']:.1f} ms per recall", flush=True)
                multi.close()
                one.close()
        finally:
            stop_postgres(str(pg_base))
    lines = [f"| summaries | store | ranking | diversity | answers in the top {K} (of all that exist) | one answer, "
             f"literal | one answer, other words | ms per recall |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['summaries']} | {r['store']} | {r['mode']} | {r['diversity']:.0f} | "
              f"{r['answers_found']}/{r['answers']} = "
              f"{r['multi_answer_share']:.2f} | {r['one_answer_literal']:.2f} | {r['one_answer_other_words']:.2f} | "
              f"{r['recall_ms']:.1f} |" for r in rows]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"questions": len(multi_asked), "embedding_model": embedder.name,
                                         "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
