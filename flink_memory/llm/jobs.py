"""Driving multi-round LLM jobs over a CallPool without blocking, with backoff on provider failures."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flink_memory.llm.client import ChatRequest, ChatResult, ContextOverflow, LLMCallError
from flink_memory.llm.pool import CallPool


class Retryable(Protocol):
    attempts: int
    retry_at_ms: int


@dataclass
class Outcome:
    state: str  # "done" | "pending" | "waiting" | "failed"
    value: Any = None
    error: BaseException | None = None
    results: list[ChatResult] = field(default_factory=list)
    rejections: int = 0  # requests re-packed after a length rejection


def backoff_ms(attempts: int, base_s: float, max_s: float) -> int:
    return int(min(max_s, base_s * 2 ** max(0, attempts - 1)) * 1000)


def now_ms() -> int:
    return int(time.time() * 1000)


def wake_times_ms(now: int, due_ms: int | None, poll_ms: int, recheck_ms: int) -> tuple[int, int, int]:
    """Timer times for a key with work due at `due_ms` (soon when None): the due time, and the next two
    points of a fixed recheck grid.

    A timer in a checkpoint is only as fresh as the config and the registrations that set it: a deadline
    computed under an older config (a 600 s batch timeout restored as 5 s) is re-examined at the next grid
    point, and a key whose latest registrations missed a checkpoint (PyFlink 2.3 in process mode with
    bundles larger than one) still holds the grid timers an earlier activation registered. Times snap to
    the poll grid so that repeated requests of one key coincide and Flink keeps one timer for them.
    """
    target = max(due_ms or 0, now + poll_ms)
    grid = now - now % recheck_ms + recheck_ms
    return target - target % poll_ms + poll_ms, grid, grid + recheck_ms


def step(
    job: Retryable,
    requests: Callable[[], list[ChatRequest]],
    advance: Callable[[list[ChatResult]], Any],
    pool: CallPool,
    *,
    at_ms: int,
    base_backoff_s: float,
    max_backoff_s: float,
    repack: Callable[[], bool] | None = None,
) -> Outcome:
    """Advance a job as far as finished calls allow; submits what it needs next.

    A request refused for its length (ContextOverflow) is re-packed smaller at once by `repack` (which says
    False once it has tried too often). Other provider failures (LLMCallError) put the job to sleep with
    exponential backoff; it stays in state. Anything else is a bug and is raised, so Flink restarts from the
    last checkpoint.
    """
    consumed: list[ChatResult] = []
    rejections = 0
    while True:
        if job.retry_at_ms > at_ms:
            return Outcome("waiting", results=consumed)
        wanted = requests()
        for request in wanted:
            pool.submit(request)
        results = [pool.poll(request) for request in wanted]
        if any(result is None for result in results):
            return Outcome("pending", results=consumed, rejections=rejections)
        failed = [(req, res) for req, res in zip(wanted, results) if isinstance(res, BaseException)]
        if failed:
            pool.forget(req for req, _ in failed)
            error = failed[0][1]
            if not isinstance(error, LLMCallError):
                raise error
            if isinstance(error, ContextOverflow) and repack is not None and repack():
                pool.forget(wanted)
                rejections += 1
                continue
            job.attempts += 1
            job.retry_at_ms = at_ms + backoff_ms(job.attempts, base_backoff_s, max_backoff_s)
            return Outcome("failed", error=error, results=consumed, rejections=rejections)
        pool.forget(wanted)
        done = [r for r in results if isinstance(r, ChatResult)]
        consumed.extend(done)
        value = advance(done)
        job.attempts = 0
        if value is not None:
            return Outcome("done", value=value, results=consumed, rejections=rejections)


def run_to_end(
    job: Retryable,
    requests: Callable[[], list[ChatRequest]],
    advance: Callable[[list[ChatResult]], Any],
    pool: CallPool,
    *,
    base_backoff_s: float,
    max_backoff_s: float,
    on_outcome: Callable[[Outcome], None] | None = None,
    repack: Callable[[], bool] | None = None,
) -> Any:
    """Block until the job is done (end of a bounded input): waits out backoffs, never gives up."""
    while True:
        outcome = step(job, requests, advance, pool, at_ms=now_ms(), base_backoff_s=base_backoff_s,
                       max_backoff_s=max_backoff_s, repack=repack)
        if on_outcome is not None:
            on_outcome(outcome)
        if outcome.state == "done":
            return outcome.value
        if outcome.state == "pending":
            pool.wait(requests(), timeout_s=5.0)
        elif outcome.state in ("waiting", "failed"):
            time.sleep(max(0.0, (job.retry_at_ms - now_ms()) / 1000))
