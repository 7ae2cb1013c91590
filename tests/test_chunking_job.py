"""Semantic chunk planning inside the job: attacks on the planner, failure policies, replays."""

import json
import re

import pytest
from jobkit import batch_units, conversation, run, topic_planner
from scripted_server import Reply, ScriptedServer, default_script

pytestmark = pytest.mark.slow

ATTACKS = {
    "out_of_range": lambda last: [3, last + 5],
    "duplicate": lambda last: [3, 3, last],
    "unsorted": lambda last: [6, 2, last],
    "negative": lambda last: [-1, last],
    "float": lambda last: [2.0, last],
    "string": lambda last: ["2", last],
    "missing_final": lambda last: [2, 5],
    "prose": None,
    "empty": lambda last: [],
    "huge": lambda last: list(range(10 * (last + 1))),
    "obeys_injection": lambda last: [0],
}


def planner_script(body):
    if "response_format" not in body:
        return default_script(body)
    text = body["messages"][1]["content"]
    last = int(re.search(r"to (\d+):", text).group(1))
    name = re.search(r"\[([a-z_]+)\] turn", text).group(1)
    if name == "prose":
        return Reply(text='Sure! Here is the plan: {"ends": [' + str(last) + "]} Hope it helps.")
    if name in ATTACKS:
        return Reply(text=json.dumps({"ends": ATTACKS[name](last)}))
    return topic_planner(body)


def planner_requests(server):
    return [b for b in server.requests if "response_format" in b]


def test_attacks_fall_back_and_the_manifest_says_why(tmp_path):
    records = [conversation(f"agent-{name}", name, injection=name == "obeys_injection") for name in ATTACKS]
    records.append(conversation("agent-good", "good"))
    with ScriptedServer(planner_script) as server:
        out = run(tmp_path, records, server.base_url, "chunking.max_chunk_tokens=400")
    manifests = {m["source_id"]: m for m in out["manifests"]}
    assert set(manifests) == {r["id"] for r in records}
    assert manifests["conv-good"]["method"] == "semantic"
    assert manifests["conv-good"]["planner_calls"] >= 1
    for name in ATTACKS:
        manifest = manifests[f"conv-{name}"]
        assert manifest["method"] == "fallback", name
        assert manifest["reason"].startswith("invalid planner output"), name
    # every exchange still reaches a batch, via whole chunks
    units = batch_units(out["summaries"])
    for manifest in manifests.values():
        for chunk in manifest["chunks"]:
            assert units[(manifest["agent_id"], f"{manifest['source_id']}#{chunk['index']}")] == 1


def test_raise_policy_sends_the_record_to_dead_letters(tmp_path):
    records = [conversation("agent-a", "unsorted"), conversation("agent-b", "good")]
    with ScriptedServer(planner_script) as server:
        out = run(tmp_path, records, server.base_url, "chunking.max_chunk_tokens=400",
                  "chunking.on_planner_failure=raise")
    (dead,) = out["dead-letters"]
    assert dead["stage"] == "plan" and "not strictly increasing" in dead["reason"]
    assert json.loads(dead["raw"])["id"] == "conv-unsorted"
    assert [m["source_id"] for m in out["manifests"]] == ["conv-good"]


def test_provider_errors_follow_the_failure_policy(tmp_path):
    def failing(body):
        return Reply(status=500) if "response_format" in body else default_script(body)

    with ScriptedServer(failing) as server:
        out = run(tmp_path, [conversation("agent-a", "good")], server.base_url, "chunking.max_chunk_tokens=400",
                  "llm.max_retries=0")
    (manifest,) = out["manifests"]
    assert manifest["method"] == "fallback" and "planner call failed" in manifest["reason"]


def test_no_planner_call_for_short_trusted_and_text(tmp_path):
    records = [
        {"agent_id": "a", "id": "short", "messages": [{"role": "user", "content": "hi"}]},
        {"agent_id": "a", "id": "trusted", "trusted": True, "chunks": [[{"role": "user", "content": "x " * 900}]]},
        {"agent_id": "a", "id": "text", "text": "long text " * 900},
    ]
    with ScriptedServer(planner_script) as server:
        out = run(tmp_path, records, server.base_url, "chunking.max_chunk_tokens=400")
        assert planner_requests(server) == []
    methods = {m["source_id"]: m["method"] for m in out["manifests"]}
    assert methods == {"short": "passthrough", "trusted": "trusted", "text": "fixed"}


def test_replays_reuse_plans_and_changes_replan(tmp_path):
    original = conversation("agent-a", "good")
    changed = json.loads(json.dumps(original))
    changed["messages"][3]["content"] += " (edited)"
    copy_with_new_id = dict(original, id="conv-good-retry")
    records = [original, original, copy_with_new_id, changed]
    with ScriptedServer(planner_script) as server:
        out = run(tmp_path, records, server.base_url, "chunking.max_chunk_tokens=400")
        calls = len(planner_requests(server))
    dead = out["dead-letters"]
    assert [d["stage"] for d in dead] == ["duplicate"]
    manifests = out["manifests"]
    assert [m["source_id"] for m in manifests] == ["conv-good", "conv-good-retry", "conv-good"]
    assert manifests[1]["boundaries"] == manifests[0]["boundaries"]  # reused, not re-planned
    assert manifests[1]["planner_calls"] == 0
    assert manifests[2]["input_digest"] != manifests[0]["input_digest"]
    first_plan_calls = manifests[0]["planner_calls"]
    assert calls == first_plan_calls + manifests[2]["planner_calls"]


def test_plans_in_restored_state_are_reused_and_tampered_ones_fail_closed(tmp_path):
    """A job following a directory plans two conversations and is killed after a checkpoint. In the
    checkpoint one stored plan is altered. The restored job gets a retry of each (same exchanges, new id),
    with no journal: the intact plan is reused without a planner call, the altered one is refused."""
    from jobkit import cli_command, kill_group, latest_checkpoint, spawn, wait_for, write_lines

    intact, altered = conversation("agent-a", "intact"), conversation("agent-a", "altered")
    input_dir = write_lines(tmp_path / "input" / "part-0.jsonl", [intact, altered]).parent
    output = tmp_path / "output"
    settings = ("chunking.max_chunk_tokens=400", "checkpointing.interval_s=1", "batching.flush_after_s=600")
    with ScriptedServer(planner_script) as server:
        first = spawn(cli_command(input_dir, output, server, None, *settings, args=("--follow",)))
        try:
            # both plans made, then a checkpoint that holds them
            wait_for(lambda: len(planner_requests(server)) >= 2 and latest_checkpoint(output), timeout_s=240)
            planned_at = latest_checkpoint(output)
            wait_for(lambda: latest_checkpoint(output) != planned_at, timeout_s=60)
        finally:
            kill_group(first)
        checkpoint = latest_checkpoint(output)
        assert tamper_first_boundary(checkpoint, "conv-altered"), "the stored plan was not found in the checkpoint"
        planner_calls = len(planner_requests(server))
        write_lines(input_dir / "part-1.jsonl", [dict(intact, id="intact-retry"), dict(altered, id="altered-retry")])
        second = spawn(cli_command(input_dir, output, server, None, *settings,
                                   args=("--follow", "--restore", str(checkpoint))))
        try:
            out = wait_for(lambda: _both_retries(output), timeout_s=240)
        finally:
            kill_group(second)
        assert len(planner_requests(server)) == planner_calls  # nothing planned again
    retry = next(m for m in out["manifests"] if m["source_id"] == "intact-retry")
    original = next(m for m in out["manifests"] if m["source_id"] == "conv-intact")
    assert retry["planner_calls"] == 0 and retry["boundaries"] == original["boundaries"]
    (dead,) = [d for d in out["dead-letters"] if d["record_id"] == "altered-retry"]
    assert dead["stage"] == "plan" and "failed verification" in dead["reason"]
    assert not any(m["source_id"] == "altered-retry" for m in out["manifests"])


def tamper_first_boundary(checkpoint, source_id):
    """Change one digit of the stored plan of `source_id` (canonical JSON: boundaries precede source_id; the
    manifest is a JSON string inside the plan's state entry, so its quotes are escaped)."""
    needle = f'\\"source_id\\":\\"{source_id}\\"'.encode()
    boundaries = b'\\"boundaries\\":['
    for path in checkpoint.rglob("*"):
        if not path.is_file():
            continue
        data = bytearray(path.read_bytes())
        at = data.find(needle)
        while at >= 0:
            start = data.rfind(boundaries, 0, at)
            digit = start + len(boundaries)
            if start >= 0 and chr(data[digit]).isdigit():
                data[digit] = ord("1") if data[digit] != ord("1") else ord("2")
                path.write_bytes(bytes(data))
                return True
            at = data.find(needle, at + 1)
    return False


def _both_retries(output):
    from flink_memory.outputs import read_outputs

    out = read_outputs(str(output))
    seen = {m["source_id"] for m in out["manifests"]} | {d["record_id"] for d in out["dead-letters"]}
    return out if {"intact-retry", "altered-retry"} <= seen else None
