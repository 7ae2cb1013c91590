"""Value types of the LLM layer: requests, results and the errors callers handle.

A leaf module: the client, the journal, the call pool and the stage cores all speak these types, and none
of them has to import another to do so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from flink_memory.digests import digest


@dataclass(frozen=True)
class ChatRequest:
    """A request in canonical form; equal requests have equal digests in every process.

    `kind` (plan, batch, part, merge, global) is for accounting only: it is not part of the canonical form,
    so it never changes a digest or a journal key.
    """

    model: str
    prompt_version: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    json_schema: str | None = None  # canonical JSON of the schema, kept as text so the request is hashable
    kind: str = field(default="", compare=False)

    @classmethod
    def build(
        cls,
        *,
        model: str,
        prompt_version: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        json_schema: dict[str, Any] | None = None,
        kind: str = "",
    ) -> ChatRequest:
        return cls(
            model=model,
            prompt_version=prompt_version,
            messages=tuple((m["role"], m["content"]) for m in messages),
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            json_schema=json.dumps(json_schema, sort_keys=True) if json_schema is not None else None,
            kind=kind,
        )

    def canonical(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt_version": self.prompt_version,
            "messages": [list(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "json_schema": self.json_schema,
        }

    @property
    def digest(self) -> str:
        return digest(self.canonical())

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    from_journal: bool = False
    latency_s: float = 0.0
    truncated: bool = False  # the provider stopped at max_tokens (finish_reason "length")
    kind: str = ""  # the request's kind (plan, batch, part, merge, global), for accounting


class LLMCallError(RuntimeError):
    """The provider failed after the SDK's retries; the caller keeps the work and tries again later."""


class ContextOverflow(LLMCallError):
    """The request is too long for the model (the provider said so, or our count now says so): re-pack it."""


class Journal(Protocol):
    """A durable store of results by request digest (flink_memory.llm.journal implements it)."""

    def get(self, key: str, canonical: dict[str, Any]) -> ChatResult | None: ...

    def put(self, key: str, canonical: dict[str, Any], result: ChatResult) -> None: ...

    def calibration(self, name: str) -> dict[str, float]: ...

    def save_calibration(self, name: str, ratios: dict[str, float]) -> None: ...
