"""`flink-memory serve`, over real HTTP: every endpoint of /v1, writes as input records the job accepts, and
bad input answered with a clear 4xx (never a 500, never a hang)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from servicekit import call, serving, write_store

from flink_memory.records import DeadLetter, parse_line
from flink_memory.service.server import ServeError, ServeOptions, TimedH11Protocol, build_service


@pytest.fixture
def store(tmp_path) -> str:
    return write_store(tmp_path / "memory.sqlite")


@pytest.fixture
def inbox(tmp_path) -> Path:
    path = tmp_path / "input"
    path.mkdir()
    return path


@pytest.fixture
def base(store, inbox):
    with serving(ServeOptions(store=store, input=str(inbox))) as url:
        yield url


def records(inbox: Path) -> list[dict]:
    """The records written into the followed directory, each checked as the job parses it."""
    out = []
    for path in sorted(inbox.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        assert not path.name.startswith("."), "a temporary file was left behind"
        lines = path.read_text().splitlines()
        assert len(lines) == 1
        parsed = parse_line(lines[0])
        assert not isinstance(parsed, DeadLetter), parsed.reason
        out.append(json.loads(lines[0]))
    return out


def test_health_and_the_openapi_document(base):
    assert call(f"{base}/v1/health") == (200, {"status": "ok", "store": "ok", "writes": "directory", "applier": None})
    status, doc = call(f"{base}/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/health", "/v1/agents/{agent_id}/memory", "/v1/agents/{agent_id}/recall",
                                 "/v1/agents/{agent_id}/memories", "/v1/agents/{agent_id}/memories/{record_id}",
                                 "/v1/agents/{agent_id}", "/v1/agents", "/v1/agents/{agent_id}/history",
                                 "/v1/agents/{agent_id}/nodes/{node_id}/children", "/v1/agents/{agent_id}/store"}
    remember = doc["paths"]["/v1/agents/{agent_id}/memories"]["post"]
    assert remember["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RememberRequest"}
    assert "text" in doc["components"]["schemas"]["RememberText"]["properties"]


def test_memory_and_the_live_tree(base):
    status, answer = call(f"{base}/v1/agents/alice/memory")
    assert status == 200 and answer["memory"]["node_id"] == "alice-g1" and answer["tree"] is None
    status, answer = call(f"{base}/v1/agents/alice/memory?tree=true")
    assert [(e["depth"], e["node"]["node_id"]) for e in answer["tree"]] == [(0, "alice-g1"), (1, "alice-b1")]
    assert call(f"{base}/v1/agents/nobody/memory") == (404, {"detail": "no memory for agent 'nobody'"})


def test_recall_finds_the_unit_and_its_nodes(base):
    status, answer = call(f"{base}/v1/agents/alice/recall", "POST", {"question": "What did Alice pay for the boat?"})
    assert status == 200
    assert {h["node_id"] for h in answer["hits"]} >= {"alice-0", "alice-b1"}
    unit = next(h for h in answer["hits"] if h["kind"] == "unit")
    assert unit["text"] == "Alice paid 300 EUR for the boat." and unit["covered_by"] == "alice-b1"
    status, answer = call(f"{base}/v1/agents/alice/recall", "POST", {"question": "boat", "k": 1, "mode": "keyword"})
    assert status == 200 and len(answer["hits"]) == 1
    assert call(f"{base}/v1/agents/alice/recall", "POST", {"question": "zebra"}) == (200, {"hits": []})
    assert call(f"{base}/v1/agents/nobody/recall", "POST", {"question": "boat"})[0] == 404
    # no embedder on this server: recall by meaning only is refused with the reason
    status, answer = call(f"{base}/v1/agents/alice/recall", "POST", {"question": "boat", "mode": "vector"})
    assert status == 422 and "embeddings.provider" in answer["detail"]


def test_writes_become_records_the_job_accepts(base, inbox):
    status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {"text": "Alice moved to Lisbon."})
    assert status == 202 and answer["kind"] == "item" and answer["status"] == "accepted"
    generated = answer["id"]
    status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {
        "id": "chat-7", "ts": "2026-02-01T10:00:00Z", "metadata": {"source": "chat"},
        "messages": [{"role": "user", "content": "I sold the boat."}, {"role": "assistant", "content": "Noted."}]})
    assert (status, answer["id"], answer["kind"]) == (202, "chat-7", "conversation")
    status, answer = call(f"{base}/v1/agents/alice/memories", "POST", {
        "id": "t-1", "trusted": True, "chunks": [[{"role": "user", "content": "Rex is three."}]]})
    assert (status, answer["kind"]) == (202, "trusted")
    assert call(f"{base}/v1/agents/alice/memories/alice-0", "DELETE")[0] == 202
    status, answer = call(f"{base}/v1/agents/alice", "DELETE")
    assert (status, answer["id"], answer["kind"]) == (202, "alice", "forget")
    written = records(inbox)
    assert written[0] == {"agent_id": "alice", "text": "Alice moved to Lisbon.", "id": generated}
    assert written[1]["id"] == "chat-7" and written[1]["metadata"] == {"source": "chat"}
    assert written[2]["trusted"] is True
    assert written[3] == {"agent_id": "alice", "id": "alice-0", "deleted": True}
    assert written[4] == {"agent_id": "alice", "forget": True}
    # a write may name an agent that has no memory yet: its first record creates it
    assert call(f"{base}/v1/agents/carol/memories", "POST", {"text": "Carol joined."})[0] == 202


@pytest.mark.parametrize("body", [
    {"text": "   "},
    {"text": "a", "messages": [{"role": "user", "content": "b"}]},
    {"text": "a", "ts": "yesterday"},
    {"text": "a", "id": "note#3"},
    {"chunks": [[{"role": "user", "content": "b"}]]},
    {"messages": [{"role": "narrator", "content": "b"}]},
    {"messages": []},
    {"text": "a", "kind": "item"},
    {"text": "a", "colour": "blue"},
    {"text": 42},
])
def test_a_record_the_job_would_dead_letter_gets_422_with_the_jobs_reason(base, inbox, body):
    status, answer = call(f"{base}/v1/agents/alice/memories", "POST", body)
    expected = parse_line(json.dumps({"agent_id": "alice", **body, "id": body.get("id", "x")}))
    assert isinstance(expected, DeadLetter)
    assert (status, answer["detail"]) == (422, expected.reason)
    assert list(inbox.iterdir()) == []


def test_bad_requests_get_a_clear_4xx(base, inbox):
    memories, recall = f"{base}/v1/agents/alice/memories", f"{base}/v1/agents/alice/recall"
    status, answer = call(memories, "POST", raw=b'{"text": ')
    assert status == 422 and answer["detail"].startswith("invalid JSON")
    assert call(memories, "POST", ["a list"])[0] == 422
    assert "agent_id" in call(memories, "POST", {"agent_id": "bob", "text": "x"})[1]["detail"]
    assert "DELETE" in call(memories, "POST", {"id": "x", "deleted": True})[1]["detail"]
    assert call(recall, "POST", raw=b"{not json")[0] == 422
    assert call(recall, "POST", {"question": 7})[0] == 422
    assert call(recall, "POST", {"question": "boat", "k": "many"})[0] == 422
    assert "extra" in call(recall, "POST", {"question": "boat", "unknown": 1})[1]["detail"].lower()
    assert call(recall, "POST", {"question": "b" * 2001})[0] == 422
    assert call(recall, "POST", {"question": "b" * 2000})[0] == 200
    assert call(recall, "POST", {"question": "boat", "k": 101})[0] == 422
    assert call(recall, "POST", {"question": "boat", "k": 0})[0] == 422
    assert call(recall, "POST", {"question": "boat", "mode": "psychic"})[0] == 422
    assert call(f"{base}/v1/agents/alice/memory?tree=maybe")[0] == 422
    assert call(f"{base}/v1/nothing-here")[0] == 404
    assert call(f"{base}/v1/agents/alice/memory", "PUT", {})[0] == 405
    assert list(inbox.iterdir()) == []


def connect(base: str) -> socket.socket:
    host, port = base.split("//")[1].split(":")
    return socket.create_connection((host, int(port)))


def test_a_body_over_1_mib_is_413_before_it_is_read(base):
    with connect(base) as conn:  # the length says it: answered at once, nothing of the body read
        conn.sendall(b"POST /v1/agents/alice/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % ((1 << 20) + 1))
        conn.settimeout(10)
        answer = b""
        while chunk := conn.recv(4096):  # (the server closes the connection after a 413)
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413")
        assert json.loads(body) == {"detail": f"the body is over {1 << 20} bytes"}
    with connect(base) as conn:  # no length (chunked): cut off once past the limit
        conn.sendall(b"POST /v1/agents/alice/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            for _ in range(20):
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server answered and closed while we were still sending
        conn.settimeout(10)
        assert conn.recv(4096).startswith(b"HTTP/1.1 413")


def test_slow_clients_are_cut_off(store, monkeypatch):
    monkeypatch.setattr(TimedH11Protocol, "head_timeout_s", 0.5)
    with serving(ServeOptions(store=store), body_timeout_s=0.5) as url:
        # a body that never completes: 408 after the body timeout
        with connect(url) as conn:
            conn.sendall(b"POST /v1/agents/alice/recall HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"question\"")
            conn.settimeout(10)
            started = time.monotonic()
            assert conn.recv(4096).startswith(b"HTTP/1.1 408")
            assert time.monotonic() - started < 5
        # a request head that never completes: the connection is closed
        with connect(url) as conn:
            conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost:")
            conn.settimeout(10)
            started = time.monotonic()
            assert conn.recv(4096) == b""
            assert time.monotonic() - started < 5
        assert call(f"{url}/v1/health")[0] == 200  # and the server still answers


def test_read_only_refuses_writes_with_403(store, inbox):
    with serving(ServeOptions(store=store, input=str(inbox), read_only=True)) as url:
        assert call(f"{url}/v1/health")[1]["writes"] == "read-only"
        assert call(f"{url}/v1/agents/alice/memories", "POST", {"text": "x"})[0] == 403
        assert call(f"{url}/v1/agents/alice/memories/alice-0", "DELETE")[0] == 403
        assert call(f"{url}/v1/agents/alice", "DELETE")[0] == 403
        assert call(f"{url}/v1/agents/alice/memory")[0] == 200
    with serving(ServeOptions(store=store)) as url:  # no --input: nowhere to write
        assert call(f"{url}/v1/agents/alice/memories", "POST", {"text": "x"})[0] == 403
    assert list(inbox.iterdir()) == []


def test_a_store_the_job_has_not_made_yet_is_503_until_it_exists(tmp_path):
    path = tmp_path / "later.sqlite"
    with serving(ServeOptions(store=str(path))) as url:
        status, answer = call(f"{url}/v1/health")
        assert status == 200 and answer["status"] == "degraded"
        assert call(f"{url}/v1/agents/alice/memory")[0] == 503
        write_store(path)
        assert call(f"{url}/v1/agents/alice/memory")[0] == 200


def test_without_keys_only_loopback(store):
    with pytest.raises(ServeError, match="loopback"):
        build_service(ServeOptions(store=store, host="0.0.0.0"))
    build_service(ServeOptions(store=store, host="::1"))


def test_recall_takes_a_diversity_and_names_what_a_hit_folds(base):
    question = {"question": "What did Alice pay for the boat? Alice's dog?", "k": 5}
    status, plain = call(f"{base}/v1/agents/alice/recall", "POST", {**question, "diversity": 0})
    assert status == 200 and not any("folds" in h for h in plain["hits"])  # relevance alone: nothing folded
    status, distinct = call(f"{base}/v1/agents/alice/recall", "POST", question)  # the server's default: 1
    assert status == 200
    shown = {h["node_id"] for h in distinct["hits"]}
    folded = {f for h in distinct["hits"] for f in h.get("folds", [])}
    assert folded and not folded & shown and shown | folded == {h["node_id"] for h in plain["hits"]}
    status, answer = call(f"{base}/v1/agents/alice/recall", "POST", {**question, "diversity": 1.5})
    assert status == 422


def test_the_browsers_reads_agents_children_history_store(store, tmp_path):
    from flink_memory.service.keys import add_key

    keys = str(tmp_path / "keys.json")
    alice, _ = add_key(keys, ["alice"])
    with serving(ServeOptions(store=store, keys=keys)) as url:
        assert call(f"{url}/v1/agents")[0] == 401
        assert call(f"{url}/v1/agents", key=alice) == (200, {"agents": ["alice"]})
        status, page = call(f"{url}/v1/agents/alice/nodes/alice-g1/children", key=alice)
        assert status == 200 and (page["total"], page["missing"]) == (1, 0)
        assert [(c["node_id"], c["kind"], c["children"]) for c in page["children"]] == [("alice-b1", "batch", 2)]
        status, page = call(f"{url}/v1/agents/alice/nodes/alice-b1/children?offset=1&limit=1", key=alice)
        assert (page["total"], page["offset"]) == (2, 1)
        assert [(c["node_id"], c["kind"], c["text"]) for c in page["children"]] == [
            ("alice-1", "unit", "Alice's dog is a beagle named Rex.")]
        assert call(f"{url}/v1/agents/alice/nodes/nothing/children", key=alice)[0] == 404
        assert call(f"{url}/v1/agents/alice/nodes/alice-g1/children?limit=501", key=alice)[0] == 422
        status, history = call(f"{url}/v1/agents/alice/history", key=alice)
        assert status == 200 and history["total"] == 4 and history["replaced"] == 0
        assert {e["node_id"] for e in history["events"]} == {"alice-0", "alice-1", "alice-b1", "alice-g1"}
        status, facts = call(f"{url}/v1/agents/alice/store", key=alice)
        assert status == 200 and (facts["rows"], facts["rows_with_vectors"], facts["embedding_model"]) == (4, 0, None)
        # another agent's: the same 404 as one that does not exist, on every read
        for path in ("nodes/bob-g1/children", "history", "store"):
            status, answer = call(f"{url}/v1/agents/bob/{path}", key=alice)
            assert (status, answer) == (404, {"detail": "no memory for agent 'bob'"})
            nobody = call(f"{url}/v1/agents/nobody/{path}", key=alice)
            assert nobody == (404, {"detail": "no memory for agent 'nobody'"})


def test_recall_explains_its_scores_and_places_hits_in_the_tree(base):
    question = {"question": "What did Alice pay for the boat?", "k": 3, "diversity": 0}
    status, plain = call(f"{base}/v1/agents/alice/recall", "POST", question)
    assert status == 200 and "paths" not in plain and not any("parts" in h for h in plain["hits"])
    status, explained = call(f"{base}/v1/agents/alice/recall", "POST", {**question, "explain": True})
    assert [(h["node_id"], h["score"]) for h in explained["hits"]] == [(h["node_id"], h["score"])
                                                                        for h in plain["hits"]]
    assert explained["paths"] == {"alice-0": ["alice-g1", "alice-b1"], "alice-b1": ["alice-g1"], "alice-g1": []}
    for hit in explained["hits"]:  # keyword mode (no embedder): score = relevance x specificity
        parts = hit["parts"]
        assert parts["cosine"] is None and parts["keyword"] > 0
        assert hit["score"] == pytest.approx(parts["relevance"] * parts["specificity"], rel=1e-4)


def test_the_page_needs_no_key_and_sends_a_strict_policy(store, tmp_path):
    import urllib.request

    from flink_memory.service.keys import add_key
    from flink_memory.service.page import CSP

    keys = str(tmp_path / "keys.json")
    add_key(keys, ["alice"])
    with serving(ServeOptions(store=store, keys=keys)) as url:
        for name, kind in (("", "text/html"), ("app.js", "text/javascript"), ("app.css", "text/css")):
            with urllib.request.urlopen(f"{url}/ui/{name}") as answer:
                assert answer.headers["content-type"].startswith(kind)
                assert answer.headers["content-security-policy"] == CSP
                body = answer.read().decode()
            assert "http://" not in body and "https://" not in body  # nothing from elsewhere
            assert "<script>" not in body and "<style" not in body and " style=" not in body  # nothing inline
        assert call(f"{url}/ui/secret.txt")[0] == 404
        assert "/ui/" not in " ".join(call(f"{url}/openapi.json")[1]["paths"])


def test_serve_open_opens_the_page_once_the_server_answers(base, monkeypatch, capsys):
    import webbrowser

    from flink_memory.cli.serve import add_commands, open_when_up

    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or False)
    open_when_up(f"{base}/ui/")
    assert opened == [f"{base}/ui/"] and f"open {base}/ui/" in capsys.readouterr().err  # (no browser here)
    import argparse

    commands = argparse.ArgumentParser().add_subparsers()
    add_commands(commands)
    args = commands.choices["serve"].parse_args(["--store", "out/sample/memory.sqlite", "--read-only", "--open"])
    assert args.open and args.read_only
