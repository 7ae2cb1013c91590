"""The streaming job on a local MiniCluster, against the scripted OpenAI-compatible server."""

import json
import math
from collections import Counter

import pytest
from jobkit import batch_units, check_tree, expected_units, items, run, wait_for
from scripted_server import Reply, ScriptedServer, default_script

from flink_memory.outputs import latest_globals
from flink_memory.records import DeadLetter, SummaryNode
from flink_memory.tokens.estimate import estimate_messages

pytestmark = pytest.mark.slow


def per_agent(records):
    return Counter(r["agent_id"] for r in records if isinstance(r, dict) and "text" in r)


@pytest.mark.parametrize(("parallelism", "mode"), [(1, "process"), (2, "process"), (2, "thread")])
def test_coverage_tree_and_dead_letters(tmp_path, parallelism, mode):
    records = items(agents=3, per_agent=23)
    bad = ["not json", json.dumps({"agent_id": "agent-0", "id": "x"}), json.dumps({"agent_id": "", "text": "x"})]
    with ScriptedServer() as server:
        out = run(tmp_path, records + bad, server.base_url, "batching.max_items=5", "summarization.fan_in=3",
                  f"job.parallelism={parallelism}", f"job.execution_mode={mode}")
        calls = server.count()
    summaries = [SummaryNode.model_validate(n).model_dump(mode="json") for n in out["summaries"]]
    assert batch_units(summaries) == expected_units(records)  # every unit in exactly one batch node
    assert all(len(n["children"]) <= 5 for n in summaries if n["kind"] == "batch")
    assert sorted(n["item_count"] for n in summaries if n["kind"] == "batch").count(3) == 3  # partial tails
    check_tree(summaries, per_agent(records))
    dead = [DeadLetter.model_validate(d) for d in out["dead-letters"]]
    assert sorted(d.raw for d in dead) == sorted(bad)
    assert calls == len(summaries) - sum(1 for n in summaries if n["kind"] == "global" and len(n["children"]) == 1)


def test_merge_calls_follow_the_tree_formula(tmp_path):
    n_items, max_items, fan_in = 96, 2, 4
    records = items(agents=1, per_agent=n_items)
    with ScriptedServer() as server:
        out = run(tmp_path, records, server.base_url, f"batching.max_items={max_items}",
                  f"summarization.fan_in={fan_in}", "summarization.global_refresh_s=3600")
    nodes = out["summaries"]
    batches = sum(1 for n in nodes if n["kind"] == "batch")
    merges = sum(1 for n in nodes if n["kind"] == "merge")
    assert batches == n_items // max_items
    assert batches // fan_in <= merges <= math.ceil(batches / (fan_in - 1))
    levels = max(n["level"] for n in nodes if n["kind"] == "merge")
    assert levels <= math.ceil(math.log(batches, fan_in)) + 1
    check_tree(nodes, per_agent(records))


def test_retention_and_single_depth(tmp_path):
    records = items(agents=2, per_agent=12)
    with ScriptedServer() as server:
        glob_only = run(tmp_path, records, server.base_url, "batching.max_items=2", "summarization.fan_in=2",
                        "summarization.retention=global_only", name="global-only")
        single = run(tmp_path, records, server.base_url, "batching.max_items=2", "summarization.depth=single",
                     name="single")
        batch_global = run(tmp_path, records, server.base_url, "batching.max_items=2", "summarization.fan_in=2",
                           "summarization.retention=batch_and_global", name="batch-global")
    assert {n["kind"] for n in glob_only["summaries"]} == {"global"}
    assert {n["agent_id"]: n["item_count"] for n in latest_globals(glob_only["summaries"]).values()} == {
        "agent-0": 12, "agent-1": 12}
    assert {n["kind"] for n in single["summaries"]} == {"batch", "global"}  # no merges, still a current memory
    assert batch_units(single["summaries"]) == expected_units(records)
    for node in latest_globals(single["summaries"]).values():
        assert node["item_count"] == 12 and all(c.startswith("batch-") for c in node["children"])
    assert {n["kind"] for n in batch_global["summaries"]} == {"batch", "global"}


def test_small_context_window_huge_item_and_pile_of_summaries(tmp_path):
    window = 1536
    huge = {"agent_id": "big", "id": "huge", "text": " ".join(f"token{i}" for i in range(5000))}
    records = items(agents=1, per_agent=60, words=40) + [huge]
    verbose = lambda body: Reply(text="Summary: " + "detail " * (body["max_tokens"] // 2))  # noqa: E731
    with ScriptedServer(verbose) as server:
        out = run(tmp_path, records, server.base_url, f"llm.context_window={window}", "llm.max_output_tokens=96",
                  "chunking.max_chunk_tokens=256", "summarization.fan_in=8")
        for body in server.requests:
            assert estimate_messages(body["messages"]) + body["max_tokens"] <= window
        assert len(server.requests) > 20
    (manifest,) = out["manifests"]
    assert manifest["method"] == "fixed" and len(manifest["chunks"]) > 1
    big_units = Counter(u for a, u in batch_units(out["summaries"]).elements() if a == "big")
    assert big_units == Counter(f"huge#{k}" for k in range(len(manifest["chunks"])))
    others = Counter(k for k in batch_units(out["summaries"]).elements() if k[0] != "big")
    assert others == expected_units(records[:-1])
    check_tree(out["summaries"])


def test_provider_faults_lose_nothing_and_never_become_summaries(tmp_path):
    state = {"n": 0}

    def faulty(body):
        state["n"] += 1
        n = state["n"]
        if n % 7 in (1, 2, 3):
            return Reply(status=429, headers={"retry-after-ms": "5"})
        if n % 11 == 0:
            return Reply(status=500)
        if n % 13 == 0:
            return Reply(fault="hang")
        return default_script(body)

    records = items(agents=3, per_agent=10)
    with ScriptedServer(faulty) as server:
        out = run(tmp_path, records, server.base_url, "batching.max_items=3", "summarization.fan_in=2",
                  "llm.timeout_s=1", "llm.max_retries=1")
    assert batch_units(out["summaries"]) == expected_units(records)
    assert all(n["text"].startswith("Summary:") for n in out["summaries"])
    check_tree(out["summaries"], per_agent(records))


def test_follow_a_directory_flushes_partial_batches_by_timeout(tmp_path):
    """Unbounded input: new files are picked up, partial batches close after flush_after_s, globals refresh."""
    from jobkit import config_for, write_lines

    from flink_memory.flink.pipeline import build_job
    from flink_memory.outputs import read_outputs

    inbox, output = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    first = items(agents=2, per_agent=3)
    second = [dict(r, id=r["id"] + "-late") for r in items(agents=2, per_agent=2)]

    def publish(name, records):  # hidden while written, then renamed: the source never reads half a file
        write_lines(inbox / f".{name}", records).rename(inbox / name)

    def covered(records):
        out = read_outputs(str(output))
        done = batch_units(out["summaries"]) == expected_units(records)
        globals_ = latest_globals(out["summaries"])
        return done and all(g["item_count"] == per_agent(records)[a] for a, g in globals_.items()) and out

    publish("part-0.jsonl", first)
    with ScriptedServer() as server:
        config = config_for(server.base_url, "batching.max_items=50", "batching.flush_after_s=1",
                            "summarization.global_refresh_s=1")
        client = build_job(config, str(inbox), str(output), follow=True).execute_async("follow")
        try:
            wait_for(lambda: covered(first))
            publish("part-1.jsonl", second)
            out = wait_for(lambda: covered(first + second))
        finally:
            client.cancel().result()
    assert all(n["item_count"] in (2, 3) for n in out["summaries"] if n["kind"] == "batch")  # closed by timeout
    check_tree(out["summaries"], per_agent(first + second))
