"""Two jobs on one PostgreSQL journal (as TaskManagers on two machines would share it): each call is paid once."""

import json

import psycopg
import pytest
from jobkit import check_tree, conversation, items, run, topic_planner
from pgserver import new_database
from scripted_server import ScriptedServer

from flink_memory.llm.journal import PostgresJournal

pytestmark = pytest.mark.slow

SETTINGS = ("batching.max_items=5", "summarization.fan_in=3", "chunking.max_chunk_tokens=400",
            "llm.max_concurrency=2", "summarization.global_refresh_s=600", "batching.flush_after_s=600")


def nodes(out):
    return sorted((n["agent_id"], n["node_id"], n["kind"], tuple(n["children"]), n["text"]) for n in out["summaries"])


def test_second_job_on_a_shared_postgres_journal_pays_no_call(tmp_path, postgres_url):
    journal = new_database(postgres_url)
    records = [conversation("agent-0", "plan"), *items(agents=2, per_agent=12), conversation("agent-1", "trip")]
    with ScriptedServer(topic_planner) as server:
        first = run(tmp_path, records, server.base_url, *SETTINGS, journal=journal, name="first")
        paid = server.count()
        assert paid > 0 and any("response_format" in body for body in server.requests)  # planner calls too
        second = run(tmp_path, records, server.base_url, *SETTINGS, journal=journal, name="second")
        assert server.count() == paid  # every call of the second job was answered from the journal
        distinct = len({json.dumps(body, sort_keys=True) for body in server.requests})
    with psycopg.connect(journal) as conn:  # and the answers are in PostgreSQL, one row per request
        rows = conn.execute(f"SELECT key FROM {PostgresJournal.TABLE}").fetchall()
    assert len(rows) == distinct == paid
    check_tree(second["summaries"])
    assert nodes(second) == nodes(first) and len(first["manifests"]) == 2
