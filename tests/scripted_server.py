"""A scriptable OpenAI-compatible chat server over real HTTP (stdlib only), for tests and benchmarks.

A script is a function from the parsed request body to a `Reply`; it may also fault: a status code (429,
500, ...), a delay, a hang, a dropped connection or a malformed body. Every chat request is recorded.

`count` is how the stand-in provider counts tokens (our estimate by default; `chars_per_token(4)` is close to
real BPE on English). With `context_window`, a prompt + max_tokens above it is rejected with HTTP 400 like
llama.cpp does; a reply of max_tokens or more tokens is cut there with `finish_reason: length`. Other
paths (/tokenize) answer 404, as a hosted provider does.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flink_memory.tokens.estimate import estimate_messages, estimate_tokens


@dataclass
class Reply:
    text: str = "ok"
    status: int = 200
    delay_s: float = 0.0
    fault: str | None = None  # None | "hang" | "close" | "malformed"
    error: str | None = None  # the error message of a status other than 200 (default "scripted <status>")
    finish_reason: str | None = None  # None: "length" when the text reaches max_tokens, else "stop"
    headers: dict[str, str] = field(default_factory=dict)


Script = Callable[[dict[str, Any]], Reply]

_FACT = re.compile(r"\b(?:[A-Z][a-z]+(?:-[A-Z][a-z]+)?|\d[\d.,:/-]*\d|\d)\b")


Count = Callable[[str], int]


def chars_per_token(n: float) -> Count:
    """A provider that counts ceil(len / n) tokens for a text."""
    return lambda text: -(-len(text) // n) if text else 0


def prompt_count(messages: list[dict[str, Any]], count: Count) -> int:
    """A chat template's count: 4 tokens around each message, 3 to prime the reply."""
    if count is estimate_tokens:
        return estimate_messages(messages)
    return 3 + sum(4 + count(str(m.get("role", ""))) + count(str(m.get("content") or "")) for m in messages)


def fact_keeping_summary(body: dict[str, Any], count: Count = estimate_tokens) -> str:
    """A deterministic stand-in for a summarizer: keeps capitalized names and numbers, within max_tokens."""
    user = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
    budget = int(body.get("max_tokens") or 256) - 4
    words: list[str] = []
    seen: set[str] = set()
    used = 0
    for match in _FACT.findall(user):
        if match in seen:
            continue
        cost = count(match) + 1
        if used + cost > budget:
            break
        seen.add(match)
        words.append(match)
        used += cost
    return "Summary: " + " ".join(words) if words else "Summary: (nothing notable)"


def default_script(body: dict[str, Any]) -> Reply:
    return Reply(text=fact_keeping_summary(body))


class ScriptedServer:
    """Starts on 127.0.0.1 with a free port; use as a context manager."""

    def __init__(self, script: Script | None = None, latency_s: float = 0.0, *, count: Count = estimate_tokens,
                 context_window: int | None = None) -> None:
        self.count_tokens = count
        self.script: Script = script or (lambda body: Reply(text=fact_keeping_summary(body, count)))
        self.latency_s = latency_s
        self.context_window = context_window
        self.rejected: list[dict[str, Any]] = []  # requests refused with HTTP 400 for their length
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        # (start, end, body) per answered request, monotonic seconds
        self.spans: list[tuple[float, float, dict[str, Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._release_hangs = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body leave in two writes: with Nagle's algorithm on, the body would wait for the
            # client's delayed ACK (40 ms on Linux) on every response, a delay no production server adds
            disable_nagle_algorithm = True

            def log_message(self, *_args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._not_found()
                    return
                with server._lock:
                    server.requests.append(body)
                    server.authorizations.append(self.headers.get("Authorization"))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                started = time.monotonic()
                try:
                    self._answer(body)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                        server.spans.append((started, time.monotonic(), body))

            def _send(self, status: int, payload: str, headers: dict[str, str] | None = None) -> None:
                data = payload.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self) -> None:
                """Like a hosted provider: no /tokenize, so clients fall back to calibration."""
                self._send(404, json.dumps({"error": {"message": "not found", "type": "not_found"}}))

            def _answer(self, body: dict[str, Any]) -> None:
                messages = body.get("messages", [])
                prompt_tokens = prompt_count(messages, server.count_tokens)
                max_tokens = int(body.get("max_tokens") or 0)
                if server.context_window and prompt_tokens + max_tokens > server.context_window:
                    with server._lock:
                        server.rejected.append(body)
                    message = (f"request ({prompt_tokens} tokens) exceeds the available context size "
                               f"({server.context_window} tokens), try increasing it")
                    self._send(400, json.dumps({"error": {"code": 400, "message": message,
                                                          "type": "exceed_context_size_error",
                                                          "n_prompt_tokens": prompt_tokens,
                                                          "n_ctx": server.context_window}}))
                    return
                reply = server.script(body)
                delay = server.latency_s + reply.delay_s
                if delay:
                    time.sleep(delay)
                if reply.fault == "hang":
                    server._release_hangs.wait(timeout=600)
                    return
                if reply.fault == "close":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if reply.status != 200:
                    message = reply.error or f"scripted {reply.status}"
                    payload = json.dumps({"error": {"message": message, "type": "scripted"}})
                elif reply.fault == "malformed":
                    payload = '{"choices": [ {"message": '
                else:
                    text, finish = reply.text, reply.finish_reason or "stop"
                    if max_tokens and server.count_tokens(text) >= max_tokens:
                        finish = "length"
                    completion_tokens = server.count_tokens(text)
                    payload = json.dumps(
                        {
                            "id": f"chatcmpl-{len(server.requests)}",
                            "object": "chat.completion",
                            "created": 0,
                            "model": body.get("model", "scripted"),
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": text},
                                    "finish_reason": finish,
                                }
                            ],
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": completion_tokens,
                                "total_tokens": prompt_tokens + completion_tokens,
                            },
                        }
                    )
                self._send(reply.status, payload, reply.headers)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # a short poll: shutdown() waits for the loop's next look, 0.5 s by default, at every test's end
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release_hangs.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

