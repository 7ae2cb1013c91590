"""One job, both sides, on a MiniCluster with the flink-agents jars (`make agents-jars`): the Flink Agents agent
reads users' turns from a followed directory (unbounded), decides what to remember, and its records go, keyed by
agent, into flink-memory's operators in the same job. Once one agent's facts are committed, the other's turns
come, and a task fails once among them: the merger (after it took that agent's first batch node), or the agent's
own action; the job restarts from its checkpoint. Every remembered fact is then in the store exactly once, as a
unit in exactly one live batch node, and the agent's later questions recall its own facts first."""

import json
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pyflink
import pytest
from agentkit import Service, pickled_values, python_path
from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.resource import ResourceType
from flink_agents.api.runner_context import RunnerContext
from flink_agents.plan.agent_plan import AgentPlan
from flink_agents.plan.configuration import AgentConfiguration
from jobkit import batch_units, check_tree, config_for, wait_for, write_lines
from scripted_server import Reply, ScriptedServer, fact_keeping_summary

from flink_memory.agents.actions import VECTOR_STORE
from flink_memory.agents.example import decide, memory_vector_store, remember_or_recall
from flink_memory.agents.mcp import memory_mcp_server
from flink_memory.agents.pipeline import add_agent_memory
from flink_memory.cli.run import Applier
from flink_memory.flink.pipeline import create_environment, file_sink, file_source
from flink_memory.outputs import read_outputs
from flink_memory.service.keys import add_key
from flink_memory.store import live_view, open_store

pytestmark = pytest.mark.slow

FACTS = {
    "ana": ["My daughter Lea starts school in Porto in September.", "I am allergic to peanuts and shellfish.",
            "Our team meeting moved to Thursdays at 10:30.", "My bike was stolen near Gare Saint-Jean on May 2.",
            "Dentist appointment with Dr. Moreau on June 14 at 9:00.", "My passport expires on 2027-11-30."],
    "ben": ["I drive a blue Volvo from 2019.", "My landlord Mr. Okafor raised the rent to 1,200 EUR.",
            "I run the Berlin half marathon on April 5.", "My sister Ines lives in Valencia with two cats.",
            "The router password card is taped under the desk.", "I switched my phone plan to 20 GB for 15 EUR."],
}
SMALL_TALK = ["Hi!", "thanks", "ok", "Thanks, that helps."]
QUESTIONS = {"ana": "Which foods am I allergic to?", "ben": "Which car do I drive?"}


class TestedAgent(Agent):
    """RememberingAgent's action that also asks the service's MCP `recall` tool (the MCP door, its key in a
    file) for each question, and fails once on the turn that carries a `fail_once` marker path (the agent's own
    operator fails, after it handed on, and checkpointed, the records of the turns before)."""

    def __init__(self, store, endpoint, key_file):
        super().__init__()
        self.add_resource(VECTOR_STORE, ResourceType.VECTOR_STORE, memory_vector_store(store))
        self.add_resource("memory_tools", ResourceType.MCP_SERVER, memory_mcp_server(endpoint, key_file=key_file))

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def on_turn(event: Event, ctx: RunnerContext) -> None:
        value = InputEvent.from_event(event).input
        turn = json.loads(value) if isinstance(value, str) else dict(value)
        marker = turn.pop("fail_once", None)
        if marker is not None and not Path(marker).exists():
            Path(marker).touch()
            raise RuntimeError("injected failure of the agent's action")
        if decide(turn["text"]) == "recall":
            answer = ctx.get_resource("recall", ResourceType.TOOL).call(question=turn["text"], k=2,
                                                                        agent_id=turn["agent_id"])
            ctx.send_event(OutputEvent(output={"agent_id": turn["agent_id"], "turn": turn["id"],
                                               "decision": "mcp", "answer": json.dumps(answer, default=str)}))
        remember_or_recall(InputEvent(input=turn), ctx)


def turns(agent, fail_marker=None):
    """The agent's facts, each followed by small talk; with `fail_marker`, its fifth fact fails the action once."""
    out = []
    for i, fact in enumerate(FACTS[agent]):
        out.append({"agent_id": agent, "id": f"f{i}", "ts": f"2026-03-0{i + 1}T09:00:00Z", "text": fact})
        out.append({"agent_id": agent, "id": f"s{i}", "text": SMALL_TALK[i % len(SMALL_TALK)]})
    if fail_marker is not None:
        out[8] = {**out[8], "fail_once": str(fail_marker)}
    return out


def publish(inbox, name, records):
    write_lines(inbox / f".{name}", records).rename(inbox / name)


def committed(output, name):
    """The committed lines of a file sink's directory (in-progress files are hidden, named with a dot)."""
    return [json.loads(line) for path in sorted((output / name).rglob("*.jsonl")) if not path.name.startswith(".")
            for line in path.read_text().splitlines() if line.strip()]


def recall_answers(output):
    """The agent's committed answers to QUESTIONS, by agent, once there is one for each."""
    found = {o["agent_id"]: o for o in committed(output, "outcomes") if o.get("decision") == "recall"}
    return found if set(found) == set(QUESTIONS) else None


@pytest.mark.parametrize("failing", ["merger", "agent"])
def test_the_composed_job_remembers_exactly_once_after_a_failure_and_recalls_per_agent(tmp_path, failing):
    assert all(decide(f) == "remember" for facts in FACTS.values() for f in facts)
    assert not any(decide(s) == "remember" for s in SMALL_TALK)
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    output.mkdir()
    marker = tmp_path / "failed"
    url = str(output / "memory.sqlite")
    expected = Counter((agent, f"f{i}") for agent, facts in FACTS.items() for i in range(len(facts)))
    publish(inbox, "part-0.jsonl", turns("ana"))

    def in_store(agents):
        try:
            with open_store(url) as store:
                units = {(agent, u.unit_id): batch for agent in agents for u, batch in store.units(agent)}
        except Exception:  # noqa: BLE001 - (not created yet)
            return False
        return set(units) == {key for key in expected if key[0] in agents} and all(units.values())

    key, _ = add_key(tmp_path / "keys.json", ["ana", "ben"])
    key_file = tmp_path / "memory_key"
    key_file.write_text(key)
    (tmp_path / "service-inbox").mkdir()
    service = Service(url, tmp_path / "keys.json", tmp_path / "service-inbox", tmp_path / "service.log")
    logs = Path(pyflink.__file__).parent / "log"
    logged_before = {p: p.stat().st_size for p in logs.glob("*")}
    with service_stopped(service), ScriptedServer(lambda body: Reply(text=fact_keeping_summary(body))) as server:
        config = config_for(server.base_url, "job.parallelism=2", "checkpointing.interval_s=2",
                            "checkpointing.restart_backoff_s=0.2", "job.bundle_size=1", "batching.max_items=3",
                            "batching.flush_after_s=1", "summarization.global_refresh_s=1", "summarization.fan_in=2",
                            f"job.python_path={python_path()}",
                            *([f"job.inject_failure=merger:after:ben/batch-000001:{marker}"]
                              if failing == "merger" else []))
        env = create_environment(config, str(output))
        agent = TestedAgent(url, f"{service.url}/mcp", str(key_file))
        plan_json = AgentPlan.from_agent(agent, AgentConfiguration()).model_dump_json(serialize_as_any=True)
        streams = add_agent_memory(env, file_source(env, str(inbox), follow=True), agent, config, str(output))
        streams.outcomes.sink_to(file_sink(str(output / "outcomes"), "outcomes")).uid("test-outcomes")
        client = env.execute_async("agents-memory")
        applier = Applier(url, str(output), config)
        try:
            # ana's facts committed (a checkpoint completed), then ben's turns, among which the failure comes
            wait_for(lambda: in_store(["ana"]), timeout_s=240)
            publish(inbox, "part-1.jsonl", turns("ben", marker if failing == "agent" else None))
            wait_for(marker.exists, timeout_s=240)
            wait_for(lambda: in_store(list(FACTS)), timeout_s=240)
            publish(inbox, "part-2.jsonl", [{"agent_id": a, "id": "q1", "text": q} for a, q in QUESTIONS.items()])
            answers = wait_for(lambda: recall_answers(output), timeout_s=120)
        finally:
            client.cancel().result()
            assert applier.stop() is None
    assert marker.exists(), "the injected failure did not fire"
    summaries = read_outputs(str(output))["summaries"]
    assert batch_units(summaries) == expected  # every remembered fact in exactly one batch node, none twice
    check_tree(summaries)
    live = live_view(summaries)
    with open_store(url) as store:
        for agent, facts in FACTS.items():
            units = {u.unit_id: (u.text, batch) for u, batch in store.units(agent)}
            assert sorted(units) == [f"f{i}" for i in range(len(facts))]
            assert [units[f"f{i}"][0] for i in range(len(facts))] == facts
            batches = {n.node_id for n in store.nodes(agent) if n.kind == "batch"}
            assert {batch for _, batch in units.values()} <= batches
            assert batches == {node for (a, node), n in live.items() if a == agent and n.kind == "batch"}
        assert store.recall("ben", "Which car do I drive?", k=1)[0].node_id == "f0"
    outcomes = committed(output, "outcomes")
    remembered = Counter((o["agent_id"], o["turn"]) for o in outcomes if o["decision"] == "remember")
    assert set(remembered) == set(expected)
    assert not any(o["decision"] == "remember" and o["turn"].startswith("s") for o in outcomes)
    ana, ben = answers["ana"]["recalled"], answers["ben"]["recalled"]
    assert ana[0]["id"] == "f1" and "peanuts" in ana[0]["text"]
    assert ben[0]["id"] == "f0" and "Volvo" in ben[0]["text"]
    assert not any(word in hit["text"] for hit in ben for word in ("peanuts", "Porto", "Lea"))
    assert not any(word in hit["text"] for hit in ana for word in ("Volvo", "Okafor", "Valencia"))
    mcp = {o["agent_id"]: o["answer"] for o in outcomes if o["decision"] == "mcp"}
    assert "peanuts" in mcp["ana"] and "Volvo" not in mcp["ana"] and "Volvo" in mcp["ben"]
    # the service key is in no plan JSON, checkpoint file or log (of Flink, of the service), nor its secret part
    secret = key.split("_", 2)[2]
    checkpoints = [p for p in (output / "_checkpoints").rglob("*") if p.is_file()]
    assert checkpoints, "no checkpoint was retained"
    new_logs = [p.read_bytes()[logged_before.get(p, 0):] for p in logs.glob("*") if p.is_file()]
    assert any(b"action-execute-operator" in text for text in new_logs), "not the job's log"
    pickled = pickled_values(plan_json)
    for where, data in [("plan", plan_json.encode()), ("service log", (tmp_path / "service.log").read_bytes()),
                        *(("pickled auth", p) for p in pickled),
                        *((str(p), p.read_bytes()) for p in checkpoints), *(("Flink log", t) for t in new_logs)]:
        assert key.encode() not in data and secret.encode() not in data, f"the service key is in the {where}"
    assert any(str(key_file).encode() in p for p in pickled)  # (where the key is, not what)


@contextmanager
def service_stopped(service):
    try:
        yield service
    finally:
        service.close()
