"""One client for any OpenAI-compatible endpoint, with budgets, usage accounting and the replay journal.

Retries with exponential backoff on 429, 5xx, timeouts and dropped connections are the openai SDK's own
(`max_retries`, `timeout`); this layer adds the context-window check, a concurrency limit, a canonical
request digest (the key for plans and the journal) and counters. The API key is read from the environment
at construction and kept only inside the SDK client: never in config, state, logs or output.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import openai

from flink_memory.config import LLMConfig
from flink_memory.digests import digest
from flink_memory.tokens import Budget

if TYPE_CHECKING:
    from flink_memory.llm.journal import Journal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatRequest:
    """A request in canonical form; equal requests have equal digests in every process."""

    model: str
    prompt_version: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    json_schema: str | None = None  # canonical JSON of the schema, kept as text so the request is hashable

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
    ) -> ChatRequest:
        return cls(
            model=model,
            prompt_version=prompt_version,
            messages=tuple((m["role"], m["content"]) for m in messages),
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            json_schema=json.dumps(json_schema, sort_keys=True) if json_schema is not None else None,
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
class RequestFactory:
    """Builds canonical requests from the LLM settings; plain data, so operators can pickle it."""

    model: str
    max_output_tokens: int
    context_window: int
    temperature: float = 0.0
    seed: int | None = None
    structured_output: bool = True

    @classmethod
    def from_config(cls, config: LLMConfig) -> RequestFactory:
        return cls(
            model=config.model,
            max_output_tokens=config.max_output_tokens,
            context_window=config.context_window,
            temperature=config.temperature,
            seed=config.seed,
            structured_output=config.structured_output,
        )

    @property
    def budget(self) -> Budget:
        return Budget(self.context_window, self.max_output_tokens)

    def build(
        self,
        messages: list[dict[str, str]],
        *,
        prompt_version: str,
        max_tokens: int | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> ChatRequest:
        request = ChatRequest.build(
            model=self.model,
            prompt_version=prompt_version,
            messages=messages,
            max_tokens=max_tokens or self.max_output_tokens,
            temperature=self.temperature,
            seed=self.seed,
            json_schema=json_schema if self.structured_output else None,
        )
        self.budget.check(messages, request.max_tokens)
        return request


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    from_journal: bool = False
    latency_s: float = 0.0


class LLMCallError(RuntimeError):
    """The provider failed after the SDK's retries; the caller keeps the work and tries again later."""


@dataclass
class UsageStats:
    """Counters shared by every caller of one client (thread-safe)."""

    calls: int = 0
    http_requests: int = 0
    failures: int = 0
    journal_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    max_prompt_estimate: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def retries(self) -> int:
        return max(0, self.http_requests - self.calls - self.failures)

    def add(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                if name == "max_prompt_estimate":
                    self.max_prompt_estimate = max(self.max_prompt_estimate, int(value))
                else:
                    setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                "calls": self.calls,
                "http_requests": self.http_requests,
                "retries": self.retries,
                "failures": self.failures,
                "journal_hits": self.journal_hits,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "latency_s": round(self.latency_s, 3),
                "max_prompt_estimate": self.max_prompt_estimate,
            }


class LLMClient:
    """Blocking chat completions; safe to share between threads."""

    def __init__(
        self,
        config: LLMConfig,
        base_url: str,
        *,
        journal: Journal | None = None,
        api_key: str | None = None,
    ) -> None:
        self.config = config
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.requests = RequestFactory.from_config(config)
        self.budget = self.requests.budget
        self.stats = UsageStats()
        self.journal = journal
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        key = api_key if api_key is not None else os.environ.get(config.api_key_env)
        http_client = openai.DefaultHttpxClient(event_hooks={"request": [self._count_http_request]})
        self._sdk = openai.OpenAI(
            api_key=key or "not-needed",
            base_url=self.base_url,
            timeout=config.timeout_s,
            max_retries=config.max_retries,
            http_client=http_client,
        )

    def __repr__(self) -> str:  # never show the key
        return f"LLMClient(base_url={self.base_url!r}, model={self.config.model!r})"

    def _count_http_request(self, _request: Any) -> None:
        self.stats.add(http_requests=1)

    def complete(self, request: ChatRequest) -> ChatResult:
        """One completion: from the journal when it holds this request, else from the provider."""
        messages = request.message_dicts()
        estimate = self.budget.check(messages, request.max_tokens)
        self.stats.add(max_prompt_estimate=estimate)
        key = request.digest
        if self.journal is not None:
            cached = self.journal.get(key, request.canonical())
            if cached is not None:
                self.stats.add(journal_hits=1)
                return cached
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if request.seed is not None:
            kwargs["seed"] = request.seed
        if request.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": json.loads(request.json_schema), "strict": True},
            }
        if self.config.provider == "embedded":
            kwargs["extra_body"] = {"cache_prompt": False}  # llama.cpp: repeatable output for equal requests
        started = time.monotonic()
        with self._slots:
            try:
                response = self._sdk.chat.completions.create(**kwargs)
            except (openai.OpenAIError, ValueError) as exc:  # ValueError: a body that is not JSON
                self.stats.add(failures=1, latency_s=time.monotonic() - started)
                raise LLMCallError(f"{type(exc).__name__}: {_safe_message(exc)}") from None
        elapsed = time.monotonic() - started
        try:
            text = response.choices[0].message.content or ""
            usage = response.usage
            prompt_tokens = int(usage.prompt_tokens) if usage else 0
            completion_tokens = int(usage.completion_tokens) if usage else 0
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            self.stats.add(failures=1, latency_s=elapsed)
            raise LLMCallError(f"malformed response from provider: {exc}") from None
        result = ChatResult(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            model=getattr(response, "model", None) or request.model,
            latency_s=elapsed,
        )
        self.stats.add(
            calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, latency_s=elapsed
        )
        if self.journal is not None:
            self.journal.put(key, request.canonical(), result)
        return result

    def close(self) -> None:
        self._sdk.close()


def _safe_message(exc: Exception) -> str:
    """Provider error text without anything that looks like a credential."""
    text = str(exc)
    key_markers = ("sk-", "Bearer ")
    for marker in key_markers:
        while marker in text:
            start = text.index(marker)
            end = start + len(marker)
            while end < len(text) and not text[end].isspace() and text[end] not in "'\",}":
                end += 1
            text = text[:start] + "[redacted]" + text[end:]
    return text[:500]
