"""Building the LLM client inside a worker, and leaving its usage counters where the CLI finds them."""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from flink_memory.config import Config
from flink_memory.llm.chat_client import LLMClient
from flink_memory.llm.pool import CallPool
from flink_memory.llm.tokenizers import open_tokenizer
from flink_memory.requests import RequestFactory
from flink_memory.tokens.calibration import make_calibration
from flink_memory.tokens.counter import TokenCounter


def resolve_base_url(config: Config) -> str:
    """The configured endpoint, or the process's embedded server (started on first use)."""
    if config.llm.base_url:
        return config.llm.base_url
    if config.llm.provider != "embedded":
        raise ValueError("llm.base_url is required when llm.provider is openai")
    from flink_memory.llm.llamacpp import shared_server

    server = shared_server(config.llm.embedded_model_path, config.llm.context_window, config.llm.embedded_threads,
                           config.llm.embedded_parallel)
    return server.base_url


def make_client(config: Config, output_dir: str | None = None) -> LLMClient:
    journal = None
    if config.journal.path:
        from flink_memory.llm.journal import open_journal

        journal = open_journal(config.journal.path, max_entries=config.journal.max_entries,
                               max_age_days=config.journal.max_age_days)
    base_url = resolve_base_url(config)
    tokenizer = open_tokenizer(config.llm.tokenizer, base_url, config.llm.provider, config.llm.model)
    counter = TokenCounter(tokenizer, make_calibration(tokenizer))
    return LLMClient(config.llm, base_url, journal=journal, counter=counter)


def write_stats(output_dir: str | None, stage: str, subtask: int, attempt: int, stats: dict[str, float]) -> None:
    """One small JSON per operator attempt under <output>/_stats; the run report adds them up."""
    if not output_dir or output_dir.startswith(("s3:", "hdfs:", "gs:")):
        return
    folder = Path(output_dir.removeprefix("file://")) / "_stats"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stage}-{subtask}-{attempt}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stage": stage, "subtask": subtask, "attempt": attempt, **stats}))
    tmp.replace(target)


def read_stats(output_dir: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    folder = Path(output_dir) / "_stats"
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        data = json.loads(path.read_text())
        for key, value in data.items():
            if key in ("stage", "subtask", "attempt") or not isinstance(value, (int, float)):
                continue
            # counters add up; a max_* figure (e.g. the largest prompt) is the largest of all attempts
            totals[key] = max(totals.get(key, 0), value) if key.startswith("max_") else totals.get(key, 0) + value
    return totals


@dataclass
class Runtime:
    """One client, call pool and request factory per worker process, shared by every stage in it.

    In thread mode all operators of a TaskManager run in one interpreter, so `llm.max_concurrency` is the
    number of calls in flight per TaskManager; in process mode, per Python worker. Operators take a
    reference in open() and release it in close(); the last release drains and closes.
    """

    client: LLMClient
    pool: CallPool
    factory: RequestFactory
    journal_on: bool
    users: int = 0


_RUNTIMES: dict[tuple[str, str | None], Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()


def acquire_runtime(config: Config, output_dir: str | None) -> Runtime:
    key = (config.model_dump_json(), output_dir)
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            client = make_client(config, output_dir)
            pool = CallPool(client.complete, config.llm.max_concurrency, min_poll_ms=config.job.poll_interval_ms)
            runtime = Runtime(client, pool, RequestFactory.from_config(config.llm, client.counter),
                              journal_on=client.journal is not None)
            _RUNTIMES[key] = runtime
        runtime.users += 1
        return runtime


def release_runtime(config: Config, output_dir: str | None, stage: str) -> None:
    key = (config.model_dump_json(), output_dir)
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            return
        runtime.users -= 1
        if runtime.users > 0:
            return
        del _RUNTIMES[key]
    runtime.pool.close(config.journal.drain_on_close_s if runtime.journal_on else 0.0)
    write_stats(output_dir, stage, 0, 0, runtime.client.stats.snapshot())
    runtime.client.close()
