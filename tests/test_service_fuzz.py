"""The OpenAPI document of `flink-memory serve`, fuzzed with schemathesis against a running server over real
HTTP: requests drawn from the document (valid ones, and invalid ones that break it), with a valid key, a
wrong key and none, for agents the key grants, does not grant, and that do not exist. Every answer must be
no server error, of a status the document declares for the operation, of the declared content type, and
match the declared schema. Hypothesis runs derandomized: the same examples on every run.

Also here: what the generator does not draw (a lone surrogate, a record over Kafka's message limit, a store
that goes away) answered with a declared 4xx or 503, never a 500."""

from __future__ import annotations

import socket

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from servicekit import call, serving, write_store

from flink_memory.records import DeadLetter, parse_line
from flink_memory.service.keys import add_key
from flink_memory.service.server import ServeOptions

CHECKS = [schemathesis.checks.not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
EXAMPLES = 40  # per operation and generation mode


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with keys (one key for alice and the fuzz-* agents) writing into a followed directory."""
    tmp = tmp_path_factory.mktemp("fuzz")
    inbox = tmp / "input"
    inbox.mkdir()
    key, _ = add_key(tmp / "keys.json", ["alice", "fuzz-*"])
    options = ServeOptions(store=write_store(tmp / "memory.sqlite"), input=str(inbox), keys=str(tmp / "keys.json"))
    with serving(options) as url:
        yield url, key, inbox


def operations(base: str) -> list:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def fuzz(operation, mode: GenerationMode, base: str, keys: dict[str, str | None]) -> set[int]:
    """Run the operation's examples with every check; the statuses it answered."""
    statuses: set[int] = set()
    agents = st.sampled_from([None, "alice", "bob", "fuzz-new", "nobody"])  # None: the drawn agent id

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), agent=agents, presented=st.sampled_from(list(keys)))
    def run(case, agent, presented):
        if agent is not None and "agent_id" in (case.path_parameters or {}):
            case.path_parameters["agent_id"] = agent
        headers = {"Authorization": f"Bearer {keys[presented]}"} if keys[presented] else {}
        response = case.call_and_validate(base_url=base, headers=headers, checks=CHECKS, timeout=30)
        statuses.add(response.status_code)

    run()
    return statuses


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_every_answer_matches_the_openapi_document(served, mode):
    base, key, inbox = served
    keys = {"valid": key, "wrong": "fmk_00000000_" + "x" * 43, "none": None}
    for operation in operations(base):
        if mode == GenerationMode.NEGATIVE and not (operation.path_parameters or operation.query or operation.body):
            continue  # (the health check: nothing to break)
        statuses = fuzz(operation, mode, base, keys)
        if operation.path != "/v1/health":  # each operation's answers reached past the key check
            assert statuses - {401}, f"{operation.label}: every answer was 401"
    for path in inbox.iterdir():  # what was accepted is a whole record the job takes
        assert not path.name.startswith("."), "a temporary file was left behind"
        assert not isinstance(parse_line(path.read_text()), DeadLetter), path.read_text()

def test_a_server_without_keys_declares_none(tmp_path):
    """On loopback without --keys every caller is answered: the document declares no key and no 401."""
    with serving(ServeOptions(store=write_store(tmp_path / "memory.sqlite"))) as base:
        status, doc = call(f"{base}/openapi.json")
        assert status == 200 and "security" not in doc and "securitySchemes" not in doc["components"]
        for path in doc["paths"].values():
            for operation in path.values():
                assert "401" not in operation["responses"] and "security" not in operation
        assert set(operations(base)[0].schema.raw_schema["paths"]) == set(doc["paths"])


def test_the_health_check_declares_the_body_limits(served):
    base, _, _ = served
    status, doc = call(f"{base}/openapi.json")
    health = doc["paths"]["/v1/health"]["get"]
    assert set(health["responses"]) == {"200", "400", "408", "413"} and health["security"] == []
    host, port = base.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as conn:  # the length says it: 413 before any body
        conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % ((1 << 20) + 1))
        conn.settimeout(10)
        assert conn.recv(4096).startswith(b"HTTP/1.1 413")


def test_a_lone_surrogate_in_a_record_is_422(served):
    """`"\\ud800"` is valid JSON but no UTF-8 line can hold it: refused, never written, never a 500."""
    base, key, inbox = served
    before = set(inbox.iterdir())
    for body in (b'{"text": "boat", "metadata": {"\\ud800": 1}}', b'{"text": "boat", "metadata": {"a": "\\udfff"}}',
                 b'{"messages": [{"role": "user", "content": "\\ud800"}]}'):
        status, answer = call(f"{base}/v1/agents/alice/memories", "POST", raw=body, key=key)
        assert status == 422, (body, answer)
    assert set(inbox.iterdir()) == before


def test_a_record_over_the_kafka_message_limit_is_413(tmp_path):
    """Under the 1 MiB body limit but over the producer's message limit (1 000 000 bytes by default)."""
    options = ServeOptions(store=write_store(tmp_path / "memory.sqlite"), input="kafka://127.0.0.1:9/memories")
    with serving(options) as base:
        status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {"text": "x" * 1_040_000})
        assert status == 413 and "message size limit" in answer["detail"]


def test_a_store_that_goes_away_is_503_and_comes_back(postgres_url):
    import psycopg
    from pgserver import new_database

    url = new_database(postgres_url)
    name = url.rsplit("/", 1)[1]
    write_store(url)
    with serving(ServeOptions(store=url)) as base, psycopg.connect(postgres_url, autocommit=True) as admin:
        assert call(f"{base}/v1/agents/alice/memory")[0] == 200
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        status, answer = call(f"{base}/v1/agents/alice/memory")
        assert status == 503 and "cannot reach the memory store" in answer["detail"]
        assert call(f"{base}/v1/agents/alice/recall", "POST", {"question": "boat"})[0] == 503
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        assert call(f"{base}/v1/agents/alice/memory")[0] == 200


@pytest.mark.slow
def test_kafka_writes_on_a_real_broker_and_a_topic_that_refuses_a_records_size(tmp_path, kafka_broker):
    """A write is one message keyed by agent on the topic; a topic whose max.message.bytes the record passes
    refuses it on delivery: 413, as the producer's own limit."""
    import json

    from kafka_broker import consume_all, create_topic

    bootstrap = kafka_broker.bootstrap
    create_topic(bootstrap, "small", 1, **{"max.message.bytes": "2000"})
    store = write_store(tmp_path / "memory.sqlite")
    with serving(ServeOptions(store=store, input=f"kafka://{bootstrap}/small")) as base:
        status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {"text": "Alice moved to Lisbon."})
        assert status == 202
        status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {"text": "x" * 5000})
        assert status == 413 and "message size limit" in answer["detail"], answer
    [(key, value)] = consume_all(bootstrap, "small")
    assert key == b"alice" and json.loads(value)["text"] == "Alice moved to Lisbon."
