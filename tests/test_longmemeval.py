"""The LongMemEval harness: the official format (hand-written file with an abstention question), the
synthetic generator, and runs that resume only under the recorded policy with verified artifacts."""

import json
import sys
from pathlib import Path

import pytest
from scripted_server import ScriptedServer

from flink_memory.records import Conversation, parse_line

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "longmemeval"))

import harness  # noqa: E402
import synth  # noqa: E402

HANDWRITTEN = ROOT / "tests" / "data" / "longmemeval_handwritten.json"


def test_handwritten_official_file_parses_with_abstention():
    instances = harness.load_instances(HANDWRITTEN)
    assert [i.question_id for i in instances] == ["e47becba", "0a995998", "gpt4_2655b836_abs"]
    assert [i.abstention for i in instances] == [False, False, True]
    assert instances[1].answer == 3
    assert harness.lme_time("2023/05/20 (Sat) 02:21") == "2023-05-20T02:21:00Z"
    records = harness.records_of(instances[0])
    assert [r["id"] for r in records] == ["sharegpt_yywfwks_0", "answer_280352e9"]
    parsed = [parse_line(json.dumps(r)) for r in records]
    assert all(isinstance(p, Conversation) for p in parsed)
    assert parsed[1].ts.isoformat().startswith("2023-05-26T13:04")
    assert parsed[1].messages[0].model_dump()["has_answer"] is True  # extra fields travel with the message


def test_evidence_units_follow_the_manifest_chunks():
    inst = harness.load_instances(HANDWRITTEN)[0]
    manifest = {"source_id": "answer_280352e9", "chunks": [{"index": 0, "start": 0, "end": 0},
                                                           {"index": 1, "start": 1, "end": 1}]}
    assert harness.evidence_units(inst, [manifest]) == {"answer_280352e9#0"}
    assert harness.contains_answer("She holds a business-administration degree.", "Business Administration")
    assert not harness.contains_answer("She studied business.", "Business Administration")


def test_synthetic_instances_are_in_the_official_format(tmp_path):
    out = tmp_path / "synth.json"
    assert synth.main(["--instances", "8", "--sessions", "4", "--out", str(out)]) == 0
    instances = harness.load_instances(out)
    assert len(instances) == 8 and sum(i.abstention for i in instances) == 2
    for inst in instances:
        evidence = [t for s in inst.haystack_sessions for t in s if t.has_answer]
        if inst.abstention:
            assert evidence == [] and inst.answer_session_ids == []
        else:
            assert len(evidence) == 1 and str(inst.answer) in evidence[0].content
            index = inst.haystack_session_ids.index(inst.answer_session_ids[0])
            assert any(t.has_answer for t in inst.haystack_sessions[index])
    raw = json.loads(out.read_text())[0]
    assert set(raw) == {"question_id", "question_type", "question", "answer", "question_date",
                        "haystack_session_ids", "haystack_dates", "haystack_sessions", "answer_session_ids"}


@pytest.mark.slow
def test_runs_resume_only_under_the_same_policy_with_verified_artifacts(tmp_path, capsys):
    data = synth.generate(instances=3, sessions=3)
    first_two, everything = tmp_path / "two.json", tmp_path / "three.json"
    first_two.write_text(json.dumps(data[:2]))
    everything.write_text(json.dumps(data))
    run_dir = tmp_path / "run"
    settings = ["--set", "batching.max_items=2", "--set", "summarization.fan_in=2"]
    with ScriptedServer() as server:
        base = ["run", "--run-dir", str(run_dir), "--base-url", server.base_url, *settings]
        assert harness.main([*base, "--data", str(first_two)]) == 0
        policy = json.loads((run_dir / "policy.json").read_text())["policy"]
        assert policy["summarization"]["max_items"] == 2 and policy["model"] and policy["project_version"]
        assert policy["chunking_fingerprint"] and policy["summarization_fingerprint"]
        done = json.loads((run_dir / "progress.json").read_text())
        assert set(done) == {data[0]["question_id"], data[1]["question_id"]}
        artifacts = {q: (run_dir / "instances" / e["artifact"]).read_text() for q, e in done.items()}
        calls_before = server.count()

        # a new run into the same directory without --resume is refused
        assert harness.main([*base, "--data", str(everything)]) == 2
        assert "--resume" in capsys.readouterr().err

        # same policy: only the third instance runs
        assert harness.main([*base, "--data", str(everything), "--resume"]) == 0
        progress = json.loads((run_dir / "progress.json").read_text())
        assert len(progress) == 3
        for question_id, text in artifacts.items():
            assert (run_dir / "instances" / progress[question_id]["artifact"]).read_text() == text
        scored = [json.loads((run_dir / "instances" / e["artifact"]).read_text()) for e in progress.values()]
        new_requests = [json.dumps(b) for b in server.requests[calls_before:]]
        assert new_requests and all(f"s{k}_" not in r for r in new_requests for k in (0, 1))

        # one changed setting: refused, and the setting is named
        changed = ["run", "--run-dir", str(run_dir), "--base-url", server.base_url, "--set", "batching.max_items=3",
                   "--set", "summarization.fan_in=2", "--data", str(everything), "--resume"]
        assert harness.main(changed) == 2
        err = capsys.readouterr().err
        assert "summarization.max_items: recorded 2, now 3" in err and "chunking." not in err

        # a corrupted artifact: refused, never half-used
        victim = run_dir / "instances" / progress[data[0]["question_id"]]["artifact"]
        victim.write_text(victim.read_text().replace("Summary", "Summery", 1))
        assert harness.main([*base, "--data", str(everything), "--resume"]) == 2
        err = capsys.readouterr().err
        assert data[0]["question_id"] in err and "does not verify" in err
        victim.write_text("{not json")
        assert harness.main([*base, "--data", str(everything), "--resume"]) == 2
        assert "cannot be read" in capsys.readouterr().err

    report = json.loads((run_dir / "report.json").read_text())
    assert sum(row["instances"] for row in report.values()) == 3
    for artifact in scored:
        assert artifact["nodes"] and 0 < artifact["scores"]["compression"]
        if not artifact["scores"]["abstention"]:
            assert artifact["scores"]["evidence_units"]
