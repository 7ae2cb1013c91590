"""Flink Agents agents on flink-agents' local runner (no jars): recall through FlinkMemoryVectorStore is one
agent's memory only, remembering writes an input record for the running job, bad arguments are refused clearly."""

import json

import pytest
from agentkit import FACTS, run_local, write_store
from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action
from flink_agents.api.events.context_retrieval_event import (
    ContextRetrievalRequestEvent,
    ContextRetrievalResponseEvent,
)
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.resource import ResourceDescriptor, ResourceType
from flink_agents.api.runner_context import RunnerContext
from flink_agents.api.vector_stores.vector_store import Document, VectorStoreQuery

from flink_memory.agents import AgentScopeError, RecordRefused
from flink_memory.agents.actions import recall
from flink_memory.agents.example import RememberingAgent, decide, memory_records
from flink_memory.agents.vector_store import FlinkMemoryVectorStore
from flink_memory.records import MemoryItem, parse_line


@pytest.fixture
def store(tmp_path):
    return write_store(tmp_path / "memory.sqlite")


def test_an_agent_recalls_its_own_memory_and_never_another_agents(store):
    turns = [{"agent_id": "alice", "id": "q1", "text": "What is the name of my dog?"},
             {"agent_id": "bob", "id": "q1", "text": "What is the name of my dog?"},
             {"agent_id": "alice", "id": "q2", "text": "How much is the rent for the flat?"}]
    out = {(o["agent_id"], o["turn"]): o for o in run_local(RememberingAgent(store), turns)}
    assert set(out) == {("alice", "q1"), ("bob", "q1"), ("alice", "q2")}
    alice_dog = [hit["text"] for hit in out["alice", "q1"]["recalled"]]
    assert alice_dog[0] == FACTS["alice"]["a1"]  # the unit that holds it, first
    assert out["bob", "q1"]["recalled"][0]["text"] == FACTS["bob"]["b1"]
    assert FACTS["alice"]["a2"] in [hit["text"] for hit in out["alice", "q2"]["recalled"]]
    for (agent, _), answer in out.items():
        other = "bob" if agent == "alice" else "alice"
        for hit in answer["recalled"]:  # not one unit or node of the other agent, by id or by text
            assert not hit["id"].startswith(other[0]) and other.capitalize() not in hit["text"], hit


def test_the_vector_store_queries_one_agent_by_filter_and_says_what_each_hit_is(store):
    vectors = FlinkMemoryVectorStore(store=store)
    docs = vectors.query(VectorStoreQuery(query_text="Which breed is the dog?", limit=4,
                                          filters={"agent_id": "bob"})).documents
    assert docs and all(d.metadata["agent_id"] == "bob" for d in docs)
    assert {d.id for d in docs} <= {"b1", "b2", "bob-b1"}
    assert docs[0].id == "b1" and docs[0].metadata["kind"] == "unit" and docs[0].score > 0
    assert vectors.query(VectorStoreQuery(query_text="dog", filters={"agent_id": "carol"})).documents == []
    eq = vectors.query(VectorStoreQuery(query_text="Which breed is the dog?", limit=4,
                                        filters={"agent_id": {"$eq": "bob"}})).documents
    assert [d.id for d in eq] == [d.id for d in docs]  # the filter DSL's $eq is the same one agent
    assert [d.id for d in vectors.get(filters={"agent_id": "alice"})] == ["a1", "a2"]
    assert [d.content for d in vectors.get("b2", agent_id="bob")] == [FACTS["bob"]["b2"]]
    vectors.close()


class RetrievingAgent(Agent):
    """Asks the built-in context retrieval action (it passes no filter to the vector store)."""

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def ask(event: Event, ctx: RunnerContext) -> None:
        turn = InputEvent.from_event(event).input
        ctx.send_event(ContextRetrievalRequestEvent(query=turn["text"], vector_store="memory", max_results=2))

    @action(ContextRetrievalResponseEvent.EVENT_TYPE)
    @staticmethod
    def answer(event: Event, ctx: RunnerContext) -> None:
        docs = ContextRetrievalResponseEvent.from_event(event).documents
        ctx.send_event(OutputEvent(output=[d.id for d in docs]))


def retrieving_agent(store, agent_id=None):
    agent = RetrievingAgent()
    agent.add_resource("memory", ResourceType.VECTOR_STORE, ResourceDescriptor(
        clazz=FlinkMemoryVectorStore.CLASS_PATH, store=store, agent_id=agent_id))
    return agent


def test_built_in_context_retrieval_reads_the_agent_the_store_is_bound_to(store):
    out = run_local(retrieving_agent(store, "alice"), [{"agent_id": "alice", "text": "Where is the flat?"}])
    assert out == [["a2", "alice-b1"]]


def test_built_in_context_retrieval_on_an_unbound_store_is_refused_not_widened(store):
    with pytest.raises(AgentScopeError, match="no agent named"):
        run_local(retrieving_agent(store), [{"agent_id": "alice", "text": "Where is the flat?"}])


def test_the_agent_remembers_through_the_writer_into_the_jobs_input(store, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    turns = [{"agent_id": "alice", "id": "t1", "ts": "2026-03-01T09:00:00Z",
              "text": "My sister Clara moves to Porto in May."},
             {"agent_id": "alice", "id": "t2", "text": "thanks!"},  # small talk: let go
             {"agent_id": "bob", "id": "t3", "text": "I switched my phone plan to the 20 GB one."}]
    out = run_local(RememberingAgent(store, str(inbox)), turns)
    assert sorted((o["agent_id"], o["turn"], o.get("written")) for o in out) == [("alice", "t1", True),
                                                                                   ("bob", "t3", True)]
    files = sorted(inbox.iterdir())
    assert len(files) == 2 and not any(f.name.startswith(".") for f in files)
    records = [parse_line(f.read_text()) for f in files]  # what the followed job reads
    assert all(isinstance(r, MemoryItem) for r in records)
    by_agent = {r.agent_id: r for r in records}
    assert by_agent["alice"].id == "t1" and by_agent["alice"].text == turns[0]["text"]
    assert json.loads(files[0].read_text() if records[0].agent_id == "alice" else files[1].read_text())["ts"] == \
        "2026-03-01T09:00:00Z"
    assert by_agent["alice"].metadata == {"source": "remembering-agent"}
    assert by_agent["bob"].text == turns[2]["text"]


def test_without_an_input_the_agent_hands_its_records_downstream(store):
    out = run_local(RememberingAgent(store), [{"agent_id": "bob", "id": "t9", "text": "Bob's train leaves at 7:40."}])
    assert [r for o in out for r in memory_records(o)] == [
        {"agent_id": "bob", "id": "t9", "metadata": {"source": "remembering-agent"},
         "text": "Bob's train leaves at 7:40."}]


def test_vector_store_writes_are_input_records_and_reads_need_one_agent(store, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    vectors = FlinkMemoryVectorStore(store=store, input=str(inbox), agent_id="bob")
    ids = vectors.add([Document(content="Bob's bike is red.", id="n1"), Document(content="Bob likes tea.")])
    vectors.delete("n1")
    lines = [json.loads(f.read_text()) for f in inbox.iterdir()]
    assert ids[0] == "n1" and ids[1].startswith("mem-")
    assert {"agent_id": "bob", "id": "n1", "text": "Bob's bike is red."} in lines
    assert {"agent_id": "bob", "id": "n1", "deleted": True} in lines
    assert {"agent_id": "bob", "id": ids[1], "text": "Bob likes tea."} in lines


@pytest.mark.parametrize(("kwargs", "query", "message"), [
    ({}, {"query_text": "dog"}, "no agent named"),
    ({"agent_id": "alice"}, {"query_text": "dog", "filters": {"agent_id": "bob"}}, "two agents named"),
    ({}, {"query_text": "dog", "filters": {"user_id": "alice"}}, r"filters \['user_id'\]"),
    ({}, {"query_text": "dog", "filters": {"agent_id": ""}}, "non-empty string"),
    ({}, {"query_text": "dog", "filters": {"agent_id": {"$in": ["alice", "bob"]}}}, r"takes a value or \{'\$eq'"),
    ({}, {"query_text": "dog", "filters": {"agent_id": {"$ne": "alice"}}}, r"takes a value or \{'\$eq'"),
    ({}, {"query_text": "dog", "filters": {"agent_id": 7}}, "non-empty string"),
    ({}, {"query_text": "dog", "collection_name": "alice"}, "no collections"),
    ({}, {"query_text": "dog", "limit": 0, "filters": {"agent_id": "alice"}}, "limit must be an integer"),
    ({}, {"query_text": "  ", "filters": {"agent_id": "alice"}}, "non-empty string"),
])
def test_bad_queries_are_refused_with_a_reason(store, kwargs, query, message):
    with pytest.raises(ValueError, match=message):
        FlinkMemoryVectorStore(store=store, **kwargs).query(VectorStoreQuery(**query))


def test_bad_writes_are_refused_with_the_jobs_reason(store, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    vectors = FlinkMemoryVectorStore(store=store, input=str(inbox), agent_id="alice")
    with pytest.raises(RecordRefused, match="text"):
        vectors.add(Document(content="   "))
    with pytest.raises(RecordRefused, match="#"):
        vectors.add(Document(content="A fact.", id="x#1"))
    with pytest.raises(ValueError, match="delete needs ids"):
        vectors.delete()
    with pytest.raises(AgentScopeError, match="two agents named"):
        vectors.add(Document(content="A fact."), agent_id="bob")
    with pytest.raises(NotImplementedError, match="question's text"):
        vectors._query_embedding([0.1, 0.2])
    assert list(inbox.iterdir()) == []  # nothing was written
    with pytest.raises(AgentScopeError, match="no agent named for the write"):
        FlinkMemoryVectorStore(store=store, input=str(inbox)).add(Document(content="A fact."))
    read_only = FlinkMemoryVectorStore(store=store, agent_id="alice")
    with pytest.raises(RuntimeError, match="read-only"):
        read_only.add(Document(content="A fact."))


class AskingAgent(Agent):
    """Recalls for the agent its input names (an empty one is a bad argument)."""

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def ask(event: Event, ctx: RunnerContext) -> None:
        turn = InputEvent.from_event(event).input
        ctx.send_event(OutputEvent(output=[d.id for d in recall(ctx, turn["agent"], turn["text"], k=turn["k"])]))


def test_the_recall_helper_checks_its_arguments_in_the_action(store):
    agent = AskingAgent()
    agent.add_resource("memory", ResourceType.VECTOR_STORE,
                       ResourceDescriptor(clazz=FlinkMemoryVectorStore.CLASS_PATH, store=store))
    assert run_local(agent, [{"agent_id": "x", "agent": "bob", "text": "Oslo flat rent", "k": 1}]) == [["b2"]]
    for bad, message in (({"agent": "", "k": 1}, "non-empty string"), ({"agent": "bob", "k": 500}, "limit")):
        with pytest.raises(ValueError, match=message):
            run_local(agent, [{"agent_id": "x", "text": "Oslo", **bad}])


def test_the_agents_rules():
    assert decide("What is my dog called?") == "recall"
    assert decide("Thanks, that helps!") == "skip"
    assert decide("ok") == "skip"
    assert decide("My dog Rex turned four today.") == "remember"


def test_before_the_job_created_its_store_an_agent_has_no_memory(tmp_path):
    vectors = FlinkMemoryVectorStore(store=str(tmp_path / "not-yet.sqlite"), agent_id="alice")
    assert vectors.query(VectorStoreQuery(query_text="dog")).documents == []
    assert vectors.get() == []
    assert not (tmp_path / "not-yet.sqlite").exists()
