"""Small synthetic LongMemEval instances, in exactly the official JSON format.

The real data set cannot be downloaded on our machines. Each instance hides an evidence session (its
`has_answer` turns state the fact) among distractor sessions; a share of the questions are abstentions
(`_abs` ids) whose fact never appears.

    python benchmarks/longmemeval/synth.py --instances 6 --sessions 5 --out out/lme-synth.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

FACTS = [
    ("single-session-user", "my sister's cat", "name", "Pumpernickel", "What is the name of my sister's cat?"),
    ("single-session-user", "the new office", "floor number", "fourteen", "Which floor is the new office on?"),
    ("single-session-assistant", "the pasta recipe you gave me", "oven temperature", "220 degrees",
     "What oven temperature did you recommend for the pasta recipe?"),
    ("knowledge-update", "my gym membership", "monthly fee", "45 dollars", "How much is my gym membership now?"),
    ("temporal-reasoning", "the dentist appointment", "date", "March 3rd", "When is my dentist appointment?"),
    ("multi-session", "the book club", "current book", "Middlemarch", "Which book is my book club reading?"),
]
DISTRACTORS = [
    "Can you suggest a weekend hiking trail near a lake?", "How do I descale a coffee machine?",
    "What are good stretches after running?", "Help me write a polite email declining a meeting.",
    "Explain the difference between a Roth and a traditional IRA.", "Any tips for growing basil indoors?",
]


def lme_date(moment: datetime) -> str:
    return moment.strftime("%Y/%m/%d (%a) %H:%M")


def session(rng: random.Random, turns: int, fact: tuple[str, ...] | None, date: datetime) -> list[dict[str, Any]]:
    out = []
    evidence_at = rng.randrange(turns) if fact else -1
    for t in range(turns):
        if t == evidence_at:
            qtype, subject, attribute, value, _ = fact
            speaker = "assistant" if qtype == "single-session-assistant" else "user"
            statement = f"By the way, the {attribute} of {subject} is {value}."
            if speaker == "user":
                out.append({"role": "user", "content": statement, "has_answer": True})
                out.append({"role": "assistant", "content": "Thanks, noted.", "has_answer": False})
            else:
                out.append({"role": "user", "content": f"Remind me about {subject}?", "has_answer": False})
                out.append({"role": "assistant", "content": statement, "has_answer": True})
            continue
        question = rng.choice(DISTRACTORS)
        out.append({"role": "user", "content": question, "has_answer": False})
        out.append({"role": "assistant", "content": f"Here is a short answer about that ({date:%B %d}): "
                    + "start small, keep notes, and review them weekly. " * rng.randint(1, 3), "has_answer": False})
    return out


def instance(rng: random.Random, k: int, sessions: int, turns: int, abstention: bool) -> dict[str, Any]:
    fact = FACTS[k % len(FACTS)]
    qtype, _subject, _attribute, value, question = fact
    start = datetime(2023, 5, 1, 9, 0) + timedelta(days=7 * k)
    dates = [start + timedelta(days=d, hours=rng.randint(0, 10), minutes=rng.randint(0, 59)) for d in range(sessions)]
    evidence = -1 if abstention else rng.randrange(sessions)
    ids = [f"s{k}_{j}" if j != evidence else f"answer_s{k}_{j}" for j in range(sessions)]
    haystack = [session(rng, turns, fact if j == evidence else None, dates[j]) for j in range(sessions)]
    return {
        "question_id": f"q{k:03d}" + ("_abs" if abstention else ""),
        "question_type": qtype,
        "question": question,
        "answer": ("You did not mention this information." if abstention else value),
        "question_date": lme_date(dates[-1] + timedelta(days=1)),
        "haystack_session_ids": ids,
        "haystack_dates": [lme_date(d) for d in dates],
        "haystack_sessions": haystack,
        "answer_session_ids": [] if abstention else [ids[evidence]],
    }


def generate(instances: int, sessions: int, turns: int = 3, seed: int = 11, abstain_every: int = 4) -> list[dict]:
    rng = random.Random(seed)
    return [instance(rng, k, sessions, turns, abstention=(k % abstain_every == abstain_every - 1))
            for k in range(instances)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3, help="user/assistant exchanges per session")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(generate(args.instances, args.sessions, args.turns, args.seed), indent=1))
    print(f"wrote {args.instances} instances to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
