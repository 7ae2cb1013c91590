"""Same input, same requests (invariant 11): a rerun from scratch on one journal pays no call, whatever the
provider's latency (issue 45).

The pipeline runs in memory (flink_memory.local) with the worker's own client (`acquire_runtime`: journal and
calibration as a TaskManager has them) against a real HTTP stand-in that counts characters / 4
and has no /tokenize, so the estimate and calibration pack the batches. Latency is counted in activations: a
call is answered `lag` deliveries after it starts, so the first report of a kind arrives early or late.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from scripted_server import ScriptedServer, chars_per_token
from stagekit import cfg

from flink_memory.llm.runtime import acquire_runtime, release_runtime
from flink_memory.local import LocalPipeline

WORDS = ["invoice", "refund", "meeting", "budget", "contract", "outage", "review", "vendor", "Lisbon", "Orion"]


def records(agents: int = 3, per_agent: int = 100, seed: int = 7) -> list[dict]:
    """Items of one to three sentences with names, numbers and dates, interleaved across agents."""
    rng = random.Random(seed)
    out = []
    for i in range(per_agent):
        for a in range(agents):
            day = 1 + i * 28 // per_agent
            text = " ".join(f"Agent{a} noted the {rng.choice(WORDS)} of {rng.randint(10, 9999)} EUR on "
                            f"2026-03-{day:02d}, ref {rng.randint(100000, 999999)}." for _ in range(rng.randint(1, 3)))
            out.append({"agent_id": f"agent-{a}", "id": f"m{i}", "ts": f"2026-03-{day:02d}T09:00:00Z", "text": text})
    return out


class Lagging(LocalPipeline):
    """A LocalPipeline whose calls are answered `lag` deliveries after they start (0: at once)."""

    def __init__(self, *args, lag: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lag, self.deliveries, self.pending = lag, 0, {}
        for runner in self._runners:
            runner.start = self._start

    def _start(self, requests) -> None:
        for request in requests:
            if request.digest not in self.finished and request.digest not in self.pending:
                self.pending[request.digest] = (self.deliveries + self.lag, request)

    def _deliver(self, index, key, message=None):
        self.deliveries += 1
        for digest, (due, request) in list(self.pending.items()):
            if due <= self.deliveries:
                del self.pending[digest]
                self.sent.append(request)
                try:
                    self.finished[digest] = self.answer(request)
                except Exception as exc:  # noqa: BLE001 - held as the call's error, as the pool would
                    self.finished[digest] = exc
        return super()._deliver(index, key, message)


def run(journal: str, out: Path, lag: int, data: list[dict], server: ScriptedServer) -> dict:
    config = cfg("llm.provider=openai", f"llm.base_url={server.base_url}", "llm.context_window=2048",
                 "llm.max_output_tokens=256", "batching.max_items=50", f"journal.path={journal}", "llm.max_retries=0")
    runtime = acquire_runtime(config, str(out))
    try:
        pipeline = Lagging(config, runtime.client.complete, factory=runtime.factory, lag=lag)
        pipeline.feed(*data).end()
    finally:
        release_runtime(config, str(out), "test")
    units = Counter(u for n in pipeline.nodes("batch") for u in n["children"])
    assert set(units) == {r["id"] for r in data} and len(units) == len(data) // 3  # (3 agents, same ids)
    assert sum(units.values()) == len(data)  # every unit in exactly one batch node
    return {"batches": sorted((n["agent_id"], tuple(n["children"])) for n in pipeline.nodes("batch")),
            "sent": len(pipeline.sent)}


def rerun_pays_nothing(journal: str, tmp_path: Path) -> None:
    data = records()
    with ScriptedServer(count=chars_per_token(4), context_window=2048) as server:
        first = run(journal, tmp_path / "first", 0, data, server)
        paid = server.count()
        second = run(journal, tmp_path / "second", 600, data, server)  # the reports come several activations late
        again = server.count() - paid
        third = run(journal, tmp_path / "third", 60, data, server)
        assert not server.rejected
    assert paid == first["sent"] > 0
    assert again == 0, f"the rerun paid {again} of its {second['sent']} calls again"
    assert server.count() == paid
    assert second["batches"] == first["batches"] == third["batches"]


def test_a_rerun_on_a_sqlite_journal_with_another_latency_pays_no_call(tmp_path):
    rerun_pays_nothing(str(tmp_path / "journal.sqlite"), tmp_path)


def test_the_same_input_packs_the_same_batches_whatever_the_latency(tmp_path):
    """Without a journal: each run starts from nothing, and still cuts the same batches."""
    data = records(seed=11)
    with ScriptedServer(count=chars_per_token(4), context_window=2048) as server:
        runs = [run("null", tmp_path / f"run-{lag}", lag, data, server) for lag in (0, 60, 600)]
    assert runs[0]["batches"] == runs[1]["batches"] == runs[2]["batches"]
    assert runs[0]["sent"] == runs[1]["sent"] == runs[2]["sent"]


@pytest.mark.slow
def test_a_rerun_on_a_postgres_journal_with_another_latency_pays_no_call(tmp_path, postgres_url):
    from pgserver import new_database

    rerun_pays_nothing(new_database(postgres_url), tmp_path)


@pytest.mark.slow
def test_a_rerun_on_two_subtasks_with_another_latency_pays_no_call(tmp_path):
    """The MiniCluster in thread mode, two subtasks, one SQLite journal: the second run's answers come late and
    in another order, and it pays nothing."""
    from jobkit import run as run_job
    from scripted_server import Reply, fact_keeping_summary

    count = chars_per_token(4)
    delays, latest = random.Random(3), {"s": 0.0}

    def late(body):
        return Reply(text=fact_keeping_summary(body, count), delay_s=delays.uniform(0, latest["s"]))

    data = records(agents=3, per_agent=80, seed=5)
    settings = ("llm.context_window=2048", "llm.max_output_tokens=256", "batching.max_items=50",
                "job.parallelism=2", "llm.max_concurrency=4")
    journal = tmp_path / "journal.sqlite"
    with ScriptedServer(late, count=count, context_window=2048) as server:
        first = run_job(tmp_path, data, server.base_url, *settings, journal=journal, name="first")
        paid = server.count()
        latest["s"] = 0.4  # the same endpoint, answering late and in another order
        second = run_job(tmp_path, data, server.base_url, *settings, journal=journal, name="second")
        assert paid > 0 and not server.rejected
        assert server.count() == paid, f"the rerun paid {server.count() - paid} calls again"
    assert sorted(n["children"] for n in second["summaries"] if n["kind"] == "batch") == sorted(
        n["children"] for n in first["summaries"] if n["kind"] == "batch")
