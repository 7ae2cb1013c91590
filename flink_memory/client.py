"""A small client of `flink-memory serve` for agents in Python: the standard library's HTTP only (urllib), so
it adds no dependency; `AsyncMemoryClient` runs the same calls in a worker thread for asyncio code.

    from flink_memory.client import MemoryClient

    memory = MemoryClient("http://127.0.0.1:8765", key="fmk_...", agent_id="agent-0")
    memory.remember("The user's dog is a beagle named Rex.")
    for hit in memory.recall("What is the name of my dog?"):
        print(hit.score, hit.text)

Answers are the service's models (flink_memory.service.models, flink_memory.store.Recalled); an answer other
than success raises MemoryServiceError with the status and the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from flink_memory.service.models import Accepted, Health, MemoryResponse, Mode, RecallResponse
from flink_memory.store import Recalled


class MemoryServiceError(RuntimeError):
    """The service answered with an error: `status` (401 no valid key, 403 read-only, 404 no such agent for
    this key, 413, 422 invalid or a record the job would dead-letter, 503 store or input unavailable)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class MemoryClient:
    """One agent's memory (`agent_id`, or name one per call) on a flink-memory server."""

    def __init__(self, base_url: str = "http://127.0.0.1:8765", *, key: str | None = None,
                 agent_id: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_id = agent_id
        self.timeout_s = timeout_s
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail", exc.reason)
            except (ValueError, AttributeError):
                detail = exc.reason
            raise MemoryServiceError(exc.code, str(detail)) from None

    def _agent(self, agent_id: str | None) -> str:
        agent = agent_id or self.agent_id
        if not agent:
            raise ValueError("name the agent: MemoryClient(agent_id=...) or agent_id=... per call")
        return "/v1/agents/" + quote(agent, safe="")

    def health(self) -> Health:
        return Health.model_validate(self._call("GET", "/v1/health"))

    def memory(self, *, tree: bool = False, agent_id: str | None = None) -> MemoryResponse:
        """The current global summary (and with `tree` the live tree below it)."""
        path = self._agent(agent_id) + "/memory" + ("?tree=true" if tree else "")
        return MemoryResponse.model_validate(self._call("GET", path))

    def recall(self, question: str, *, k: int = 5, mode: Mode = "hybrid", agent_id: str | None = None,
               diversity: float | None = None) -> list[Recalled]:
        """The live units and summaries that best match the question, best first (covering distinct memory:
        `diversity` 0..1, default the server's)."""
        body: dict[str, Any] = {"question": question, "k": k, "mode": mode}
        if diversity is not None:
            body["diversity"] = diversity
        answer = self._call("POST", self._agent(agent_id) + "/recall", body)
        return RecallResponse.model_validate(answer).hits

    def remember(self, text: str | None = None, *, messages: list[dict[str, Any]] | None = None,
                 id: str | None = None, ts: str | None = None, metadata: dict[str, Any] | None = None,
                 agent_id: str | None = None) -> Accepted:
        """A fact or note (`text`) or a conversation (`messages`); the same `id` again is an update."""
        record = {name: value for name, value in
                  (("text", text), ("messages", messages), ("id", id), ("ts", ts), ("metadata", metadata))
                  if value is not None}
        return Accepted.model_validate(self._call("POST", self._agent(agent_id) + "/memories", record))

    def delete(self, id: str, *, agent_id: str | None = None) -> Accepted:
        """Retract the record with this id."""
        return Accepted.model_validate(self._call("DELETE", f"{self._agent(agent_id)}/memories/{quote(id, safe='')}"))

    def forget(self, *, agent_id: str | None = None) -> Accepted:
        """Forget everything of the agent."""
        return Accepted.model_validate(self._call("DELETE", self._agent(agent_id)))


class AsyncMemoryClient:
    """MemoryClient for asyncio: each call runs in a worker thread (`asyncio.to_thread`)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8765", **options: Any) -> None:
        self.sync = MemoryClient(base_url, **options)

    async def health(self) -> Health:
        return await asyncio.to_thread(self.sync.health)

    async def memory(self, **options: Any) -> MemoryResponse:
        return await asyncio.to_thread(lambda: self.sync.memory(**options))

    async def recall(self, question: str, **options: Any) -> list[Recalled]:
        return await asyncio.to_thread(lambda: self.sync.recall(question, **options))

    async def remember(self, text: str | None = None, **options: Any) -> Accepted:
        return await asyncio.to_thread(lambda: self.sync.remember(text, **options))

    async def delete(self, id: str, **options: Any) -> Accepted:
        return await asyncio.to_thread(lambda: self.sync.delete(id, **options))

    async def forget(self, **options: Any) -> Accepted:
        return await asyncio.to_thread(lambda: self.sync.forget(**options))
