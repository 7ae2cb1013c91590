"""The store follows one history whatever happens to the job (issue 42): restores of older savepoints into the
same output and store, restores into a new output and store, fresh jobs on an existing store; fencing that holds
at every moment; a corrupt file among good ones. On the stage cores and on SQLite and PostgreSQL, driving the
log writer and the applier as the job does (tests/test_store_log.py)."""

import threading

import pytest
from stagekit import Pipeline, cfg, keeping_answer
from test_store_log import LogFiles, item
from test_store_units import new_location

from flink_memory.stages.unit_rows import UnitRows
from flink_memory.store import open_store
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
            reads = reader.reads
            store.write_provisional(upsert)  # late, older: behind the shown forget
            store.write_provisional(UnitRows(agent_id="a", seq=1, delete=["m0"]))  # (an older deletion too)
            files.commit([e for e in run.log if e.seq == 1])  # the applier is behind: the upsert commits now
            apply_committed(store, files.output)
            store.write_provisional(upsert)  # and once more after that commit
            assert store.units("a") == [] and store.recall("a", "Quillon PIN", mode="keyword") == []
            while reader.reads < reads + 5:
                threading.Event().wait(0.01)
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
