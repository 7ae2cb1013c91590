"""Each agent sees only its own memory: service keys (`flink-memory keys`), kept as digests only; a key for
one agent is answered 404 for any other, exactly as for an agent that does not exist; no key, token or memory
text in the server's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servicekit import FACTS, call, free_port, serving, write_store

from flink_memory.cli import main
from flink_memory.service.keys import KeyEntry, KeyRing, KeysError, add_key, digest, load_keys
from flink_memory.service.server import ServeOptions

ROOT = Path(__file__).resolve().parents[1]


def wait_until_answering(url, server, log, timeout_s=30):
    """Until the server process at `url` answers its health check (`log()`: what to show if it never does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if call(f"{url}/v1/health")[0] == 200:
                return
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, log()
            time.sleep(0.1)


def new_key(capsys, keys: Path, *agents: str) -> str:
    assert main(["keys", "add", *agents, "--keys", str(keys)]) == 0
    printed = capsys.readouterr()
    key = printed.out.strip()
    assert key.startswith("fmk_") and key not in printed.err
    return key


def test_keys_add_list_revoke_keep_only_digests(tmp_path, capsys):
    keys = tmp_path / "keys.json"
    key = new_key(capsys, keys, "alice", "team-*")
    entry = load_keys(keys).keys[0]
    assert entry.agents == ["alice", "team-*"] and entry.digest == digest(key)
    assert key not in keys.read_text() and key.split("_", 2)[2] not in keys.read_text()
    assert oct(keys.stat().st_mode & 0o777) == "0o600"
    assert main(["keys", "list", "--keys", str(keys)]) == 0
    listed = capsys.readouterr().out
    assert entry.id in listed and "team-*" in listed and key not in listed
    ring = KeyRing(keys)
    assert ring.verify(key) == entry and ring.verify(key + "x") is None and ring.verify("") is None
    assert main(["keys", "revoke", entry.id, "--keys", str(keys)]) == 0
    assert ring.verify(key) is None  # the server's ring reads the file again: revoked at once
    assert main(["keys", "revoke", entry.id, "--keys", str(keys)]) == 2
    with pytest.raises(KeysError):
        add_key(keys, ["*"])


def test_grants_by_id_and_prefix():
    entry = KeyEntry(id="k", digest="sha256:0", agents=["alice", "team-*"], created="now")
    assert entry.allows("alice") and entry.allows("team-red") and entry.allows("team-")
    assert not entry.allows("alice2") and not entry.allows("bob") and not entry.allows("tea")
    assert entry.default_agent() is None
    assert KeyEntry(id="k", digest="d", agents=["alice"], created="now").default_agent() == "alice"


@pytest.fixture
def keyed(tmp_path, capsys):
    store = write_store(tmp_path / "memory.sqlite")
    inbox = tmp_path / "input"
    inbox.mkdir()
    keys = tmp_path / "keys.json"
    alice = new_key(capsys, keys, "alice")
    with serving(ServeOptions(store=store, input=str(inbox), keys=str(keys))) as url:
        yield url, alice, inbox


def test_no_valid_key_is_401(keyed):
    url, alice, _ = keyed
    for key in (None, "fmk_00000000_guess", alice[:-1]):
        status, answer = call(f"{url}/v1/agents/alice/memory", key=key)
        assert status == 401 and "key" in answer["detail"]
    assert call(f"{url}/v1/agents/alice/memory", headers={"x-api-key": alice})[0] == 200
    assert call(f"{url}/v1/agents/alice/memory", key=alice)[0] == 200
    assert call(f"{url}/v1/health")[0] == 200 and call(f"{url}/openapi.json")[0] == 200  # public
    assert call(f"{url}/v1/agents/alice/recall", "POST", raw=b"{broken", key=None)[0] == 401  # before the body


def test_a_key_for_alice_gets_404_for_bob_exactly_as_for_an_agent_that_does_not_exist(keyed):
    url, alice, inbox = keyed
    assert "bob" in FACTS  # bob exists in the store
    requests = [("GET", "/memory", None), ("GET", "/memory?tree=true", None),
                ("POST", "/recall", {"question": "spare key flowerpot"}),
                ("POST", "/memories", {"text": "Bob owes Alice 5 EUR."}),
                ("DELETE", "/memories/bob-0", None), ("DELETE", "", None)]
    for method, path, body in requests:
        bob = call(f"{url}/v1/agents/bob{path}", method, body, key=alice)
        ghost = call(f"{url}/v1/agents/ghost{path}", method, body, key=alice)
        assert bob[0] == ghost[0] == 404, (method, path)
        assert bob[1]["detail"].replace("bob", "?") == ghost[1]["detail"].replace("ghost", "?")
    assert list(inbox.iterdir()) == []
    assert call(f"{url}/v1/agents/alice/memories", "POST", {"text": "Alice owes Bob 5 EUR."}, key=alice)[0] == 202


def test_the_key_and_the_memory_text_are_in_no_log(tmp_path, capsys):
    store = write_store(tmp_path / "memory.sqlite")
    inbox = tmp_path / "input"
    inbox.mkdir()
    keys = tmp_path / "keys.json"
    key = new_key(capsys, keys, "alice")
    secret_text = "The vault code is 7391-SWORDFISH."
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "FLINK_MEMORY_LOG": "DEBUG", "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "flink_memory.cli", "serve", "--store", store, "--port", str(port), "--keys",
             str(keys), "--input", str(inbox), "--set", "embeddings.provider=none"], stdout=out, stderr=out, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_answering(url, server, log.read_text)
            assert call(f"{url}/v1/agents/alice/memories", "POST", {"text": secret_text}, key=key)[0] == 202
            assert call(f"{url}/v1/agents/alice/memories", "POST", {"text": secret_text, "ts": "x"}, key=key)[0] == 422
            recalled = call(f"{url}/v1/agents/alice/recall", "POST", {"question": "vault code SWORDFISH"}, key=key)
            assert recalled[0] == 200
            assert call(f"{url}/v1/agents/alice/memory", key=key)[0] == 200
            assert call(f"{url}/v1/agents/alice/memory", key=key + "wrong")[0] == 401
            assert call(f"{url}/v1/agents/bob/memory", key=key)[0] == 404
        finally:
            server.terminate()
            server.wait(20)
    logged = log.read_text()
    assert "/v1/agents/alice/memories 202" in logged  # the access log is on
    for secret in (key, key.split("_", 2)[2], "SWORDFISH", "Alice paid", "Bearer"):
        assert secret not in logged
    assert "SWORDFISH" in json.dumps([json.loads(p.read_text()) for p in inbox.iterdir()])  # (it was written)


def test_serve_with_two_workers_answers_and_stops_them_together(tmp_path):
    store = write_store(tmp_path / "memory.sqlite")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "flink_memory.cli", "serve", "--store", store, "--port", str(port),
                               "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_answering(url, server, lambda: "")
        workers = [int(p) for p in subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        assert len(workers) == 1  # the parent serves too
        answers = [call(f"{url}/v1/agents/alice/recall", "POST", {"question": "Which pet does Alice have?"})
                   for _ in range(20)]
        assert all(status == 200 for status, _ in answers)
    finally:
        server.terminate()
        server.wait(20)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{workers[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{workers[0]}").exists()
