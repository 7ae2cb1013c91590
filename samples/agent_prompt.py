"""An agent's prompt from its live memory: the current global summary plus the nodes that match the question.

    python samples/agent_prompt.py out/sample/memory.sqlite agent-0 "Which book does the user like?"

The global summary keeps the gist of everything; recall brings back the details it had no room for.
"""

from __future__ import annotations

import sys

from flink_memory.store import MemoryStore, open_store


def memory_prompt(store: MemoryStore, agent_id: str, question: str, k: int = 5) -> str:
    current = store.current(agent_id)
    hits = store.recall(agent_id, question, k=k)
    lines = ["You are an assistant with a long-term memory. Answer from it, and say so when it has no answer.",
             "", "What you remember overall:", current.text if current else "(nothing yet)", "",
             "Memories that match the question, most relevant first:"]
    lines += [f"- ({hit.first_ts or '?'} to {hit.last_ts or '?'}) " + hit.text.replace("\n", "\n  ")
              for hit in hits] or ["- (none)"]
    lines += ["", f"Question: {question}"]
    return "\n".join(lines)


if __name__ == "__main__":
    location, agent, question = sys.argv[1:4]
    with open_store(location) as memory:
        print(memory_prompt(memory, agent, question))
