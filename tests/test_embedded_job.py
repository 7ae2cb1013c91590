"""The whole job with the real SmolLM2 model on part of the shipped sample: outputs valid against the models."""

import json
from collections import Counter
from pathlib import Path

import pytest
from jobkit import batch_units, check_tree, run

from flink_memory.chunking.exchanges import materialize
from flink_memory.chunking.manifest import load_verified, verify_chunks
from flink_memory.chunking.plans import prepare
from flink_memory.records import ChunkManifest, DeadLetter, SummaryNode, parse_line

pytestmark = [pytest.mark.slow, pytest.mark.embedded]

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "memories.jsonl"
AGENTS = {"agent-0", "agent-1"}  # both carry a 24-message conversation, and agent-1 the broken line


def sample_lines() -> list[str]:
    lines = []
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        try:
            agent = json.loads(line).get("agent_id")
        except json.JSONDecodeError:
            agent = "agent-1"
        if agent in AGENTS:
            lines.append(line)
    return lines


def test_sample_end_to_end_with_the_real_model(tmp_path, embedded_llm):
    lines = sample_lines()
    # The fixture's server holds 4096 tokens in 2 slots: 2048 per request. A small chunk limit sends the long
    # conversations to the planner, whose answers from SmolLM2 are often invalid (then the fallback plan is used).
    out = run(tmp_path, lines, embedded_llm.base_url + "/v1", "llm.context_window=2048", "llm.max_output_tokens=96",
              "llm.timeout_s=600", "llm.max_concurrency=2", "chunking.max_chunk_tokens=200", "batching.max_items=25",
              name="embedded")

    nodes = [SummaryNode.model_validate(n) for n in out["summaries"]]
    manifests = [ChunkManifest.model_validate(m) for m in out["manifests"]]
    dead = [DeadLetter.model_validate(d) for d in out["dead-letters"]]

    assert [d.stage for d in dead] == ["parse"] and dead[0].raw.startswith('{"agent_id": "agent-1", "id": "broken"')
    long_chats = {m.source_id: m for m in manifests if m.source_id.endswith("chat-long")}
    assert set(long_chats) == {"a0-chat-long", "a1-chat-long"}
    for manifest in long_chats.values():
        assert manifest.method in ("semantic", "fallback"), manifest
        assert manifest.planner_calls >= 1
        assert (manifest.method == "fallback") == (manifest.reason is not None)
        load_verified(manifest.model_dump_json(), input_digest=manifest.input_digest,
                      policy_fingerprint=manifest.policy_fingerprint)
        # 12 exchanges, each in exactly one chunk, and the chunks are the source's own messages
        assert [(c.start, c.end) for c in manifest.chunks][0][0] == 0 and manifest.chunks[-1].end == 11
        assert all(b.start == a.end + 1 for a, b in zip(manifest.chunks, manifest.chunks[1:]))
        source = parse_line(next(line for line in lines if f'"id": "{manifest.source_id}"' in line))
        prepared = prepare(source)
        verify_chunks(manifest, materialize(prepared.messages, prepared.exchanges, manifest.boundaries,
                                                 prepared.costs, 200))

    chunked = {m.source_id for m in manifests}
    units = Counter((m.agent_id, f"{m.source_id}#{c.index}") for m in manifests for c in m.chunks)
    for line in lines:
        record = json.loads(line) if "broken" not in line[:60] else {}
        if "text" in record and record["id"] not in chunked:
            units[(record["agent_id"], record["id"])] += 1
    assert batch_units(out["summaries"]) == units
    check_tree(out["summaries"], Counter({a: sum(v for (ag, _), v in units.items() if ag == a) for a in AGENTS}))
    assert all(node.text.strip() and node.model for node in nodes)
    assert all(node.completion_tokens > 0 for node in nodes if node.kind != "global")
