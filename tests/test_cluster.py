"""The job on a real standalone cluster (JobManager + two TaskManagers from the apache-flink wheel),
submitted with `flink run -py`: once against `flink-memory serve-llm` (the docker-compose topology without
Docker), once with a TaskManager killed by SIGKILL mid-job."""

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from cluster import ROOT, StandaloneCluster, free_port
from jobkit import (
    PRISTINE_ENV,
    batch_units,
    check_tree,
    conversation,
    items,
    repeated_after_kill,
    slow_script,
    units_per_agent,
    wait_for,
    write_lines,
)
from scripted_server import ScriptedServer

from flink_memory.outputs import latest_globals, read_outputs
from flink_memory.records import ChunkManifest, DeadLetter, SummaryNode
from flink_memory.store.schema import NODES

pytestmark = pytest.mark.slow

JOB = ROOT / "jobs" / "memory_summarization.py"


def units_from(records, manifests):
    """Expected memory units: chunks of every manifest, and each short text item itself."""
    chunked = {(m["agent_id"], m["source_id"]) for m in manifests}
    units = Counter((m["agent_id"], f"{m['source_id']}#{c['index']}") for m in manifests for c in m["chunks"])
    for record in records:
        if isinstance(record, dict) and (record["agent_id"], record["id"]) not in chunked:
            units[(record["agent_id"], record["id"])] += 1
    return units


def start_applier(tmp_path, output, url, s3):
    """`flink-memory apply --output s3://... --store URL --follow` beside the job, with the endpoint's settings."""
    return subprocess.Popen([sys.executable, "-m", "flink_memory.cli", "apply", "--output", output, "--store", url,
                             "--follow"], stdout=subprocess.DEVNULL, stderr=(tmp_path / "apply.log").open("w"),
                            env={**PRISTINE_ENV, **s3.env})


def stored_nodes(url):
    from flink_memory.store import open_store

    with open_store(url) as store:
        return {(a, n.node_id): n for a in store.agents() for n in store.nodes(a)}


def test_submit_to_a_standalone_cluster_with_the_served_model(tmp_path, postgres_url, monkeypatch):
    """`flink run` on a cluster whose job writes its output to S3 (Flink's S3 plugin, moto's S3 server), the
    applier following it from s3:// into PostgreSQL: at the end the store equals the committed live view."""
    from pgserver import new_database
    from s3_endpoint import PLUGIN, LocalS3

    from flink_memory.store import live_view, open_store

    records = items(agents=2, per_agent=4, words=2)
    input_path = write_lines(tmp_path / "input" / "part-0.jsonl", records + ["{broken"])
    url = new_database(postgres_url)
    s3 = LocalS3(tmp_path).start()
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)  # (this process reads the output too)
    output = s3.url("served/output")
    applier = start_applier(tmp_path, output, url, s3)
    port = free_port()
    llm_log = (tmp_path / "serve-llm.log").open("w")
    llm = subprocess.Popen([sys.executable, "-m", "flink_memory.cli", "serve-llm", "--port", str(port),
                            "--context-window", "4096", "--parallel", "2"],
                           stdout=llm_log, stderr=subprocess.STDOUT, env=PRISTINE_ENV)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/v1/models"), timeout_s=120)
        with StandaloneCluster(tmp_path / "cluster", plugins=(PLUGIN,), settings=s3.flink_settings) as cluster:
            job_id = cluster.submit(JOB, "--input", str(input_path), "--output", output, "--parallelism", "2",
                                    "--set", "llm.provider=openai", "--set", f"llm.base_url=http://127.0.0.1:{port}/v1",
                                    "--set", "llm.context_window=2048", "--set", "llm.max_output_tokens=64",
                                    "--set", "batching.max_items=2", "--set", "summarization.fan_in=2",
                                    "--set", f"store.url={url}",
                                    "--set", f"journal.path={tmp_path / 'journal.sqlite'}")
            assert cluster.wait_for_job(job_id) == "FINISHED", cluster.logs()
            vertices = cluster.rest(f"/jobs/{job_id}")["vertices"]
            assert {v["parallelism"] for v in vertices if "merger" in v["name"]} == {2}
        out = read_outputs(output)
        live = live_view(out["summaries"])
        wait_for(lambda: stored_nodes(url) == live, timeout_s=60)
    finally:
        llm.terminate()
        llm.wait(timeout=30)
        llm_log.close()
        applier.terminate()
        applier.wait(30)
        s3.stop()
    assert "Traceback" not in (tmp_path / "apply.log").read_text()
    assert live and stored_nodes(url) == live
    with open_store(url) as store:  # every unit, committed, each covered by a live batch node
        for agent in ("agent-0", "agent-1"):
            covering = {n.node_id for n in store.nodes(agent) if n.kind == "batch"}
            assert {u.unit_id: c in covering for u, c in store.units(agent)} == {f"m{i}": True for i in range(4)}
    nodes = [SummaryNode.model_validate(n).model_dump(mode="json") for n in out["summaries"]]
    assert batch_units(nodes) == units_from(records, [])
    check_tree(nodes, units_per_agent(units_from(records, [])))
    assert all(n["text"].strip() and n["completion_tokens"] > 0 for n in nodes if n["kind"] != "global")
    (dead,) = [DeadLetter.model_validate(d) for d in out["dead-letters"]]
    assert dead.raw == "{broken" and dead.stage == "parse"


def _answers(url):
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def test_taskmanager_killed_mid_job_recovers_with_no_repeated_calls(tmp_path):
    records = []
    for k, item in enumerate(items(agents=4, per_agent=20)):
        if k % 20 < 2:
            records.append(conversation(item["agent_id"], f"{item['agent_id'][-1]}x{k}"))
        records.append(item)
    bad = ["not json", json.dumps({"agent_id": "agent-0", "id": "no-content"})]
    input_path = write_lines(tmp_path / "input" / "part-0.jsonl", records + bad)
    output = tmp_path / "output"
    with ScriptedServer(slow_script) as server, StandaloneCluster(tmp_path / "cluster") as cluster:
        job_id = cluster.submit(JOB, "--input", str(input_path), "--output", str(output), "--parallelism", "2",
                                "--set", "llm.provider=openai", "--set", f"llm.base_url={server.base_url}",
                                "--set", "llm.max_retries=2", "--set", "llm.retry_backoff_s=0.2",
                                "--set", "batching.max_items=5", "--set", "summarization.fan_in=3",
                                "--set", "chunking.max_chunk_tokens=400", "--set", "llm.max_concurrency=2",
                                "--set", "checkpointing.interval_s=1", "--set", "checkpointing.restart_backoff_s=0.5",
                                "--set", "job.poll_interval_ms=20",
                                "--set", f"journal.path={tmp_path / 'journal.sqlite'}")
        # Mid-job: a third of the calls made, and a TaskManager that still runs a batcher or merger subtask.
        # (A bounded input that is read at once does its remaining work in the end-of-input phase, where no
        # checkpoint completes, so the restart may start from the beginning: the journal keeps it free.)
        wait_for(lambda: server.count() >= 20, timeout_s=300)
        (victim, *_) = cluster.busy_taskmanagers(job_id, ("batch-summaries", "hierarchical-merger"))
        killed_at = time.monotonic()
        cluster.kill_taskmanager(victim)
        calls_at_kill = server.count()
        cluster.start_taskmanager()
        assert cluster.wait_for_job(job_id) == "FINISHED", cluster.logs()
        assert cluster.restarts(job_id) >= 1, "the kill did not make the job restart"
        spans = list(server.spans)
    out = read_outputs(str(output))
    nodes = [SummaryNode.model_validate(n).model_dump(mode="json") for n in out["summaries"]]
    manifests = [ChunkManifest.model_validate(m).model_dump(mode="json") for m in out["manifests"]]
    assert len(manifests) == len({(m["agent_id"], m["source_id"]) for m in manifests}) == 8
    units = units_from(records, manifests)
    assert batch_units(nodes) == units  # every unit exactly once, nothing duplicated by the replay
    check_tree(nodes, units_per_agent(units))
    assert set(latest_globals(nodes)) == {f"agent-{a}" for a in range(4)}
    assert sorted(d["raw"] for d in out["dead-letters"]) == sorted(bad)
    # A call is repeated only if its first answer never reached a live process: it was in flight at the kill.
    repeated, finished_before_kill = repeated_after_kill(spans, killed_at)
    assert finished_before_kill == 0, f"{finished_before_kill} finished calls were paid for twice"
    assert calls_at_kill < len(spans) - repeated, "the job had no work left when the TaskManager was killed"
    print(f"\n[cluster] TaskManager killed after {calls_at_kill} calls: {len(spans)} calls, {repeated} repeated "
          f"(all in flight at the kill)")




def test_taskmanager_killed_the_postgresql_store_equals_the_committed_live_view(tmp_path, postgres_url,
                                                                                monkeypatch):
    """Memory that changes (an update, a deletion, a forgotten agent) on a standalone cluster that writes the
    job's output to S3 (Flink's own S3 plugin, against moto's S3 server) with PostgreSQL as the store and
    `flink-memory apply --output s3://... --follow` beside it; a TaskManager killed with SIGKILL mid-run.
    After the restart the store equals the committed changelog's live view, with every provisional row of the
    killed attempt confirmed or gone."""
    from pgserver import new_database
    from s3_endpoint import PLUGIN, LocalS3

    from flink_memory.store import live_view, open_store

    url = new_database(postgres_url)
    s3 = LocalS3(tmp_path).start()
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)  # (this process reads the output too)
    records = items(agents=4, per_agent=15)
    records.insert(20, {"agent_id": "agent-1", "id": "fact", "text": "Zorbatin paid 4711 EUR for the boat."})
    records += [{"agent_id": "agent-1", "id": "fact", "text": "Zorbatin paid 5822 EUR for the boat, corrected."},
                {"agent_id": "agent-0", "id": "m5", "deleted": True},
                {"agent_id": "agent-2", "forget": True},
                {"agent_id": "agent-2", "id": "after", "text": "After the forget, agent two likes green tea."}]
    input_path = write_lines(tmp_path / "input" / "part-0.jsonl", records)
    output = s3.url("job/output")
    applier = start_applier(tmp_path, output, url, s3)
    try:
        with ScriptedServer(slow_script) as server, \
                StandaloneCluster(tmp_path / "cluster", plugins=(PLUGIN,), settings=s3.flink_settings) as cluster:
            job_id = cluster.submit(JOB, "--input", str(input_path), "--output", output, "--parallelism", "2",
                                    "--set", "llm.provider=openai", "--set", f"llm.base_url={server.base_url}",
                                    "--set", "llm.max_retries=2", "--set", "llm.retry_backoff_s=0.2",
                                    "--set", "batching.max_items=4", "--set", "summarization.fan_in=2",
                                    "--set", "llm.max_concurrency=2", "--set", "checkpointing.interval_s=1",
                                    "--set", "checkpointing.restart_backoff_s=0.5", "--set", "job.poll_interval_ms=20",
                                    "--set", f"store.url={url}",
                                    "--set", f"journal.path={tmp_path / 'journal.sqlite'}")
            wait_for(lambda: server.count() >= 8, timeout_s=300)
            (victim, *_) = cluster.busy_taskmanagers(job_id, ("batch-summaries", "hierarchical-merger"))
            cluster.kill_taskmanager(victim)
            cluster.start_taskmanager()
            assert cluster.wait_for_job(job_id) == "FINISHED", cluster.logs()
            assert cluster.restarts(job_id) >= 1, "the kill did not make the job restart"
        live = live_view(read_outputs(output)["summaries"])
        wait_for(lambda: stored_nodes(url) == live, timeout_s=60)
    finally:
        applier.terminate()
        applier.wait(30)
        s3.stop()
    assert "Traceback" not in (tmp_path / "apply.log").read_text()
    with open_store(url) as store:
        assert {(a, n.node_id): n for a in store.agents() for n in store.nodes(a)} == live
        expected = {a: {f"m{i}" for i in range(15)} for a in ("agent-0", "agent-1", "agent-3")}
        expected["agent-0"].discard("m5")
        expected["agent-1"].add("fact")
        expected["agent-2"] = {"after"}
        for agent, unit_ids in expected.items():
            units = store.units(agent)
            assert {u.unit_id for u, _ in units} == unit_ids
            covering = {n.node_id for n in store.nodes(agent) if n.kind == "batch"}
            assert all(c in covering for _, c in units)  # committed rows, each covered by a live batch node
        assert not store.recall("agent-1", "4711", mode="keyword")
        assert "5822" in store.recall("agent-1", "What did Zorbatin pay for the boat?", k=1)[0].text
        rows = store.connection.fetch(f"SELECT kind, count(*) FROM {NODES} WHERE pending_seq IS NOT NULL "
                                      "GROUP BY kind", ())
        assert rows == []  # every provisional row and hidden unit of either attempt was confirmed or removed
        assert store.connection.fetch("SELECT count(*) FROM flink_memory_pending_deletes", ()) == [(0,)]
