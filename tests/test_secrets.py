"""Secrets stay secret on a cluster: the job submitted with `flink run -py` to a standalone cluster set up as
docs/deployment.md documents (the API key in a file named by `llm.api_key_file`, conf/log4j-cluster.properties
appended to Flink's log configuration). Two variables planted in every Flink process's environment stand for
what a deployment leaves there: a database password (Flink masks PGPASSWORD in the client's dump but not in
the TaskManagers') and a stale OPENAI_API_KEY (masked nowhere; the file must win over it). No secret may
appear in any file the run leaves: Flink's logs and temporary folders, the outputs, the retained
checkpoints, the journal; nor in what `flink run` printed or the REST API serves. The provider must have
seen the key from the file, so the search cannot pass by the key never having been read. One cluster runs
the job in both execution modes."""

import secrets
from pathlib import Path

import pytest
from cluster import ROOT, StandaloneCluster
from jobkit import covered, expected_units, items, wait_for, write_lines
from scripted_server import ScriptedServer

from flink_memory.outputs import read_outputs

pytestmark = pytest.mark.slow

JOB = ROOT / "jobs" / "memory_summarization.py"


def files_holding(root: Path, needle: str, skip: Path) -> list[Path]:
    data = needle.encode()
    return [p for p in sorted(root.rglob("*")) if p.is_file() and p != skip and data in p.read_bytes()]


def test_no_secret_reaches_logs_outputs_checkpoints_or_journal(tmp_path):
    key = f"sk-flinkmemory-LEAKCHECK-{secrets.token_hex(8)}"
    planted = {"PGPASSWORD": f"pg-flinkmemory-LEAKCHECK-{secrets.token_hex(8)}",
               "OPENAI_API_KEY": f"sk-flinkmemory-LEAKCHECK-stale-{secrets.token_hex(8)}"}
    key_file = tmp_path / "secrets" / "llm_api_key"
    key_file.parent.mkdir()
    key_file.write_text(key + "\n")  # as `echo KEY > file` writes it
    records = items(agents=2, per_agent=4, words=2)
    input_dir = write_lines(tmp_path / "input" / "part-0.jsonl", records).parent
    cluster = StandaloneCluster(tmp_path / "cluster")
    cluster.env.update(planted)  # the JobManager, the TaskManagers, their Python workers, the client
    jobs, served = {}, {}
    with ScriptedServer() as server, cluster:
        # One job per execution mode, one after the other: each prints environments in other places (process
        # mode: a Python worker process per operator). Thread mode last: cancelling it has crashed a
        # TaskManager here (a Python gauge read by a metrics query after its interpreter closed), which must
        # not starve the next job. --follow: an unbounded job keeps its checkpoints when cancelled, so they
        # can be searched too.
        for mode in ("process", "thread"):
            output, journal = tmp_path / f"output-{mode}", tmp_path / f"journal-{mode}" / "journal.sqlite"
            calls_before = server.count()
            job_id = cluster.submit(JOB, "--input", str(input_dir), "--output", str(output), "--follow",
                                    "--parallelism", "2", "--set", f"job.execution_mode={mode}",
                                    "--set", "llm.provider=openai", "--set", f"llm.base_url={server.base_url}",
                                    "--set", f"llm.api_key_file={key_file}",
                                    "--set", "batching.max_items=2", "--set", "summarization.fan_in=2",
                                    "--set", "summarization.global_refresh_s=1",
                                    "--set", "checkpointing.interval_s=1", "--set", f"journal.path={journal}")
            wait_for(lambda output=output: covered(output, expected_units(records)), timeout_s=300, every_s=1)
            assert server.count() > calls_before, f"the {mode} job made no call"  # its own journal: all fresh
            served |= {path: str(cluster.rest(path)) for path in (
                "/jobmanager/config", "/jobmanager/environment", f"/jobs/{job_id}/config", "/taskmanagers",
                *(f"/taskmanagers/{tm['id']}" for tm in cluster.rest("/taskmanagers")["taskmanagers"]))}
            cluster.cancel(job_id)
            assert cluster.wait_for_job(job_id) == "CANCELED"
            jobs[job_id] = (output, journal)
    assert set(server.authorizations) == {f"Bearer {key}"}  # the file's key, not the variable's

    # the search reaches every kind of file, and sees what those files hold
    logs = {p.name: p.read_text(errors="replace") for p in cluster.log_dir.glob("*.log")}
    for job_id, (output, journal) in jobs.items():
        seen = [name for name in logs if job_id in logs[name]]
        assert len(seen) == 4, f"job {job_id} is in {seen}: not in its client, JobManager and 2 TaskManager logs"
        assert list(output.glob("_checkpoints/*/chk-*/_metadata")), "no retained checkpoint to search"
        # the top merge node is still in the merger's state: a text every kind of file holds
        merges = [n for n in read_outputs(str(output))["summaries"] if n["kind"] == "merge"]
        text = max(merges, key=lambda n: n["level"])["text"]
        for kind, root in (("checkpoint", output / "_checkpoints"), ("journal", journal.parent),
                           ("output", output / "summaries")):
            assert files_holding(root, text, key_file), f"the {kind} files do not hold the top merge's text"

    leaks = {}
    for name, secret in (("API key", key), *planted.items()):
        found = [str(p.relative_to(tmp_path)) for p in files_holding(tmp_path, secret, key_file)]
        found += [f"`flink run` output {i}" for i, text in enumerate(cluster.client_output) if secret in text]
        found += [f"REST {path}" for path, text in served.items() if secret in text]
        if found:
            leaks[name] = found
    assert not leaks, f"secrets leaked: {leaks}"
