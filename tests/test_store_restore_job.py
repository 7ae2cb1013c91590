"""A real restore on the MiniCluster (issue 42): a job's checkpoint restored twice into the same output and
store, the second time after the first restore's branch committed and the store applied a forget. The store
ends as the last branch's committed live view, read from the memory log's files; the job writes its history
and branches into flink-memory.json."""

import time

import pytest
from jobkit import cli_command, kill_group, latest_checkpoint, spawn, wait_for, write_lines
from scripted_server import ScriptedServer
from stagekit import UnitTable

from flink_memory.history import read_descriptor
from flink_memory.stages.unit_rows import LogEntry
from flink_memory.store import live_view, open_store

pytestmark = pytest.mark.slow

SETTINGS = ("batching.max_items=3", "batching.flush_after_s=1", "summarization.global_refresh_s=1",
            "summarization.fan_in=2", "checkpointing.interval_s=1", "checkpointing.restart_backoff_s=0.2",
            "embeddings.provider=none")


def fact(agent, i, text=None):
    return {"agent_id": agent, "id": f"m{i}", "text": text or f"{agent}: Person{i} paid {i * 13} EUR for lamp {i}."}


def lineage_view(folder, branch):
    """The committed live view of `branch`'s lineage, from the log's committed files alone."""
    entries = [LogEntry.model_validate_json(line) for path in sorted(folder.iterdir())
               if not path.name.startswith(".") for line in path.read_text().splitlines() if line.strip()]
    chosen = []
    for log_key in {(e.agent_id, e.by) for e in entries}:
        mine = [e for e in entries if (e.agent_id, e.by) == log_key]
        fork = next((e for e in mine if e.branch == branch and e.base is not None), None)
        base = (fork.base.branch, fork.base.seq) if fork else (max(e.branch for e in mine), 10**9)
        chosen += sorted((e for e in mine if (e.branch == base[0] and e.seq <= base[1]) or e.branch == branch),
                         key=lambda e: (e.branch != base[0], e.seq))
    table = UnitTable()
    for entry in chosen:
        if entry.units is not None:
            entry.units.apply(table)
    return live_view([e.node for e in chosen if e.node is not None]), table.units


def test_a_checkpoint_restored_after_another_branch_applied_a_forget(tmp_path):
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    url = str(output / "memory.sqlite")

    def publish(name, records):
        write_lines(inbox / f".{name}", records).rename(inbox / name)

    def store_has(agent, unit_ids, committed=True):
        try:
            with open_store(url) as store:
                units = store.units(agent)
                return ({u.unit_id for u, _ in units} == unit_ids
                        and (not committed or all(c is not None for _, c in units)))
        except Exception:  # noqa: BLE001 - (not created yet)
            return False

    publish("part-0.jsonl", [fact(a, i) for i in range(3) for a in ("a", "b")])
    started = time.monotonic()
    with ScriptedServer() as server:
        def job(log, *args):
            return spawn(cli_command(inbox, output, server, None, *SETTINGS, args=("--follow", *args)),
                         tmp_path / log)

        first = job("first.log")
        try:
            wait_for(lambda: store_has("a", {"m0", "m1", "m2"}) and store_has("b", {"m0", "m1", "m2"}), 240)
            seen = int(latest_checkpoint(output).name.split("-")[1])
            wait_for(lambda: int(latest_checkpoint(output).name.split("-")[1]) > seen, 60, 0.2)
        finally:
            kill_group(first)
        checkpoint = latest_checkpoint(output)  # (its last: the three facts of each agent, batched)
        publish("part-1.jsonl", [{"agent_id": "a", "forget": True}, fact("a", 7, "a: after the forget, tea.")])
        second = job("second.log", "--restore", str(checkpoint))
        try:
            wait_for(lambda: store_has("a", {"m7"}), 180)  # the store applied the second branch's forget
        finally:
            kill_group(second)
        (inbox / "part-1.jsonl").unlink()
        # (no input for a: the restored job opens its branch for every agent of the store as it starts)
        publish("part-2.jsonl", [{"agent_id": "b", "forget": True}, fact("b", 8, "b: after b's forget, coffee.")])
        third = job("third.log", "--restore", str(checkpoint))
        try:
            wait_for(lambda: store_has("a", {"m0", "m1", "m2"}) and store_has("b", {"m8"}), 180)
        finally:
            kill_group(third)
    print(f"\n[restore job] three submissions in {time.monotonic() - started:.0f} s")
    described = read_descriptor(str(output))
    assert [b.restored_from for b in described.branches] == [None, str(checkpoint), str(checkpoint)]
    last = described.branches[-1].branch
    nodes, units = lineage_view(output / "memory", last)
    with open_store(url) as store:
        for agent in ("a", "b"):
            assert {n.node_id: n for n in store.nodes(agent)} == {i: n for (a, i), n in nodes.items() if a == agent}
            assert {u.unit_id: u.text for u, _ in store.units(agent)} == {i: t for (a, i), t in units.items()
                                                                          if a == agent}
        assert store.recall("a", "after the forget tea", mode="keyword") == []
        assert store.recall("b", "Person1 paid lamp", mode="keyword") == []
        assert store.log_positions("a").batcher[0] == last
