"""The call protocol every stage shares: jobs that ask for requests and advance on their results.

A job (a summary `ReduceJob`, a chunk `PlanJob`) is plain data in keyed state. `drive` moves it as far as
finished calls allow and says what to start next; it never waits and never touches a pool, so the stage
cores stay pure and a test answers calls with a dict. The Flink shell submits `Step.start` to its pool,
and hands finished results back on the key's next activation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from flink_memory.records import DeadLetter
from flink_memory.requests import ChatRequest, ChatResult, ContextOverflow, LLMCallError
from flink_memory.stages.channels import Channel, M
from flink_memory.stages.messages import StageMessage

if TYPE_CHECKING:
    from flink_memory.config import Config

# Results of finished calls by request digest: a ChatResult, or the error the call ended with.
Finished = Mapping[str, "ChatResult | BaseException"]


class CallJob(Protocol):
    """A job and the context its requests are built from (a RequestFactory for summaries, a PlanTask for plans)."""

    attempts: int
    retry_at_ms: int

    def requests(self, context: Any) -> list[ChatRequest]:
        """The calls of the current round (deterministic: a replay asks for the same ones)."""

    def advance(self, context: Any, results: list[ChatResult]) -> Any | None:
        """Apply a round's results; the job's value once it is done, else None (another round follows)."""

    def rejected(self, context: Any) -> bool:
        """A request was refused for its length: re-pack smaller; False once that was tried too often."""




class RecordFault(Exception):
    """An error of ours while handling one record a stage holds (`seq` in its queue, None: the incoming one).

    The shell counts the fault against that record, not against whichever record or timer woke the stage,
    and when it comes again dead-letters exactly that record."""

    def __init__(self, payload: str, seq: int | None, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.payload, self.seq, self.cause = payload, seq, cause


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 2.0
    max_s: float = 300.0

    def backoff_ms(self, attempts: int) -> int:
        return int(min(self.max_s, self.base_s * 2 ** min(40, max(0, attempts - 1))) * 1000)


@dataclass(frozen=True)
class Timing:
    """What every stage core takes from the config about time (one home): the backoff after a failed call, how
    long units stay editable, and when a stage next looks for state older than that (a sweep)."""

    retry: RetryPolicy
    editable_ms: int

    @classmethod
    def from_config(cls, config: Config) -> Timing:
        return cls(RetryPolicy(config.llm.retry_backoff_s, config.llm.retry_backoff_max_s),
                   int(config.memory.editable_for * 1000))

    def next_sweep_ms(self, now_ms: int) -> int:
        """The next look for old state: a tenth of memory.editable_for from now, at least a second."""
        return now_ms + max(1000, self.editable_ms // 10)

    def sweep_due(self, next_sweep_ms: int | None, now_ms: int) -> bool:
        return next_sweep_ms is not None and now_ms >= next_sweep_ms


@dataclass
class Step:
    """How far one `drive` moved a job: done (with its value), pending calls, waiting out a backoff, failed."""

    state: Literal["done", "pending", "waiting", "failed"]
    value: Any = None
    error: LLMCallError | None = None
    start: list[ChatRequest] = field(default_factory=list)  # submit these (idempotent by digest)
    results: list[ChatResult] = field(default_factory=list)  # consumed: account for them
    consumed: list[str] = field(default_factory=list)  # digests the pool may forget
    rejections: int = 0


def drive(job: CallJob, context: Any, finished: Finished, now_ms: int, retry: RetryPolicy) -> Step:
    """Advance `job` with the finished calls; never blocks.

    A length refusal (ContextOverflow) re-packs the job at once; any other provider failure (LLMCallError)
    puts it to sleep with exponential backoff, and it stays in state. Anything else is a bug and is raised.
    """
    progress = Step("pending")
    while True:
        if job.retry_at_ms > now_ms:
            progress.state = "waiting"
            return progress
        wanted = job.requests(context)
        answers = [finished.get(request.digest) for request in wanted]
        missing = [request for request, answer in zip(wanted, answers) if answer is None]
        if missing:
            progress.state, progress.start = "pending", missing
            return progress
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        if errors:
            error = errors[0]
            if not isinstance(error, LLMCallError):
                raise error
            if isinstance(error, ContextOverflow) and job.rejected(context):  # re-packed: other requests now
                progress.consumed.extend(request.digest for request in wanted)
                progress.rejections += 1
                continue
            # the answers that arrived stay with the pool: after the backoff only the failed calls go again
            progress.consumed.extend(request.digest for request, answer in zip(wanted, answers)
                                     if isinstance(answer, BaseException))
            job.attempts += 1
            job.retry_at_ms = now_ms + retry.backoff_ms(job.attempts)
            progress.state, progress.error = "failed", error
            return progress
        progress.consumed.extend(request.digest for request in wanted)
        results = [answer for answer in answers if isinstance(answer, ChatResult)]
        progress.results.extend(results)
        value = job.advance(context, results)
        job.attempts = 0
        if value is not None:
            progress.state, progress.value = "done", value
            return progress


@dataclass
class Effects:
    """What one activation of a stage core asks the shell to do."""

    out: list[StageMessage] = field(default_factory=list)  # sent to the next stage (the last's: out of the job)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    side: dict[Channel[Any], list[Any]] = field(default_factory=dict)  # per side channel (stages.channels)
    start: list[ChatRequest] = field(default_factory=list)
    waiting: list[ChatRequest] = field(default_factory=list)  # calls in flight this key waits for
    wake_at_ms: int | None = None  # a time-based wake-up for work (backoff, batch timeout, global refresh)
    sweep_at_ms: int | None = None  # housekeeping (sealing old state): not work, a key can be idle with it
    results: list[ChatResult] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    failures: list[LLMCallError] = field(default_factory=list)
    rejections: int = 0
    counts: Counter[str] = field(default_factory=Counter)

    def emit(self, channel: Channel[M], message: M) -> None:
        """Emit `message` on a side channel the stage declares (its StageSpec's `channels`)."""
        self.side.setdefault(channel, []).append(message)

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing scheduled: the key needs no wake-up."""
        return not self.waiting and self.wake_at_ms is None

    def wake(self, at_ms: int | None) -> None:
        if at_ms is not None:
            self.wake_at_ms = at_ms if self.wake_at_ms is None else min(self.wake_at_ms, at_ms)

    def sweep(self, at_ms: int | None) -> None:
        if at_ms is not None:
            self.sweep_at_ms = at_ms if self.sweep_at_ms is None else min(self.sweep_at_ms, at_ms)

    @property
    def next_timer_ms(self) -> int | None:
        times = [t for t in (self.wake_at_ms, self.sweep_at_ms) if t is not None]
        return min(times) if times else None

    def track(self, progress: Step, job: CallJob) -> None:
        """Record a drive's side effects: calls to start and wait for, results, failures, the retry time."""
        self.start.extend(progress.start)
        if progress.state == "pending":
            self.waiting.extend(progress.start)
        if progress.state in ("waiting", "failed"):
            self.wake(job.retry_at_ms)
        if progress.error is not None:
            self.failures.append(progress.error)
        self.results.extend(progress.results)
        self.consumed.extend(progress.consumed)
        self.rejections += progress.rejections


def run_to_end(job: CallJob, context: Any, pool: Any, retry: RetryPolicy, clock: Any = None) -> Any:
    """Drive one job to its value, blocking: for callers outside Flink (tools, benchmarks, tests).

    `pool` is a CallPool; provider failures wait out their backoff and try again, like in the job.
    """
    import time

    now_ms = clock or (lambda: int(time.time() * 1000))
    while True:
        progress = drive(job, context, pool.finished(), now_ms(), retry)
        pool.forget(progress.consumed)
        if progress.state == "done":
            return progress.value
        for request in progress.start:
            pool.submit(request)
        if progress.state == "pending":
            pool.wait([r.digest for r in progress.start], timeout_s=60)
        else:
            time.sleep(max(0.0, (job.retry_at_ms - now_ms()) / 1000))
