import threading
import time

import pytest
from scripted_server import Reply, ScriptedServer

from flink_memory.config import ConfigError, load_config
from flink_memory.llm.chat_client import LLMClient
from flink_memory.requests import ChatRequest, ContextOverflow, LLMCallError
from flink_memory.tokens.budget import RequestTooLarge


def make_client(server, *overrides, journal=None, api_key=None):
    cfg = load_config(None, ["llm.provider=openai", f"llm.base_url={server.base_url}", *overrides], environ={})
    return LLMClient(cfg.llm, cfg.llm.base_url, journal=journal, api_key=api_key)


def ask(client, text="hello"):
    return client.complete(client.requests.build([{"role": "user", "content": text}], prompt_version="t1"))


def test_answer_and_usage(scripted):
    client = make_client(scripted)
    result = ask(client, "Alice met Bob in 2024")
    assert result.text == "Summary: Alice Bob 2024"
    stats = client.stats.snapshot()
    assert stats["calls"] == 1 and stats["failures"] == 0 and stats["retries"] == 0
    assert stats["prompt_tokens"] == result.prompt_tokens > 0
    assert scripted.requests[0]["max_tokens"] == 384
    assert scripted.requests[0]["seed"] == 0


def test_request_digest_is_canonical():
    a = ChatRequest.build(model="m", prompt_version="p", messages=[{"role": "user", "content": "x"}], max_tokens=5)
    b = ChatRequest.build(model="m", prompt_version="p", messages=[{"role": "user", "content": "x"}], max_tokens=5)
    c = ChatRequest.build(model="m", prompt_version="p2", messages=[{"role": "user", "content": "x"}], max_tokens=5)
    assert a.digest == b.digest != c.digest
    assert len(a.digest) == 32


def flaky(failures, status=None, fault=None):
    state = {"n": 0}

    def script(body):
        state["n"] += 1
        if state["n"] <= failures:
            return Reply(status=status or 200, fault=fault, headers={"retry-after-ms": "10"})
        return Reply(text="fine")

    return script


@pytest.mark.parametrize(("status", "fault"), [(429, None), (500, None), (503, None), (200, "close")])
def test_retries_on_transient_errors(status, fault):
    with ScriptedServer(flaky(2, status, fault)) as server:
        client = make_client(server, "llm.max_retries=3")
        assert ask(client).text == "fine"
        assert server.count() == 3
        assert client.stats.snapshot()["retries"] == 2


def test_exhausted_retries_raise_call_error():
    with ScriptedServer(flaky(100, 500)) as server:
        client = make_client(server, "llm.max_retries=1")
        with pytest.raises(LLMCallError, match="InternalServerError"):
            ask(client)
        assert server.count() == 2
        assert client.stats.snapshot()["failures"] == 1


def test_malformed_json_is_a_call_error():
    with ScriptedServer(lambda body: Reply(fault="malformed")) as server:
        client = make_client(server, "llm.max_retries=0")
        with pytest.raises(LLMCallError):
            ask(client)


def test_client_errors_are_not_retried():
    with ScriptedServer(flaky(100, 400)) as server:
        client = make_client(server, "llm.max_retries=3")
        with pytest.raises(LLMCallError, match="BadRequest"):
            ask(client)
        assert server.count() == 1


def test_timeout_on_a_hang():
    with ScriptedServer(flaky(1, fault="hang")) as server:
        client = make_client(server, "llm.timeout_s=0.5", "llm.max_retries=1")
        started = time.monotonic()
        assert ask(client).text == "fine"
        assert time.monotonic() - started < 10
        assert server.count() == 2


def test_concurrency_limit():
    with ScriptedServer(lambda body: Reply(text="x", delay_s=0.2)) as server:
        client = make_client(server, "llm.max_concurrency=3")
        threads = [threading.Thread(target=ask, args=(client, f"q{i}")) for i in range(9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.max_in_flight == 3
        assert client.stats.snapshot()["calls"] == 9


def test_context_window_is_enforced_before_sending(scripted):
    client = make_client(scripted, "llm.context_window=2048", "llm.max_output_tokens=128")
    with pytest.raises(RequestTooLarge):  # the builder refuses it
        ask(client, "word " * 3000)
    raw = ChatRequest.build(model="m", prompt_version="t1", messages=[{"role": "user", "content": "word " * 3000}],
                            max_tokens=128)
    with pytest.raises(ContextOverflow, match="not sent"):  # and so does the client, for one built elsewhere
        client.complete(raw)
    assert scripted.count() == 0 and client.stats.snapshot()["context_rejections"] == 1


def test_key_is_sent_but_never_shown(scripted, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret-123456")
    client = make_client(scripted, "llm.api_key_env=MY_KEY")
    assert "sk-secret" not in repr(client)
    assert "sk-secret" not in str(client.config.model_dump())
    ask(client)
    assert scripted.authorizations == ["Bearer sk-secret-123456"]


def test_key_file_wins_over_the_variable_and_is_stripped(scripted, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    secret = tmp_path / "llm_api_key"
    secret.write_text("  sk-from-file-789\n")
    client = make_client(scripted, "llm.api_key_env=MY_KEY", f"llm.api_key_file={secret}")
    assert "sk-from-file" not in repr(client) and "sk-from-file" not in str(client.config.model_dump())
    ask(client)
    assert scripted.authorizations == ["Bearer sk-from-file-789"]
    monkeypatch.delenv("MY_KEY")
    ask(make_client(scripted, "llm.api_key_env=MY_KEY"))  # no file, no variable: the SDK gets a placeholder
    assert scripted.authorizations[-1] == "Bearer not-needed"


@pytest.mark.parametrize(("content", "needle"), [(None, "cannot read the API key from"), ("\n \n", "is empty"),
                                                 (b"\xff\xfe", "cannot read the API key from")])
def test_unreadable_or_empty_key_file_is_a_clear_error(scripted, tmp_path, monkeypatch, content, needle):
    monkeypatch.setenv("MY_KEY", "sk-from-env")  # never a silent fall back to the variable
    secret = tmp_path / "llm_api_key"
    if isinstance(content, bytes):
        secret.write_bytes(content)
    elif content is not None:
        secret.write_text(content)
    with pytest.raises(ConfigError, match=needle) as err:
        make_client(scripted, "llm.api_key_env=MY_KEY", f"llm.api_key_file={secret}")
    assert "llm.api_key_file: " in str(err.value) and str(secret) in str(err.value)
    assert scripted.count() == 0


def test_local_run_refuses_an_unreadable_key_file_before_starting(tmp_path, capsys):
    from flink_memory.cli import main

    missing = tmp_path / "no-such-key"
    code = main(["run", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--set", "llm.provider=openai",
                 "--set", "llm.base_url=http://127.0.0.1:9/v1", "--set", f"llm.api_key_file={missing}"])
    assert code == 2 and f"cannot read the API key from {missing}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_provider_errors_are_redacted():
    from flink_memory.llm.chat_client import _safe_message

    assert "sk-abc" not in _safe_message(ValueError("bad key sk-abc123 given, Bearer sk-abc123"))


def test_structured_output_sends_json_schema(scripted):
    client = make_client(scripted)
    schema = {"type": "object", "properties": {"ends": {"type": "array"}}, "required": ["ends"]}
    client.complete(client.requests.build([{"role": "user", "content": "x"}], prompt_version="p", json_schema=schema))
    sent = scripted.requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == schema


@pytest.mark.parametrize("status, error", [
    (422, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1024. Given: 1900 `inputs` "
          "tokens and 256 `max_new_tokens`"),  # Hugging Face TGI
    (413, "Request Entity Too Large"),  # a gateway in front of the model
])
def test_length_refusals_of_other_providers_are_re_packed_not_retried(status, error):
    with ScriptedServer(lambda body: Reply(status=status, error=error)) as server:
        client = make_client(server, "llm.max_retries=0")
        with pytest.raises(ContextOverflow):  # (the reduce job re-packs on it; a plain call error would wait)
            ask(client)
        assert server.count() == 1 and client.stats.context_rejections == 1


class BrokenJournal:
    """A journal whose database is locked (or whose PostgreSQL server restarts)."""

    def get(self, key, canonical):
        raise OSError("database is locked")

    def put(self, key, canonical, result):
        raise OSError("database is locked")

    def calibration(self, name):
        return {}


def test_a_journal_that_fails_costs_a_call_never_the_answer(scripted):
    client = make_client(scripted, journal=BrokenJournal())
    result = ask(client)  # read failed: asked the provider; write failed: the paid answer is still returned
    assert result.text and scripted.count() == 1


def test_an_operator_restarted_in_the_same_interpreter_shares_the_limit_and_pays_nothing_twice(tmp_path):
    """Thread mode: a failed operator's calls still run when its replacement starts. The two runtimes share one
    limit per endpoint, and a replayed request that waited for a slot is answered by the journal."""
    from flink_memory.llm.runtime import acquire_runtime, release_runtime

    with ScriptedServer(lambda body: Reply(text="ok"), latency_s=0.6) as server:
        config = load_config(None, ["llm.provider=openai", f"llm.base_url={server.base_url}", "llm.max_concurrency=2",
                                    "llm.tokenizer=estimate", f"journal.path={tmp_path / 'journal.sqlite'}",
                                    "journal.drain_on_close_s=0.1"], environ={})
        first = acquire_runtime(config, None)
        requests = [first.factory.build([{"role": "user", "content": f"q{i}"}], prompt_version="t", kind="batch")
                    for i in range(4)]
        for request in requests[:2]:
            first.pool.submit(request)
        time.sleep(0.2)
        release_runtime(config, None, "batcher")  # closed while its two calls run (drain 0.1 s)
        second = acquire_runtime(config, None)
        for request in requests:  # the replay asks the same two again, then two more
            second.pool.submit(request)
        second.pool.wait([r.digest for r in requests], timeout_s=20)
        release_runtime(config, None, "batcher")
    asked = [b for b in server.requests if b["messages"][-1]["content"].startswith("q")]
    assert server.max_in_flight <= 2 and len(asked) == 4


def test_without_a_journal_an_identical_request_does_not_wait_for_the_one_in_flight():
    """The answer could only be shared through the journal: with none, waiting would only add latency."""
    with ScriptedServer(lambda body: Reply(text="ok"), latency_s=0.5) as server:
        client = make_client(server, "llm.tokenizer=estimate")
        request = client.requests.build([{"role": "user", "content": "same"}], prompt_version="t")
        threads = [threading.Thread(target=client.complete, args=(request,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert server.count() == 2 and server.max_in_flight == 2  # side by side, not one after the other
