"""flink-memory as Flink Agents' long-term memory: an agent written against its memory-set API (the shape of
Flink Agents' own docs' example: `ctx.long_term_memory.get_memory_set(name)`, then the set's add, get, search),
unchanged but for the line that installs ours (`use_flink_memory`), on the local runner; a set of a key is one
flink-memory agent, `"{key}:{set}"`, so keys are isolated, and a set's summary is its tree's global summary.
(test_agents_ltm_job.py runs the same agent in a MiniCluster job.)"""

import json

import pytest
from agentkit import run_local
from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.runner_context import RunnerContext

from flink_memory.agents import AgentScopeError
from flink_memory.agents.long_term_memory import FlinkMemoryLongTermMemory, LongTermMemorySettings, use_flink_memory
from flink_memory.embeddings.static import StaticE5
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store import open_store

NOTES = {"alice": {"n1": "Alice's dog is a beagle named Rex.", "n2": "Alice lives in Lyon."},
         "bob": {"n1": "Bob's dog is a poodle named Max.", "n2": "Bob lives in Oslo."}}


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


def write_sets(path):
    """Both keys' "notes" sets as the memory job would have written them: units, a batch and a global node."""
    with open_store(str(path), create=True, embedder=StaticE5()) as store:
        for key, notes in NOTES.items():
            agent = f"{key}:notes"
            store.upsert_units([MemoryUnit(agent_id=agent, unit_id=u, source_id=u, text=t, ts="2026-01-01T00:00:00Z")
                                for u, t in notes.items()])
            store.upsert([SummaryNode(agent_id=agent, node_id="batch-000001", kind="batch", level=1,
                                      children=list(notes), text=" ".join(notes.values()), item_count=2, model="m"),
                          SummaryNode(agent_id=agent, node_id="global-000001", kind="global", level=2, version=1,
                                      children=["batch-000001"], text=f"{key.capitalize()}: summary of the notes.",
                                      item_count=2, model="m")])
    return str(path)


def test_an_agent_of_the_memory_set_api_runs_on_flink_memory_with_one_line(tmp_path):
    store = write_sets(tmp_path / "memory.sqlite")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    turns = [{"agent_id": "alice", "text": "What is my dog called?"},
             {"agent_id": "bob", "text": "What is my dog called?"},
             {"agent_id": "bob", "text": "I bought a red bike."}]
    agent = use_flink_memory(ChatAgent(), store=store, input=str(inbox))  # the one line
    alice, bob, added = run_local(agent, turns)
    assert alice["hits"][0] == ["n1", NOTES["alice"]["n1"]]
    assert not any("Bob" in text or "Max" in text for _, text in alice["hits"])  # only its own key's set
    assert bob["hits"][0] == ["n1", NOTES["bob"]["n1"]]
    assert alice["items"] == sorted(NOTES["alice"].values()) and bob["items"] == sorted(NOTES["bob"].values())
    assert alice["summary"] == "Alice: summary of the notes." and bob["summary"] == "Bob: summary of the notes."
    [written] = [json.loads(p.read_text()) for p in inbox.iterdir()]  # an input record of the memory job
    assert written == {"agent_id": "bob:notes", "id": added["added"][0], "text": "I bought a red bike."}


def test_the_sets_delete_and_forget_are_records_of_the_job(tmp_path):
    store = write_sets(tmp_path / "memory.sqlite")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    ltm = FlinkMemoryLongTermMemory(memory_settings=LongTermMemorySettings(store=store, input=str(inbox)))
    with pytest.raises(AgentScopeError, match="no key"):
        ltm.get_memory_set("notes")
    ltm.switch_context("carol")
    notes = ltm.get_memory_set("notes")
    assert notes.get() == [] and notes.search("dog", limit=2) == [] and notes.summary() is None  # a fresh key
    notes.delete("n1")
    notes.delete()
    assert ltm.delete_memory_set("todo") is True
    written = sorted((json.loads(p.read_text()) for p in inbox.iterdir()), key=lambda d: json.dumps(d, sort_keys=True))
    assert written == sorted([{"agent_id": "carol:notes", "deleted": True, "id": "n1"},
                              {"agent_id": "carol:notes", "forget": True}, {"agent_id": "carol:todo", "forget": True}],
                             key=lambda d: json.dumps(d, sort_keys=True))
    with pytest.raises(ValueError, match="no filters"):
        notes.get(filters={"kind": "x"})
    with pytest.raises(AgentScopeError, match="no ':'"):
        ltm.get_memory_set("a:b")
    ltm.close()
