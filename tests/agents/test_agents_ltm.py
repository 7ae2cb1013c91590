"""flink-memory as Flink Agents' long-term memory: an agent written against its memory-set API (the shape of
Flink Agents' own docs' example: `ctx.long_term_memory.get_memory_set(name)`, then the set's add, get, search),
unchanged but for the line that installs ours (`use_flink_memory`), on the local runner; a set of a key is one
flink-memory agent, `"{key}:{set}"`, so keys are isolated, and a set's summary is its tree's global summary.
(test_agents_ltm_job.py runs the same agent in a MiniCluster job.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agentkit import run_local
from chat_agent import ChatAgent
from flink_agents.plan.agent_plan import AgentPlan
from flink_agents.plan.configuration import AgentConfiguration

from flink_memory.agents import AgentScopeError
from flink_memory.agents.long_term_memory import FlinkMemoryLongTermMemory, LongTermMemorySettings, use_flink_memory
from flink_memory.embeddings.static import StaticE5
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store import open_store

NOTES = {"alice": {"n1": "Alice's dog is a beagle named Rex.", "n2": "Alice lives in Lyon."},
         "bob": {"n1": "Bob's dog is a poodle named Max.", "n2": "Bob lives in Oslo."}}


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


READ_PLAN = """
import sys
from flink_agents.runtime import flink_runner_context
assert "flink_memory.agents.long_term_memory" not in sys.modules
from flink_agents.plan.agent_plan import AgentPlan
plan = AgentPlan.model_validate_json(open(sys.argv[1]).read())  # as create_flink_runner_context does


class Context:  # (what _init_long_term_memory reads of the FlinkRunnerContext)
    _FlinkRunnerContext__agent_plan = plan


ltm = flink_runner_context._init_long_term_memory(Context(), "job-1")
ltm.switch_context("123")  # (Flink's hash of the key)
print(type(ltm).__name__, ltm.memory_settings.store, ltm.agent_of("notes"))
"""


def test_the_plan_flink_ships_installs_ours_where_a_taskmanager_reads_it(tmp_path):
    """A TaskManager's Python never ran use_flink_memory: reading the plan (written as the remote environment
    writes it) imports our module, and Flink Agents' builder of the runner context's memory then builds ours."""
    agent = use_flink_memory(ChatAgent(), store="out/memory.sqlite", input="inbox/")
    plan = AgentPlan.from_agent(agent, AgentConfiguration()).model_dump_json(serialize_as_any=True)
    (tmp_path / "plan.json").write_text(plan)
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", READ_PLAN, str(tmp_path / "plan.json")], capture_output=True,
                          text=True, env={"PYTHONPATH": f"{here}:{here.parent}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["FlinkMemoryLongTermMemory", "out/memory.sqlite", "123:notes"]
