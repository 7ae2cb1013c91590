"""The door every HTTP request passes before the API or MCP sees it (plain ASGI, no framework):

- the key: `Authorization: Bearer <key>` (or `X-API-Key`), checked against the keys file; no valid key is
  401 (the health check, the OpenAPI document and the browser page's files need none); the key's grant rides in
  `scope["state"]`;
- the body: read whole before the app runs, at most `max_body` bytes (413), within `body_timeout_s` (408), so a
  slow or oversized upload never reaches a handler or holds it;
- one access-log line per request: method, path, status and milliseconds; never a header (the key), a query
  string or a body (memory text).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from flink_memory.service.keys import KeyRing
from flink_memory.service.memory import Everyone
from flink_memory.service.models import MAX_BODY_BYTES
from flink_memory.service.page import is_page

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC = frozenset({"/v1/health", "/openapi.json"})
log = logging.getLogger("flink_memory.service")


class BodyError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


async def answer(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def presented_key(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value:
            return value.decode("latin-1").strip()
    return None


class Guard:
    """ASGI middleware: authentication, body limits and the access log, in front of `app`."""

    def __init__(self, app: ASGIApp, keyring: KeyRing | None, *, max_body: int = MAX_BODY_BYTES,
                 body_timeout_s: float = 10.0) -> None:
        self.app = app
        self.keyring = keyring
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 0}

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, logged_send)
        finally:
            log.info("%s %s %s %.1fms", scope.get("method"), scope.get("path"), status["code"] or "-",
                     (time.perf_counter() - started) * 1000)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        grant: Any = Everyone()
        if self.keyring is not None and scope["path"] not in PUBLIC and not is_page(scope["path"]):
            grant = self.keyring.verify(presented_key(scope))
            if grant is None:
                await answer(send, 401, "a valid key is required: Authorization: Bearer <key>",
                             [(b"www-authenticate", b"Bearer")])
                return
        scope.setdefault("state", {})["grant"] = grant
        try:
            body = await self._read_body(scope, receive)
        except BodyError as exc:
            await answer(send, exc.status, str(exc), [(b"connection", b"close")])
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise BodyError(413, f"the body is over {self.max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            with anyio.fail_after(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise BodyError(400, "the client went away")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        raise BodyError(413, f"the body is over {self.max_body} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise BodyError(408, f"the body did not arrive within {self.body_timeout_s:g} s") from None
