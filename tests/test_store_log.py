"""The store follows the committed memory log (docs/architecture.md, invariant 9): the batcher numbers each
agent's unit rows and batch nodes, the merger its merges and globals, in the order they were decided; the
applier writes only committed files, once each; provisional rows live until the commit that confirms or
disowns them. On the stage cores and on SQLite and PostgreSQL."""

import json
import threading

import pytest
from stagekit import Pipeline, cfg, keeping_answer
from test_store_units import new_location

from flink_memory.memory_log import LogEntry, UnitRows
from flink_memory.store import StoreError, live_view, open_store
from flink_memory.store.applier import LOG_DIR, LogApplier, apply_committed


def item(agent, i, fact=None):
    return {"agent_id": agent, "id": f"m{i}", "text": fact or f"Fact{i} of {agent}: Person{i} paid {i} EUR."}


def pipeline(*settings):
    return Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2", "batching.flush_after_s=60", *settings),
                    keeping_answer, bounded=False)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    return new_location(request.param, request, tmp_path)


class LogFiles:
    """A memory/ folder as Flink's file sink leaves it: committed part files, and hidden in-progress ones."""

    def __init__(self, output):
        self.output = output
        self.folder = output / LOG_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def commit(self, entries, subtask=0):
        self.count += 1
        path = self.folder / f"memory-{self.count:04d}-{subtask}-{self.count}.jsonl"
        path.write_text("".join(entry.model_dump_json() + "\n" for entry in entries))
        return path

    def in_progress(self, entries):
        """What a failed attempt wrote after its last checkpoint: never committed."""
        self.count += 1
        path = self.folder / f".memory-{self.count:04d}-0-{self.count}.jsonl.inprogress.x"
        path.write_text("".join(entry.model_dump_json() + "\n" for entry in entries))


def stored_nodes(store, agent):
    return {n.node_id: n for n in store.nodes(agent)}


def test_each_agent_has_two_numbered_logs_and_a_unit_row_precedes_the_node_that_covers_it():
    run = pipeline().feed(*[item("a", i) for i in range(3)], item("b", 0)).settle()
    run.feed(item("a", 1, fact="Person1 paid 999 EUR, corrected.")).settle().advance(61)
    for agent in ("a", "b"):
        for by in ("batcher", "merger"):
            seqs = [e.seq for e in run.log if (e.agent_id, e.by) == (agent, by)]
            assert seqs == list(range(1, len(seqs) + 1))
    batcher = [("units", e.units.seq) if e.units else (e.node.kind, e.node.node_id) for e in run.log
               if (e.agent_id, e.by) == ("a", "batcher")]
    # accepted m0..m2, their batch; the update: its deletion and its row, then the batch made again
    assert batcher[:4] == [("units", 1), ("units", 2), ("units", 3), ("batch", "batch-000001")]
    assert batcher[4:] == [("units", 5), ("units", 6), ("batch", "batch-000001-r1"), ("batch", "batch-000002")]
    assert {e.node.kind for e in run.log if e.by == "merger"} == {"merge", "global"}
    logged = sorted((e.node.agent_id, e.node.node_id) for e in run.log if e.node)
    assert logged == sorted((n["agent_id"], n["node_id"]) for n in run.summaries)


def test_an_update_never_races_its_old_batch_node(location, tmp_path):
    """(issue 31, mechanism 3) The old batch node covering a unit reaches the store before the update's row:
    the corrected unit is covered by the revision, and recall finds it."""
    run = pipeline().feed(*[item("a", i) for i in range(3)]).settle()
    run.feed(item("a", 1, fact="Zorbatin paid 5822 EUR for the boat, corrected.")).settle().advance(61)
    files = LogFiles(tmp_path / "out")
    for entry in run.log:  # one commit each: any cut of the log is a state the store may be in
        files.commit([entry])
    with open_store(location, create=True) as store:
        assert apply_committed(store, files.output) == len(run.log)
        units = dict((u.unit_id, (u.text, c)) for u, c in store.units("a"))
        live = live_view(run.summaries)
        revision = next(n for (_, i), n in live.items() if n.kind == "batch" and "m1" in n.children)
        assert units["m1"] == ("Zorbatin paid 5822 EUR for the boat, corrected.", revision.node_id)
        assert stored_nodes(store, "a") == {i: n for (_, i), n in live.items()}
        assert store.recall("a", "Zorbatin boat", mode="keyword")[0].text.startswith("Zorbatin paid 5822")


def test_a_forget_after_a_failure_leaves_no_text_of_the_failed_attempt(location, tmp_path):
    """(issue 31, mechanism 1) The failed attempt showed agent-2's units and wrote its batch node after the
    last checkpoint; the replay took the forget first. The store holds the forget's memory only."""
    first = pipeline().feed(*[item("agent-2", i) for i in range(3)]).settle()
    checkpointed = [e for e in first.log if e.units]  # the units committed; the batch node was not
    lost = [e for e in first.log if e.node]
    files = LogFiles(tmp_path / "out")
    files.commit(checkpointed)
    files.in_progress(lost)
    with open_store(location, create=True) as store:
        for rows in first.rows:
            store.write_provisional(rows)  # what the failed attempt showed at once
        apply_committed(store, files.output)
        assert not stored_nodes(store, "agent-2")  # the uncommitted batch node is not there
        # the replay: the same units again (same seqs), then the forget, before the batch's summary is taken
        replay = pipeline().feed(*[item("agent-2", i) for i in range(3)], {"agent_id": "agent-2", "forget": True})
        replay.settle()
        new = [e for e in replay.log if e.by == "merger" or e.seq > checkpointed[-1].seq]
        for rows in replay.rows[len(checkpointed):]:
            store.write_provisional(rows)
        files.commit(new)
        apply_committed(store, files.output)
        nodes = store.nodes("agent-2")
        assert [n.kind for n in nodes] == ["global"] and nodes[0].item_count == 0
        assert store.units("agent-2") == []
        assert store.recall("agent-2", "Person1 paid EUR", mode="keyword") == []
        replayed = {n["node_id"] for n in replay.summaries}
        assert all(node_id in replayed for node_id in stored_nodes(store, "agent-2"))


def test_a_merge_revision_of_a_failed_attempt_never_blocks_the_replays_merge(location, tmp_path):
    """(issue 31, mechanism 2) Attempt 1 wrote M, then M-r1 replacing it, after the last checkpoint; the replay
    rebuilt M in place. Only what the replay committed is in the store."""
    run = pipeline().feed(*[item("a", i) for i in range(6)]).settle()
    merge = next(e.node for e in run.log if e.node and e.node.kind == "merge")
    revision = merge.model_copy(update={"node_id": merge.node_id + "-r1", "replaces": [merge.node_id],
                                        "text": "attempt 1's revision"})
    files = LogFiles(tmp_path / "out")
    files.in_progress([LogEntry(by="merger", agent_id="a", seq=90, node=revision)])
    files.commit(run.log)
    with open_store(location, create=True) as store:
        apply_committed(store, files.output)
        assert stored_nodes(store, "a")[merge.node_id] == merge
        assert merge.node_id + "-r1" not in stored_nodes(store, "a")


def test_every_entry_is_applied_once_whatever_the_files_order_and_however_many_appliers(location, tmp_path):
    run = pipeline().feed(*[item(a, i) for i in range(7) for a in ("a", "b")]).settle().advance(61)
    files = LogFiles(tmp_path / "out")
    later = [e for e in run.log if e.seq > 4]
    files.commit(later[::2], subtask=1)  # a file whose entries wait for earlier ones in files not seen yet
    files.commit(later[1::2], subtask=0)
    with open_store(location, create=True) as store, open_store(location) as other:
        first = LogApplier(store, files.folder)
        assert first.poll() == 0 and not stored_nodes(store, "a")  # seq 1..4 are missing: nothing applied
        files.commit([e for e in run.log if e.seq <= 4])
        second = LogApplier(other, files.folder)
        threads = [threading.Thread(target=applier.poll) for applier in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert first.entries + second.entries == len(run.log)
        assert LogApplier(store, files.folder).poll() == 0  # a restarted applier: everything is applied
        assert store.applied_files() == {p.name for p in files.folder.iterdir()}
        for agent in ("a", "b"):
            assert stored_nodes(store, agent) == {i: n for (a, i), n in live_view(run.summaries).items()
                                                  if a == agent}
            assert store.log_position(agent) == tuple(max(e.seq for e in run.log if (e.agent_id, e.by) == (agent, by))
                                                      for by in ("merger", "batcher"))


def test_a_provisional_unit_is_found_at_once_and_the_commit_confirms_or_removes_it(location, tmp_path):
    run = pipeline().feed(item("a", 0, fact="Quillon keeps the spare key under the blue pot.")).settle()
    files = LogFiles(tmp_path / "out")
    with open_store(location, create=True) as store:
        store.write_provisional(run.rows[0])
        hit = store.recall("a", "Where is the spare key?", mode="keyword")[0]
        assert (hit.node_id, hit.provisional) == ("m0", True)
        assert json.loads(hit.model_dump_json())["provisional"] is True
        # a zombie of a failed attempt shows a unit under a seq the replay gives to another unit
        stale = UnitRows(agent_id="a", seq=2, upsert=[run.rows[0].upsert[0].model_copy(
            update={"unit_id": "zombie", "text": "Quillon's zombie text"})])
        store.write_provisional(stale)
        run.feed(item("a", 1, fact="Quillon parks on level 3.")).settle()
        files.commit(run.log)
        apply_committed(store, files.output)
        hits = store.recall("a", "Quillon", mode="keyword")
        assert {(h.node_id, h.provisional) for h in hits} == {("m0", False), ("m1", False)}
        assert [u.unit_id for u, _ in store.units("a")] == ["m0", "m1"]


def test_a_deletion_shown_before_its_commit_is_not_undone_by_an_older_commit(location, tmp_path):
    run = pipeline().feed(item("a", 0, fact="Quillon's PIN is 4471.")).settle()
    run.feed({"agent_id": "a", "id": "m0", "deleted": True}).settle()
    upsert, deletion = run.rows
    files = LogFiles(tmp_path / "out")
    with open_store(location, create=True) as store:
        store.write_provisional(upsert)
        store.write_provisional(deletion)  # the deletion is shown at once
        files.commit([e for e in run.log if e.seq == 1])  # the applier is behind: the upsert commits now
        apply_committed(store, files.output)
        assert store.units("a") == [] and store.recall("a", "PIN", mode="keyword") == []
        files.commit([e for e in run.log if e.seq > 1])
        apply_committed(store, files.output)
        assert store.units("a") == [] and store.log_position("a") == (0, 2)


def test_flink_memory_apply_writes_a_committed_log_into_the_store(tmp_path, capsys):
    from flink_memory.cli import main

    run = pipeline().feed(*[item("a", i) for i in range(3)]).settle()
    files = LogFiles(tmp_path / "out")
    files.commit(run.log)
    assert main(["apply", "--output", str(files.output)]) == 0
    assert f"applied {len(run.log)} log entries" in capsys.readouterr().out
    assert main(["apply", "--output", str(files.output)]) == 0  # again: nothing twice
    assert "applied 0 log entries" in capsys.readouterr().out
    with open_store(str(files.output / "memory.sqlite")) as store:
        assert {n.node_id for n in store.nodes("a")} == {"batch-000001"}
        assert [c for _, c in store.units("a")] == ["batch-000001"] * 3


def test_provisional_rows_are_written_behind_in_order_and_a_failure_reaches_the_writer(location, tmp_path):
    from flink_memory.store.provisional import WriteBehind

    run = pipeline().feed(item("a", 0), item("a", 1)).settle().feed({"agent_id": "a", "id": "m0", "deleted": True})
    run.settle()
    named = []
    with open_store(location, create=True) as store:
        writer = WriteBehind(store, named.extend, flush_s=0.01)
        for rows in run.rows:
            writer.submit(rows)
        writer.close()
        assert [u.unit_id for u, _ in store.units("a")] == ["m1"] and named[:1] == ["a"]
    with open_store(location) as store:
        def down(_messages):
            raise StoreError("the store is down")

        store.write_provisional = down  # a store that fails: the error comes back to the writer
        broken = WriteBehind(store, flush_s=0.01)
        broken.submit(run.rows[0])
        with pytest.raises(StoreError, match="down"):
            broken.close()


def test_a_provisional_write_that_comes_after_its_commit_changes_nothing(location, tmp_path):
    """A slow writer or a zombie of a failed attempt: its messages reach the store after the applier committed
    them; neither its unit nor its deletion may outlive, or undo, what was committed."""
    run = pipeline().feed(item("a", 0, fact="Quillon's PIN is 4471.")).settle()
    run.feed({"agent_id": "a", "id": "m0", "deleted": True}).settle().feed(item("a", 1)).settle()
    files = LogFiles(tmp_path / "out")
    files.commit(run.log)
    with open_store(location, create=True) as store:
        apply_committed(store, files.output)
        committed = store.units("a")
        for rows in run.rows:  # all of them late: the upsert, the deletion, the next upsert
            store.write_provisional(rows)
        assert store.units("a") == committed and [u.unit_id for u, _ in committed] == ["m1"]
        assert not any(h.provisional for h in store.recall("a", "Person1 paid", mode="keyword"))


def test_a_deletion_a_failed_attempt_showed_and_the_replay_did_not_make_is_undone_at_the_commit(location, tmp_path):
    """The failed attempt evicted a unit (its deletion was shown, a unit hidden); the replay did not: at the
    commit that passes the deletion's seq, the unit is back."""
    run = pipeline().feed(item("a", 0, fact="Quillon keeps the spare key under the blue pot.")).settle()
    files = LogFiles(tmp_path / "out")
    files.commit(run.log)
    with open_store(location, create=True) as store:
        apply_committed(store, files.output)
        store.write_provisional(UnitRows(agent_id="a", seq=2, delete=["m0"]))  # the failed attempt's eviction
        store.write_provisional(UnitRows(agent_id="a", seq=3, forget=True))  # (and even a forget)
        assert store.units("a") == [] and store.recall("a", "spare key", mode="keyword") == []
        run.feed(item("a", 1), item("a", 2)).settle()  # the replay: other messages under seq 2 and 3
        files.commit([e for e in run.log if e.seq > 1])
        apply_committed(store, files.output)
        assert [u.unit_id for u, _ in store.units("a")] == ["m0", "m1", "m2"]
        assert store.recall("a", "spare key", mode="keyword")[0].node_id == "m0"
