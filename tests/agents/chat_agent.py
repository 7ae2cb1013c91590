"""An agent written against Flink Agents' long-term memory API only, in the shape of its docs' example (no
flink-memory import: test_agents_ltm*.py install flink-memory as its memory with one line)."""

from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.runner_context import RunnerContext


class ChatAgent(Agent):
    """Remembers what the user says in the set "notes"; for a question, searches it and reads its summary."""

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def on_turn(event: Event, ctx: RunnerContext) -> None:
        turn = InputEvent.from_event(event).input
        memory_set = ctx.long_term_memory.get_memory_set(name="notes")
        if turn["text"].endswith("?"):
            hits = memory_set.search(query=turn["text"], limit=3)
            ctx.send_event(OutputEvent(output={
                "agent_id": turn["agent_id"], "hits": [[h.id, h.value] for h in hits],
                "items": sorted(i.value for i in memory_set.get()), "summary": memory_set.summary()}))
        else:
            ids = memory_set.add(items=turn["text"])
            ctx.send_event(OutputEvent(output={"agent_id": turn["agent_id"], "added": ids}))
