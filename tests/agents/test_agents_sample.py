"""`make agents-sample` and jobs/agents_memory.py run and exit, twice in a row (slow: each starts a JVM).

The sample (samples/agents_memory.py, the bundled SmolLM2 for the summaries) prints what docs/flink-agents.md
shows, then ends its job, the JVM and the model's server, and exits 0 (it used to wait for ever in the model
server's destructor, which joined the connections the cancelled job's workers kept open). The job's entry point
runs until SIGTERM, then cancels its job and exits 0."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobkit import wait_for, write_lines
from scripted_server import Reply, ScriptedServer, fact_keeping_summary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180  # docs/flink-agents.md: 26 s on 2 cores; the bound leaves room for a busy CI runner


def doc_output() -> list[str]:
    """The sample's output as docs/flink-agents.md shows it (the block after "stops the job")."""
    doc = (ROOT / "docs" / "flink-agents.md").read_text()
    block = doc.split("stops the job (`make agents-sample`", 1)[1].split("```", 2)[1]
    return block.strip("\n").splitlines()


def batches_anonymous(lines: list[str]) -> list[str]:
    """Which batch a unit landed in follows the timing of the flushes; the rest is deterministic."""
    return [re.sub(r"batch-\d{6}", "batch-N", line) for line in lines]


@pytest.mark.parametrize("run", [1, 2])
def test_the_sample_prints_the_doc_output_and_exits(tmp_path, run):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "samples/agents_memory.py", "--output", str(tmp_path / "sample"),
                           "--timeout", str(TIMEOUT_S)], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    took = time.monotonic() - started
    print(f"sample run {run}: exit {done.returncode} in {took:.1f} s; {done.stderr.splitlines()[-1:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert batches_anonymous(done.stdout.strip("\n").splitlines()) == batches_anonymous(doc_output())
    assert "stopped the job, its JVM" in done.stderr


@pytest.mark.parametrize("run", [1, 2])
def test_the_job_entry_point_runs_until_sigterm_then_exits(tmp_path, run):
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    turns = [{"agent_id": "ana", "id": "t1", "text": "I am allergic to peanuts and to shellfish."},
             {"agent_id": "ana", "id": "t2", "text": "Hi!"}]
    write_lines(inbox / ".part-0.jsonl", turns).rename(inbox / "part-0.jsonl")
    with ScriptedServer(lambda body: Reply(text=fact_keeping_summary(body))) as server:
        job = subprocess.Popen(
            [sys.executable, "jobs/agents_memory.py", "--input", str(inbox), "--output", str(output),
             "--set", "llm.provider=openai", "--set", f"llm.base_url={server.base_url}", "--set",
             "journal.path=null", "--set", "checkpointing.interval_s=1", "--set", "batching.flush_after_s=1",
             "--set", "job.parallelism=1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            started = time.monotonic()
            summaries = output / "summaries"
            wait_for(lambda: any(p.stat().st_size for p in summaries.rglob("*") if p.is_file()
                                 and not p.name.startswith(".")) if summaries.exists() else False,
                     timeout_s=TIMEOUT_S)
            job.send_signal(signal.SIGTERM)
            _, stderr = job.communicate(timeout=60)
            took = time.monotonic() - started
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
    print(f"job run {run}: exit {job.returncode} {took:.1f} s after its first summary")
    assert job.returncode == 0, stderr[-3000:]
    assert "cancelling the job" in stderr
    outcomes = [json.loads(line) for p in (output / "agent-outcomes").rglob("*.jsonl") if not p.name.startswith(".")
                for line in p.read_text().splitlines()]
    assert [(o["turn"], o["decision"]) for o in outcomes] == [("t1", "remember")]
