"""The MCP door: flink-memory's /mcp as a Flink Agents `@mcp_server` resource, over the official mcp client that
the agents extra installs (1.x, flink-agents' pins), against `flink-memory serve` (mcp 2.x, the service
environment). The service key is read from a file when the connection is made: it is in no plan JSON and no
log; a key for one agent reads and writes that agent only."""

import json
import logging
from importlib.metadata import version

import pytest
from agentkit import FACTS, Service, pickled_values, run_local, write_store
from flink_agents.api.agents.agent import Agent
from flink_agents.api.decorators import action, mcp_server
from flink_agents.api.events.event import Event, InputEvent, OutputEvent
from flink_agents.api.resource import ResourceDescriptor, ResourceType
from flink_agents.api.runner_context import RunnerContext
from flink_agents.integrations.mcp.mcp import MCPServer
from flink_agents.plan.agent_plan import AgentPlan
from flink_agents.plan.configuration import AgentConfiguration

from flink_memory.agents.mcp import KeyUnavailable, ServiceKeyAuth, memory_mcp_server
from flink_memory.records import MemoryItem, parse_line
from flink_memory.service.keys import add_key

ENDPOINT = {}  # (the agent's resource reads the endpoint of the test's server)


class ToolAgent(Agent):
    """Calls one of the memory's MCP tools per input, with the input's arguments."""

    @mcp_server
    @staticmethod
    def memory_tools() -> ResourceDescriptor:
        return memory_mcp_server(ENDPOINT["url"], key_file=ENDPOINT["key_file"])

    @action(InputEvent.EVENT_TYPE)
    @staticmethod
    def call(event: Event, ctx: RunnerContext) -> None:
        turn = InputEvent.from_event(event).input
        tool = ctx.get_resource(turn["tool"], ResourceType.TOOL)
        ctx.send_event(OutputEvent(output=tool.call(**turn["arguments"])))


class HeaderAgent(Agent):
    """The plain way (Flink Agents' MCPServer with the key in headers): the control that the grep sees a key."""

    @mcp_server
    @staticmethod
    def memory_tools() -> ResourceDescriptor:
        return ResourceDescriptor(clazz="flink_agents.integrations.mcp.mcp.MCPServer", endpoint=ENDPOINT["url"],
                                  headers={"Authorization": f"Bearer {ENDPOINT['key']}"})


@pytest.fixture
def service(tmp_path):
    store = write_store(tmp_path / "memory.sqlite")
    inbox, secrets = tmp_path / "inbox", tmp_path / "secrets"
    inbox.mkdir()
    secrets.mkdir()
    key, _ = add_key(tmp_path / "keys.json", ["alice"])
    key_file = secrets / "memory_key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    server = Service(store, tmp_path / "keys.json", inbox, tmp_path / "service.log")
    ENDPOINT.update(url=f"{server.url}/mcp", key_file=str(key_file), key=key)
    yield server, key, inbox
    server.close()


def texts(output):
    return "\n".join(item if isinstance(item, str) else json.dumps(item) for item in output)


def test_the_agent_recalls_and_remembers_through_mcp_and_the_key_stays_out_of_plan_and_logs(service, caplog):
    server, key, inbox = service
    assert version("mcp").startswith("1."), "the agents extra's mcp (flink-agents pins pydantic 2.11)"
    caplog.set_level(logging.DEBUG)
    agent = ToolAgent()
    plan_json = AgentPlan.from_agent(agent, AgentConfiguration()).model_dump_json(serialize_as_any=True)
    plan = json.loads(plan_json)
    assert {"recall", "remember", "show_memory", "forget_memory"} <= set(plan["resource_providers"]["tool"])
    out = run_local(ToolAgent(), [
        {"agent_id": "alice", "tool": "recall", "arguments": {"question": "What is my dog called?", "k": 2}},
        {"agent_id": "alice", "tool": "recall",
         "arguments": {"question": "What is the dog called?", "agent_id": "bob"}},
        {"agent_id": "alice", "tool": "remember",
         "arguments": {"text": "Alice booked the train to Lyon for June 3.", "id": "trip-1"}},
    ])
    recalled, refused, remembered = (texts(o) for o in out)
    assert FACTS["alice"]["a1"] in recalled and "bob" not in recalled.lower()
    assert "agent 'bob' is not among this key's agents" in refused and FACTS["bob"]["b1"] not in refused
    assert '"id": "trip-1"' in remembered or '"id":"trip-1"' in remembered
    [written] = [parse_line(f.read_text()) for f in inbox.iterdir()]
    assert isinstance(written, MemoryItem) and (written.agent_id, written.id) == ("alice", "trip-1")

    secret = key.split("_", 2)[2]  # (fmk_<id>_<secret>: the secret part alone, as a log might cut it)
    pickled = pickled_values(plan_json)
    assert pickled, "the tools carry their server (with its auth, pickled)"
    for where, text in [("plan JSON", plan_json), ("pickled auth", b"".join(pickled).decode("latin-1")),
                        ("agents log", caplog.text), ("service log", server.log.read_text())]:
        assert key not in text and secret not in text, f"the service key is in the {where}"
    assert any(ENDPOINT["key_file"].encode() in p for p in pickled)  # (where it is, not what)
    control = AgentPlan.from_agent(HeaderAgent(), AgentConfiguration()).model_dump_json(serialize_as_any=True)
    assert key in control  # (headers: the key in clear in the plan, what memory_mcp_server avoids)


def test_the_server_flink_builds_from_the_plan_reads_the_key_from_its_file(service, tmp_path):
    """Flink Agents' Flink runtime builds every MCP server as its MCPServer from the descriptor's arguments in
    the plan JSON (whatever class the descriptor names): the key's place must survive that round trip."""
    server, key, _ = service
    arguments = json.loads(json.dumps(memory_mcp_server(ENDPOINT["url"], key_file=ENDPOINT["key_file"]).arguments))
    assert key not in json.dumps(arguments)
    built = MCPServer(**arguments)
    assert isinstance(built.auth, ServiceKeyAuth) and built.headers is None
    assert {"recall", "remember"} <= {tool.metadata.name for tool in built.list_tools()}
    built.close()


def test_a_wrong_or_missing_key_is_refused_and_names_no_key(service, tmp_path):
    server, key, _ = service
    wrong = tmp_path / "wrong_key"
    wrong.write_text("fmk_00000000_notakey")
    with pytest.raises(Exception) as refused:  # noqa: PT011 - (the mcp client's own error for a 401)
        MCPServer(endpoint=f"{server.url}/mcp", auth=ServiceKeyAuth(key_file=str(wrong))).list_tools()
    assert "notakey" not in str(refused.value)
    with pytest.raises(KeyUnavailable, match="missing_key"):
        ServiceKeyAuth(key_file=str(tmp_path / "missing_key")).key()
    with pytest.raises(KeyUnavailable, match="MEMORY_KEY_UNSET is empty"):
        ServiceKeyAuth(key_env="MEMORY_KEY_UNSET").key()


def test_the_key_has_one_place():
    with pytest.raises(ValueError, match="one of them"):
        memory_mcp_server("http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="one of them"):
        memory_mcp_server("http://127.0.0.1:1/mcp", key_file="/k", key_env="K")
    assert repr(ServiceKeyAuth(key_env="K")) == "ServiceKeyAuth(key_env='K')"
