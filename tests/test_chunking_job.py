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
