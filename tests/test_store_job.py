"""The job's store sink on a MiniCluster: after a run with an update, a deletion, a forgotten agent and a
failure and restart on the way, the store holds exactly the live view of the changelog (replayed nodes were
upserted onto the rows written before the failure, replaced nodes left the store)."""

from collections import Counter

import pytest
from jobkit import items, run
from scripted_server import ScriptedServer

from flink_memory.store import live_view, open_store

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_store_equals_the_live_view_of_the_changelog_after_changes_and_a_failure(tmp_path, request, backend):
    """The same on the default SQLite store and on a real PostgreSQL server (tests/pgserver.py)."""
    marker = tmp_path / "failed"
    url = str(tmp_path / "job-output" / "memory.sqlite")
    settings = ()
    if backend == "postgresql":
        import uuid

        import psycopg

        base = request.getfixturevalue("postgres_url")
        database = f"store_job_{uuid.uuid4().hex[:8]}"  # a database of its own: no other test's agents
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {database}")
        url = base.rsplit("/", 1)[0] + "/" + database
        settings = (f"store.url={url}",)
    records = items(agents=3, per_agent=12)
    records.insert(9, {"agent_id": "agent-1", "id": "fact", "text": "Zorbatin paid 4711 EUR for the boat."})
    records += [{"agent_id": "agent-1", "id": "fact", "text": "Zorbatin paid 5822 EUR for the boat, corrected."},
                {"agent_id": "agent-0", "id": "m5", "deleted": True},
                {"agent_id": "agent-2", "forget": True}]
    with ScriptedServer() as server:
        out = run(tmp_path, records, server.base_url, "batching.max_items=3", "summarization.fan_in=2",
                  "llm.max_concurrency=2", "job.parallelism=2", f"job.inject_failure=merger:6:{marker}", *settings,
                  journal=tmp_path / "journal.sqlite")
    assert marker.exists(), "the injected failure did not fire"
    live = live_view(out["summaries"])
    # (the changes replace nodes when they reach the batcher after their batches were summarized; on a busy
    # machine they can come first, while each agent's units wait for its first report: then they apply to
    # units not yet summarized, and the store must equal the live view all the same)
    with open_store(url) as store:
        assert store.agents() == ["agent-0", "agent-1", "agent-2"]
        stored = {(n.agent_id, n.node_id): n for agent in store.agents() for n in store.nodes(agent)}
        assert stored == live
        for agent in store.agents():
            globals_ = [n for (a, _), n in live.items() if a == agent and n.kind == "global"]
            assert store.current(agent) == max(globals_, key=lambda n: n.version)
        units = Counter(u for n in store.nodes("agent-0") if n.kind == "batch" for u in n.children)
        assert units == Counter(f"m{i}" for i in range(12) if i != 5)  # the deleted unit is in no live node
        hits = store.recall("agent-1", "What did Zorbatin pay for the boat?", k=3, diversity=0)  # (relevance)
        # the corrected unit itself comes first (a unit before the batch node that covers it), then that node
        assert hits and "5822" in hits[0].text and hits[0].kind == "unit"
        assert hits[1].kind == "batch" and "5822" in hits[1].text
        # (a unit row that reaches the store after the batch node covering it, as a replay's can, is not
        # marked covered until that node is written again)
        assert hits[0].covered_by in (None, hits[1].node_id)
        distinct = store.recall("agent-1", "What did Zorbatin pay for the boat?", k=3)  # (the default)
        assert distinct[0].node_id == hits[0].node_id and hits[1].node_id in distinct[0].folds
        assert not any("4711" in n.text for n in store.nodes("agent-1"))  # the superseded fact left the store
        forgotten = store.current("agent-2")
        assert forgotten.item_count == 0 and store.nodes("agent-2") == [forgotten]
        # units: written as the batcher accepted them; the deleted, superseded and forgotten ones left
        assert [u.unit_id for u, _ in store.units("agent-0")] == sorted(f"m{i}" for i in range(12) if i != 5)
        covering = {n.node_id for n in store.nodes("agent-0")}
        assert all(c is None or c in covering for _, c in store.units("agent-0"))  # (None: see above)
        assert [u.text for u, _ in store.units("agent-1") if u.unit_id == "fact"] == [records[-3]["text"]]
        assert store.units("agent-2") == []
        assert not store.recall("agent-1", "4711", mode="keyword")
