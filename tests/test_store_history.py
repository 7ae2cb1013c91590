"""The store follows one history whatever happens to the job (issue 42): restores of older savepoints into the
same output and store, restores into a new output and store, fresh jobs on an existing store; fencing that holds
at every moment; a corrupt file among good ones. On the stage cores and on SQLite and PostgreSQL, driving the
log writer and the applier as the job does (tests/test_store_log.py)."""

import copy
import threading

import pytest
from stagekit import Pipeline, UnitTable, cfg, keeping_answer
from test_store_log import LogFiles, item
from test_store_units import new_location

from flink_memory.memory_log import UnitRows
from flink_memory.store import live_view, open_store
from flink_memory.store.applier import LogApplier, apply_committed


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    return new_location(request.param, request, tmp_path)


def pipeline(*settings, **kwargs):
    return Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2", "batching.flush_after_s=60", *settings),
                    keeping_answer, bounded=False, **kwargs)


class Reader(threading.Thread):
    """Polls the store on a connection of its own until stopped; remembers every unit text it saw, and when."""

    def __init__(self, url, agent, needle):
        super().__init__(daemon=True)
        self.url, self.agent, self.needle = url, agent, needle
        self.stop, self.phase, self.seen, self.reads = threading.Event(), "before", [], 0

    def run(self):
        with open_store(self.url) as store:
            while not self.stop.is_set():
                phase = self.phase
                texts = [u.text for u, _ in store.units(self.agent)]
                texts += [h.text for h in store.recall(self.agent, self.needle, mode="keyword")]
                self.seen += [(phase, t) for t in texts if self.needle in t]
                self.reads += 1


def test_a_late_older_provisional_upsert_never_shows_a_forgotten_text(location, tmp_path):
    """(d) The forget is shown; then a slow writer's (or a zombie's) older upsert of the forgotten unit comes in,
    and an older deletion, before the forget commits: a reader polling all along never sees the text again."""
    run = pipeline().feed(item("a", 0, fact="Quillon's PIN is 4471.")).settle()
    run.feed({"agent_id": "a", "forget": True}).settle()
    upsert, forget = run.rows
    assert forget.forget and forget.seq == 2
    files = LogFiles(tmp_path / "out")
    with open_store(location, create=True) as store:
        store.write_provisional(upsert)
        reader = Reader(location, "a", "Quillon")
        reader.start()
        try:
            while not reader.seen:  # the reader has seen the unit before its forget
                threading.Event().wait(0.01)
            store.write_provisional(forget)
            reader.phase = "forgotten"

            def read_on(times=5):  # the reader reads the store as it is now, a few times
                reads = reader.reads
                while reader.reads < reads + times:
                    threading.Event().wait(0.01)

            store.write_provisional(upsert)  # late, older: behind the shown forget
            read_on()
            assert store.units("a") == [] and store.recall("a", "Quillon PIN", mode="keyword") == []
            store.write_provisional(UnitRows(agent_id="a", seq=1, delete=["m0"]))  # (an older deletion too)
            files.commit([e for e in run.log if e.seq == 1])  # the applier is behind: the upsert commits now
            apply_committed(store, files.output)
            store.write_provisional(upsert)  # and once more after that commit
            assert store.units("a") == [] and store.recall("a", "Quillon PIN", mode="keyword") == []
            read_on()
            files.commit([e for e in run.log if e.seq > 1])
            apply_committed(store, files.output)
            assert store.units("a") == []
        finally:
            reader.stop.set()
            reader.join()
    assert ("before", "Quillon's PIN is 4471.") in reader.seen
    assert [t for phase, t in reader.seen if phase == "forgotten"] == []


def test_a_late_older_provisional_upsert_never_shows_an_updated_units_old_text(location, tmp_path):
    run = pipeline().feed(item("a", 0, fact="Quillon's PIN is 4471.")).settle()
    run.feed(item("a", 0, fact="Quillon's PIN is now 9020.")).settle()
    first, deletion, second = run.rows
    with open_store(location, create=True) as store:
        for rows in (first, deletion, second, first):  # the first upsert again, late
            store.write_provisional(rows)
        assert [u.text for u, _ in store.units("a")] == ["Quillon's PIN is now 9020."]
        assert [h.text for h in store.recall("a", "Quillon PIN", mode="keyword")] == ["Quillon's PIN is now 9020."]


def test_a_corrupt_or_foreign_file_is_reported_and_skipped_for_the_agents_it_does_not_concern(location, tmp_path,
                                                                                              caplog):
    """(e) Among good files: a file of garbage, a foreign file, a file whose one line is broken. Every agent
    the broken line does not concern is applied; the bad files are named in the log."""
    run = pipeline().feed(*[item(a, i) for i in range(3) for a in ("a", "b")]).settle()
    files = LogFiles(tmp_path / "out")
    files.commit([e for e in run.log if e.agent_id == "a" and e.seq <= 2])
    (files.folder / "README.txt").write_text("this folder holds the memory log\n")
    (files.folder / "part-garbage").write_bytes(b"\x00\xff\xfe garbage")
    bad = files.commit([e for e in run.log if e.agent_id == "b"])
    bad.write_text(bad.read_text().replace('"seq":2', '"seq":"two"') + '{"by": "batcher", "agent_id": "a"\n')
    files.commit([e for e in run.log if e.agent_id == "a" and e.seq > 2])
    with open_store(location, create=True) as store:
        applier = LogApplier(store, files.folder)
        applied = applier.poll()
        assert applied == sum(1 for e in run.log if e.agent_id == "a") + 1  # b: its entry 1, then the gap
        assert [u.unit_id for u, _ in store.units("a")] == ["m0", "m1", "m2"]
        assert [n.node_id for n in store.nodes("a")] == ["batch-000001"]
        assert store.log_position("b")[1] == 1
        named = {name for name, _, _ in applier.skipped}
        assert named == {"README.txt", "part-garbage", bad.name}
        assert all(name in caplog.text for name in named)
        assert len(applier.skipped) == 4  # (the bad file: two lines)
        assert applier.poll() == 0 and len(applier.skipped) == 4  # (reported once)


# --- restores and new jobs -----------------------------------------------------------------------------------


class Job:
    """A job on the stage cores in one branch of a history: `savepoint` copies its state (what Flink's savepoint
    holds), `restore` starts a new submission (a new branch) from such a copy."""

    def __init__(self, history, branch, saved=None):
        self.pipeline = pipeline(*([f"job.history={history}", f"job.branch={branch}"] if branch else []))
        if saved is not None:
            states, deadlines, sweeps, now, finished = copy.deepcopy(saved)
            for stage, state in zip(self.pipeline.stages, states, strict=True):
                stage.state = state
            self.pipeline.deadlines, self.pipeline.sweeps, self.pipeline.now = deadlines, sweeps, now
            self.pipeline.finished = finished
        self.written = 0  # log entries committed so far

    def feed(self, *records):
        self.pipeline.feed(*records).settle().advance(61)
        return self

    def rebase(self, *agents):
        """What a restored job does first for each agent its store holds (flink_memory.history.held_agents)."""
        from flink_memory.stages.messages import Rebase  # (this module runs on releases before it too)

        batcher = next(i for i, stage in enumerate(self.pipeline.stages) if stage.name == "batcher")
        for agent in agents:
            self.pipeline._deliver(batcher, agent, Rebase())
        self.pipeline.settle()
        return self

    def savepoint(self):
        p = self.pipeline
        return copy.deepcopy(([s.state for s in p.stages], p.deadlines, p.sweeps, p.now, p.finished))

    def commit(self, files):
        """A checkpoint: what the job logged since the last one, in a committed file."""
        files.commit(self.pipeline.log[self.written:])
        self.written = len(self.pipeline.log)

    def shown(self, store):
        for rows in self.pipeline.rows:
            store.write_provisional(rows)


def expected(*parts):
    """The committed live view of a lineage: its nodes (summaries) and units (unit rows), from (job, first entry,
    last entry) parts of its log, in order."""
    entries = [e for job, start, end in parts for e in job.pipeline.log[start:end]]
    nodes = live_view([e.node for e in entries if e.node is not None])
    table = UnitTable()
    for entry in entries:
        if entry.units is not None:
            entry.units.apply(table)
    units = {(agent, uid): text for (agent, uid), text in table.units.items()}
    return nodes, units


def assert_store_is(store, nodes, units, agents):
    for agent in agents:
        assert {n.node_id: n for n in store.nodes(agent)} == {i: n for (a, i), n in nodes.items() if a == agent}
        assert {u.unit_id: u.text for u, _ in store.units(agent)} == {i: t for (a, i), t in units.items() if a == agent}
        for unit, covered in store.units(agent):
            batch = next((n for (a, _), n in nodes.items() if a == agent and n.kind == "batch"
                          and unit.unit_id in n.children), None)
            assert covered == (batch.node_id if batch else None)


FIRST = [item(a, i, fact=f"{a.upper()}-fact {i}: Person{i} of {a} paid {i * 11} EUR.") for i in range(4)
         for a in ("a", "b")]


def two_histories(tmp_path):
    """Job 1 takes FIRST (savepoint S after it), then forgets agent a and updates b's m1; job 2, restored from S,
    adds to a and forgets b: a forget in each branch, each absent from the other."""
    one = Job("h1", "b1")
    one.feed(*FIRST)
    files = LogFiles(tmp_path / "out")
    one.commit(files)
    saved, at_savepoint = one.savepoint(), len(one.pipeline.log)
    one.feed({"agent_id": "a", "forget": True}, item("a", 7, fact="A-fact 7: after the forget, tea."),
             item("b", 1, fact="B-fact 1 corrected: Person1 of b paid 999 EUR."))
    two = Job("h1", "b2", saved)
    two.feed(item("a", 9, fact="A-fact 9: Person9 of a paid 99 EUR."), {"agent_id": "b", "forget": True},
             item("b", 8, fact="B-fact 8: after b's forget."))
    return one, two, files, at_savepoint


def test_a_restore_of_an_older_savepoint_into_the_same_output_and_store(location, tmp_path):
    """(a) Job 1 committed and the store applied entries after the savepoint (a's forget, b's update); job 2 is
    restored from the savepoint into the same output and store. The store becomes job 2's committed live view:
    a's forget undone (a's units back), b forgotten, b's update of the abandoned branch gone."""
    one, two, files, at_savepoint = two_histories(tmp_path)
    with open_store(location, create=True) as store:
        one.shown(store)
        one.commit(files)
        applier = LogApplier(store, files.folder)
        applier.poll()
        assert [u.unit_id for u, _ in store.units("a")] == ["m7"]  # the abandoned branch, applied
        two.shown(store)  # the restored job's provisional rows are shown before its first commit
        assert "m9" in {u.unit_id for u, _ in store.units("a")}
        two.commit(files)
        applier.poll()
        nodes, units = expected((one, 0, at_savepoint), (two, 0, None))
        assert_store_is(store, nodes, units, ("a", "b"))
        assert store.recall("a", "after the forget tea", mode="keyword") == []
        assert store.recall("b", "Person1 paid 999", mode="keyword") == []
        assert {u.unit_id for u, _ in store.units("b")} == {"m8"}
        assert store.log_positions("a").batcher[0] == "b2"
        # a restarted applier, and a late provisional write of the abandoned job: nothing changes
        LogApplier(store, files.folder).poll()
        one.shown(store)
        assert_store_is(store, nodes, units, ("a", "b"))


def test_an_agent_without_input_after_the_restore_follows_the_restored_job_at_once(location, tmp_path):
    """(a) for an agent the restored job gets no input for: the job opens its branch at once for every agent
    the store holds (Rebase), so a's forget of the abandoned branch is undone, and agent c, which only the
    abandoned branch knew, leaves the store."""
    one = Job("h1", "b1").feed(*FIRST)
    files = LogFiles(tmp_path / "out")
    one.commit(files)
    saved, at_savepoint = one.savepoint(), len(one.pipeline.log)
    one.feed({"agent_id": "a", "forget": True}, item("c", 0, fact="C-fact 0: only the abandoned branch knew c."))
    with open_store(location, create=True) as store:
        one.commit(files)
        apply_committed(store, files.output)
        assert store.units("a") == [] and store.units("c")
        two = Job("h1", "b2", saved).rebase(*store.agents())
        two.shown(store)
        two.commit(files)
        apply_committed(store, files.output)
        nodes, units = expected((one, 0, at_savepoint), (two, 0, None))
        assert_store_is(store, nodes, units, ("a", "b", "c"))
        assert {u.unit_id for u, _ in store.units("a")} == {"m0", "m1", "m2", "m3"}
        assert store.agents() == ["a", "b"]


def test_a_restore_into_a_new_output_and_a_new_store_needs_nothing_of_the_old_folder(location, tmp_path):
    """(b) Job 2 restored from the savepoint into a new output and a new store: its log alone (each agent's
    branch opens with what the job holds of it) makes the restored job's committed live view."""
    one, two, _, at_savepoint = two_histories(tmp_path)
    files = LogFiles(tmp_path / "new-out")
    with open_store(location, create=True) as store:
        two.shown(store)
        two.commit(files)
        assert apply_committed(store, files.output) == len(two.pipeline.log)
        nodes, units = expected((one, 0, at_savepoint), (two, 0, None))
        assert_store_is(store, nodes, units, ("a", "b"))
        assert not any(h.provisional for h in store.recall("a", "Person9 paid", mode="keyword"))


def test_a_new_job_of_another_history_never_mixes_into_a_store_that_holds_its_agents(location, tmp_path):
    """(c) A second job, started fresh (another history), with other memory for agent a and a new agent c, into
    the same output and store: a is refused, named, and left as the first job made it; c is applied."""
    one = Job("h1", "b1").feed(*FIRST)
    files = LogFiles(tmp_path / "out")
    one.commit(files)
    with open_store(location, create=True) as store:
        apply_committed(store, files.output)
        other = Job("h2", "b2").feed(item("a", 0, fact="Another job's a: Zorbatin drinks coffee."),
                                     item("c", 0, fact="Agent c: Quillon parks on level 3."))
        other.shown(store)
        other.commit(files)
        applier = LogApplier(store, files.folder)
        applier.poll()
        nodes, units = expected((one, 0, None))
        assert_store_is(store, nodes, units, ("a", "b"))
        assert store.recall("a", "Zorbatin coffee", mode="keyword") == []
        assert set(applier.refused) == {"a"} and "another job" in applier.refused["a"]
        assert [u.text for u, _ in store.units("c")] == ["Agent c: Quillon parks on level 3."]


# --- the job's start, and what `apply` needs ---------------------------------------------------------------


def test_a_fresh_job_into_an_output_or_a_store_of_another_history_is_refused_at_start(location, tmp_path):
    """(c) at the start: a job started without a restore where another job's memory is refuses to start and
    says what to do; a restore keeps the history and adds a branch (later than the last)."""
    from flink_memory.history import HistoryError, claim, read_descriptor, start

    output = str(tmp_path / "out")
    config = cfg(f"store.url={location}")
    first = start(config, output, None)
    assert first.job.history and first.job.branch
    with open_store(location) as store:
        assert store.history() == first.job.history
    with pytest.raises(HistoryError, match="Restore that job instead"):
        start(config, output, None)  # the same output (and store) again
    with pytest.raises(HistoryError, match=f"the store .* another job \\(history {first.job.history}\\)"):
        start(config, str(tmp_path / "other-out"), None)  # a new output, the same store
    restored = start(config, output, "/savepoints/savepoint-1")
    assert restored.job.history == first.job.history and restored.job.branch > first.job.branch
    described = read_descriptor(output)
    assert [b.branch for b in described.branches] == [first.job.branch, restored.job.branch]
    assert described.branches[-1].restored_from == "/savepoints/savepoint-1"
    assert described.store == location  # (no password in the test's URL; one is left out:)
    old_output = LogFiles(tmp_path / "old-out")  # an output and a store of a release before histories
    old_output.commit(Job("", "").feed(*FIRST).pipeline.log)
    with pytest.raises(HistoryError, match="the output .* written before histories"):
        start(cfg("embeddings.provider=none"), str(old_output.output), None)
    old_store = str(tmp_path / "old.sqlite")
    with open_store(old_store, create=True) as store:
        apply_committed(store, old_output.output)
    with pytest.raises(HistoryError, match="the store .* written before histories"):
        start(cfg(f"store.url={old_store}", "embeddings.provider=none"), str(tmp_path / "new-out"), None)
    assert start(cfg(f"store.url={old_store}", "embeddings.provider=none"), str(old_output.output), "/chk-1").job.branch
    claim(str(tmp_path / "secret-out"), "postgresql://memory:s3cret@db.internal/memory", "none", None)
    written = (tmp_path / "secret-out" / "flink-memory.json").read_text()
    assert "s3cret" not in written and "postgresql://memory:***@db.internal/memory" in written


def test_apply_needs_only_the_output_and_refuses_another_store_or_model(tmp_path, capsys):
    from flink_memory.cli import main
    from flink_memory.history import start

    elsewhere = tmp_path / "stores" / "memory.sqlite"
    output = tmp_path / "out"
    config = start(cfg(f"store.url={elsewhere}", "embeddings.provider=none"), str(output), None)
    files = LogFiles(output)
    run = Job(config.job.history, config.job.branch).feed(*FIRST)
    run.commit(files)
    assert main(["apply", "--output", str(output)]) == 0
    assert f"applied {len(run.pipeline.log)} log entries to {elsewhere}" in capsys.readouterr().out
    assert not (output / "memory.sqlite").exists()  # (no second store)
    assert main(["apply", "--output", str(output), "--store", str(tmp_path / "other.sqlite")]) == 2
    assert f"writes its memory to {elsewhere}" in capsys.readouterr().err
    assert main(["apply", "--output", str(output), "--set", "embeddings.provider=embedded"]) == 2
    assert "embeds with none, not embedded:default" in capsys.readouterr().err
    with open_store(str(elsewhere)) as store:
        assert {u.unit_id for u, _ in store.units("a")} == {"m0", "m1", "m2", "m3"}


def test_a_failed_attempts_deletion_the_replay_never_makes_hides_nothing_once_the_job_restarts(location, tmp_path):
    """(fencing) The failed attempt showed a deletion of a committed unit and failed before its checkpoint; the
    replay never repeats it (nor writes anything more for the agent). The restarted attempt's writer voids it
    at once, and a late write of the failed attempt changes nothing."""
    run = Job("h1", "b1").feed(item("a", 0, fact="Quillon keeps the spare key under the blue pot."))
    files = LogFiles(tmp_path / "out")
    run.commit(files)
    with open_store(location, create=True) as store:
        apply_committed(store, files.output)
        store.restart_attempt("b1", 0)
        batcher = max(e.seq for e in run.pipeline.log if e.by == "batcher")
        eviction = UnitRows(agent_id="a", seq=batcher + 1, history="h1", branch="b1", delete=["m0"])
        store.write_provisional(eviction)
        assert store.units("a") == []  # shown at once
        store.restart_attempt("b1", 1)  # the job restarted: the replay (attempt 1) does not evict m0
        assert [u.unit_id for u, _ in store.units("a")] == ["m0"]
        zombie = open_store(location)  # a zombie of attempt 0, on its own connection
        zombie.restart_attempt("b1", 0)
        zombie.write_provisional(eviction)
        zombie.close()
        assert [u.unit_id for u, _ in store.units("a")] == ["m0"]
        assert store.recall("a", "spare key", mode="keyword")[0].node_id == "m0"
        store.write_provisional(eviction)  # (the replay's own deletion, attempt 1, is shown)
        assert store.units("a") == []


def test_the_descriptor_sample_of_the_docs_is_what_the_job_writes():
    from pathlib import Path

    from flink_memory.history import LOG_FORMAT, parse_descriptor

    text = (Path(__file__).resolve().parents[1] / "docs" / "output.md").read_text(encoding="utf-8")
    sample = text.split("what an applier needs to follow it, written when the job is submitted:\n\n```json\n")[1]
    described = parse_descriptor(sample.split("```")[0], "docs/output.md")
    assert described.log_format == LOG_FORMAT and described.branches[-1].restored_from
    assert described.lineage.branch > described.branches[0].branch
