"""The job's store sink on a MiniCluster: after a run with a failure and restart, the store holds exactly the
live view of the changelog (the replayed nodes were upserted onto the rows written before the failure)."""

import pytest
from jobkit import batch_units, expected_units, items, run
from scripted_server import ScriptedServer

from flink_memory.cli import latest_globals
from flink_memory.records import SummaryNode
from flink_memory.store import live_view, open_store

pytestmark = pytest.mark.slow


def test_store_equals_the_live_view_of_the_changelog_after_a_failure(tmp_path):
    marker = tmp_path / "failed"
    records = items(agents=2, per_agent=12)
    records.insert(9, {"agent_id": "agent-1", "id": "fact", "text": "Zorbatin paid 4711 EUR for the boat."})
    with ScriptedServer() as server:
        out = run(tmp_path, records, server.base_url, "batching.max_items=3", "summarization.fan_in=2",
                  "llm.max_concurrency=2", "job.parallelism=2", f"job.inject_failure=merger:6:{marker}",
                  journal=tmp_path / "journal.sqlite")
    assert marker.exists(), "the injected failure did not fire"
    summaries = out["summaries"]
    assert batch_units(summaries) == expected_units(records)
    globals_ = latest_globals(summaries)
    with open_store(str(tmp_path / "job-output" / "memory.sqlite")) as store:
        assert store.agents() == ["agent-0", "agent-1"]
        stored = {(n.agent_id, n.node_id): n for agent in store.agents() for n in store.nodes(agent)}
        assert stored == live_view(summaries)
        for agent, node in globals_.items():
            assert store.current(agent) == SummaryNode.model_validate(node)
        hits = store.recall("agent-1", "What did Zorbatin pay for the boat?", k=3)
        assert hits and "4711" in hits[0].text and hits[0].kind == "batch"
