"""One client for any OpenAI-compatible endpoint, with budgets, usage accounting and the replay journal.

Retries with exponential backoff on 429, 5xx, timeouts and dropped connections are the openai SDK's own
(`max_retries`, `timeout`); this layer adds the context-window check, a concurrency limit, a canonical
request digest (the key for plans and the journal) and counters. The API key is read at construction (from
`llm.api_key_file`, else the variable named by `llm.api_key_env`) and kept only inside the SDK client: never
in config, state, logs or output.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import openai

from flink_memory.config import ConfigError, LLMConfig
from flink_memory.requests import (
    ChatRequest,
    ChatResult,
    ContextOverflow,
    Journal,
    LLMCallError,
    RequestFactory,
)
from flink_memory.tokens.budget import RequestTooLarge
from flink_memory.tokens.counter import TokenCounter

log = logging.getLogger(__name__)


# Texts of providers that reject a prompt for its length (llama.cpp, OpenAI, vLLM, Ollama: HTTP 400; Hugging
# Face TGI: 422 "`inputs` tokens + `max_new_tokens` must be <= N"; some gateways: 413)
_LENGTH_REJECTION = re.compile(
    r"exceed_context_size|exceeds the available context|context[_ ]length|maximum context|context window|"
    r"too many tokens|prompt is too long|input is too long|`?inputs`? tokens \+ `?max_new_tokens`? must be",
    re.IGNORECASE)
_REPORTED_COUNT = re.compile(
    r"request \((\d+) tokens\)|resulted in (\d+) tokens|requested (\d+) tokens|n_prompt_tokens\D{0,4}(\d+)|"
    r"Given: (\d+) `?inputs`? tokens")
_LENGTH_STATUSES = (400, 413, 422)


def length_rejection(exc: Exception) -> tuple[bool, int | None]:
    """Whether a provider error says the prompt is too long, and the prompt size it reported."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in _LENGTH_STATUSES:
        return False, None
    if exc.status_code == 413:  # (request entity too large: whatever the text says)
        return True, None
    text = f"{exc} {getattr(exc, 'body', '')}"
    if not _LENGTH_REJECTION.search(text):
        return False, None
    match = _REPORTED_COUNT.search(text)
    reported = next((int(g) for g in match.groups() if g), None) if match else None
    return True, reported


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
    max_prompt_tokens: int = 0
    context_rejections: int = 0
    truncated: int = 0
    # what holding units for their agent's first batch report cost (stages.batcher): the time the first held
    # unit of each agent waited, summed, and the longest such wait
    first_report_wait_ms: int = 0
    max_first_report_wait_ms: int = 0
    calls_by_kind: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def retries(self) -> int:
        return max(0, self.http_requests - self.calls - self.failures)

    def add(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                if name.startswith("max_"):
                    setattr(self, name, max(getattr(self, name), int(value)))
                else:
                    setattr(self, name, getattr(self, name) + value)

    def count_kind(self, kind: str) -> None:
        with self._lock:
            self.calls_by_kind[kind or "other"] = self.calls_by_kind.get(kind or "other", 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                **{f"calls_{kind}": n for kind, n in sorted(self.calls_by_kind.items())},
                "calls": self.calls,
                "http_requests": self.http_requests,
                "retries": self.retries,
                "failures": self.failures,
                "journal_hits": self.journal_hits,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "latency_s": round(self.latency_s, 3),
                "max_prompt_estimate": self.max_prompt_estimate,
                "max_prompt_tokens": self.max_prompt_tokens,
                "context_rejections": self.context_rejections,
                "truncated": self.truncated,
                "first_report_wait_ms": self.first_report_wait_ms,
                "max_first_report_wait_ms": self.max_first_report_wait_ms,
            }


def resolve_api_key(config: LLMConfig) -> str | None:
    """The key from `api_key_file` when set (no fall back: a missing secret must not go unnoticed), else from
    the variable named by `api_key_env`. A file keeps the key out of the environments Flink logs."""
    if config.api_key_file is None:
        return os.environ.get(config.api_key_env)
    path = Path(config.api_key_file).expanduser()
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:  # the message names the path, never the content
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"llm.api_key_file: cannot read the API key from {path}: {reason}") from None
    if not key:
        raise ConfigError(f"llm.api_key_file: {path} is empty")
    return key


class LLMClient:
    """Blocking chat completions; safe to share between threads."""

    def __init__(
        self,
        config: LLMConfig,
        base_url: str,
        *,
        journal: Journal | None = None,
        api_key: str | None = None,
        counter: TokenCounter | None = None,
    ) -> None:
        self.config = config
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.counter = counter or TokenCounter()
        self.requests = RequestFactory.from_config(config, self.counter)
        self.budget = self.requests.budget
        self.stats = UsageStats()
        self.journal = journal
        self._slots = _slots_for(self.base_url, config.model, config.max_concurrency)
        self._in_flight = 0
        self._closing = False
        self._state_lock = threading.Lock()
        key = api_key if api_key is not None else resolve_api_key(config)
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

    def _from_journal(self, request: ChatRequest, messages: list[dict[str, Any]]) -> ChatResult | None:
        if self.journal is None:
            return None
        try:
            cached = self.journal.get(request.digest, request.canonical())
        except Exception as exc:  # noqa: BLE001 - a journal that cannot answer costs a call, never the work
            log.warning("journal read failed, asking the provider: %s", exc)
            return None
        if cached is None:
            return None
        self.stats.add(journal_hits=1)
        if cached.prompt_tokens:  # the provider's count from when it was made still calibrates
            self._observe(messages, cached.prompt_tokens, request.kind)
        return replace(cached, kind=request.kind)

    def complete(self, request: ChatRequest) -> ChatResult:
        """One completion: from the journal when it holds this request, else from the provider."""
        messages = request.message_dicts()
        if (cached := self._from_journal(request, messages)) is not None:
            return cached
        # checked at the scale it was packed at: what other calls taught the process since depends on which
        # ended first, and a request refused by it would be cut again differently in every run (the provider's
        # own refusal for length re-packs it the same way every time)
        scale = request.bound if request.bound is not None else self.counter.scale_for(request.kind)
        try:
            estimate = self.budget.check(messages, request.max_tokens, scale)
        except RequestTooLarge as exc:
            self.stats.add(context_rejections=1)
            raise ContextOverflow(f"not sent: {exc}") from None
        self.stats.add(max_prompt_estimate=estimate)
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
        if self.journal is None:  # (nothing to share an answer through)
            return self._call(request, messages, kwargs, estimate)
        while True:  # one call per request in this interpreter: a replay of a call still running (its
            with _INFLIGHT_LOCK:  # operator restarted) waits for it, then takes its journal row
                running = _INFLIGHT.get(request.digest)
                if running is None:
                    _INFLIGHT[request.digest] = mine = threading.Event()
                    break
            ended = running.wait(self.config.timeout_s * (self.config.max_retries + 1))
            if (cached := self._from_journal(request, messages)) is not None:
                return cached
            if not ended:  # (the other call outlasted every timeout of its own: do not wait for it again)
                return self._call(request, messages, kwargs, estimate)
        try:
            return self._call(request, messages, kwargs, estimate)
        finally:
            with _INFLIGHT_LOCK:
                _INFLIGHT.pop(request.digest, None)
            mine.set()

    def _call(self, request: ChatRequest, messages: list[dict[str, Any]], kwargs: dict[str, Any],
              estimate: int) -> ChatResult:
        started = time.monotonic()
        with self._slots, self._calling():
            try:
                response = self._sdk.chat.completions.create(**kwargs)
            except (openai.OpenAIError, ValueError) as exc:  # ValueError: a body that is not JSON
                self.stats.add(failures=1, latency_s=time.monotonic() - started)
                too_long, reported = length_rejection(exc)
                if too_long:
                    self.stats.add(context_rejections=1)
                    # (a rejection's count may include the output: learned here, never kept for later jobs)
                    self.counter.observe(messages, reported or estimate + estimate // 4 + 1, request.kind,
                                         rejection=True)
                    raise ContextOverflow(f"provider rejected the prompt for its length: {_safe_message(exc)}") \
                        from None
                raise LLMCallError(f"{type(exc).__name__}: {_safe_message(exc)}") from None
        elapsed = time.monotonic() - started
        try:
            text = response.choices[0].message.content or ""
            truncated = response.choices[0].finish_reason == "length"
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
            truncated=truncated,
            kind=request.kind,
        )
        if prompt_tokens:
            self._observe(messages, prompt_tokens, request.kind)
        self.stats.count_kind(request.kind)
        self.stats.add(
            calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, latency_s=elapsed,
            max_prompt_tokens=prompt_tokens, truncated=int(truncated),
        )
        if self.journal is not None:
            try:
                self.journal.put(request.digest, request.canonical(), result)
            except Exception as exc:  # noqa: BLE001 - the answer is paid for: use it even if it cannot be kept
                log.warning("journal write failed (a replay would ask again): %s", exc)
        return result

    def _observe(self, messages: list[dict[str, Any]], reported: int, kind: str) -> None:
        """Calibrate the process's counter from a count the provider reported (what its token counts and
        benchmarks show; packing decisions learn from each agent's own reports, in keyed state)."""
        self.counter.observe(messages, reported, kind)

    @contextmanager
    def _calling(self) -> Iterator[None]:
        with self._state_lock:
            if self._closing:
                raise LLMCallError("the client is closed")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._in_flight -= 1
            self._close_if_idle()

    def close(self) -> None:
        """No new calls; the connection closes when the calls still running have ended (their answers reach
        the journal, so a restarted operator does not pay for them again)."""
        with self._state_lock:
            self._closing = True
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        with self._state_lock:
            close_now = self._closing and not self._in_flight
        if close_now:  # (closing the SDK client twice is harmless)
            self._sdk.close()


_INFLIGHT: dict[str, threading.Event] = {}  # request digest -> set when its call has ended
_INFLIGHT_LOCK = threading.Lock()
_SLOTS: dict[tuple[str, str, int], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slots_for(base_url: str, model: str, max_concurrency: int) -> threading.BoundedSemaphore:
    """One limit per endpoint and model in this interpreter: a client made after a restart shares it with
    the closed one's calls still running, so the provider never sees more than llm.max_concurrency."""
    with _SLOTS_LOCK:
        return _SLOTS.setdefault((base_url, model, max_concurrency), threading.BoundedSemaphore(max_concurrency))


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
