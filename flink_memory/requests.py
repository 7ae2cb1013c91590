"""Chat requests as values: the canonical request, its result, the errors callers handle, and the factory
that builds requests within the token budget.

A leaf module with no SDK or network import: the stage cores and the summary and chunk builders make
requests and read results here, and only the client (`flink_memory.llm.chat_client`) sends them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from flink_memory.config import LLMConfig
from flink_memory.digests import digest
from flink_memory.tokens.budget import Budget
from flink_memory.tokens.counter import TokenCounter


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
    # the scale it was packed at (a factor of the request's raw count: with what the provider reported of its
    # own text, a job's earlier round `ReduceJob.own_ratio` or each summary's count when it was written
    # `prompts.written_bound`): what the client checks it by, never what other calls taught the process since.
    # Not canonical either
    bound: float | None = field(default=None, compare=False)

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
        bound: float | None = None,
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
            bound=bound,
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

    @functools.cached_property
    def digest(self) -> str:
        """The journal key and pool key (computed once: a request is frozen, and digests are asked often)."""
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


@dataclass(frozen=True)
class RequestFactory:
    """Builds canonical requests from the LLM settings; plain data, so operators can pickle it."""

    model: str
    max_output_tokens: int
    context_window: int
    temperature: float = 0.0
    seed: int | None = None
    structured_output: bool = True
    counter: TokenCounter = field(default_factory=TokenCounter, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: LLMConfig, counter: TokenCounter | None = None) -> RequestFactory:
        return cls(
            model=config.model,
            max_output_tokens=config.max_output_tokens,
            context_window=config.context_window,
            temperature=config.temperature,
            seed=config.seed,
            structured_output=config.structured_output,
            counter=counter or TokenCounter(),
        )

    @property
    def budget(self) -> Budget:
        return Budget(self.context_window, self.max_output_tokens, self.counter)

    def build(
        self,
        messages: list[dict[str, str]],
        *,
        prompt_version: str,
        max_tokens: int | None = None,
        json_schema: dict[str, Any] | None = None,
        scale: float | None = None,
        kind: str = "",
        bound: float | None = None,
    ) -> ChatRequest:
        """A request that fits the window by the counter at `scale` (the job's frozen scale), or at `bound`
        where its own text taught that (`ChatRequest.bound`, else `scale`)."""
        request = ChatRequest.build(
            model=self.model,
            prompt_version=prompt_version,
            messages=messages,
            max_tokens=max_tokens or self.max_output_tokens,
            temperature=self.temperature,
            seed=self.seed,
            json_schema=json_schema if self.structured_output else None,
            kind=kind,
            bound=bound if bound is not None else scale,
        )
        self.budget.check(messages, request.max_tokens, scale if bound is None else bound)
        return request
