"""The Flink shell's own small parts, without a cluster: bulk map writes and buffered metric counters."""

import importlib.util

from flink_memory.flink import metrics
from flink_memory.flink.metrics import Tally
from flink_memory.flink.state_backend import EMBEDDED_STATE, FlinkState


class FakeMap:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self.calls.append("put")
        self.data[key] = value

    def put_all(self, entries: dict[str, str]) -> None:
        self.calls.append("put_all")
        self.data.update(entries)


# what thread mode's map state is (its put_all takes a dict in one call into the JVM); its module only imports
# inside a TaskManager, so the test checks that PyFlink still has it where the shell looks
THREAD_MODE_STATE = "pyflink.fn_execution.datastream.embedded.state_impl"
EmbeddedMap = type("MapStateImpl", (FakeMap,), {"__module__": THREAD_MODE_STATE})


def test_thread_mode_state_is_where_the_shell_looks_for_it():
    assert THREAD_MODE_STATE.startswith(EMBEDDED_STATE)
    assert importlib.util.find_spec(THREAD_MODE_STATE) is not None


def test_map_entries_go_in_one_call_only_where_put_all_takes_a_dict():
    entries = {"ab": "1", "cd": "2"}  # two-letter keys: process mode's put_all would unpack each as a pair
    process = FakeMap()
    FlinkState({}, {"m": process}).write_entries("m", entries)
    assert process.calls == ["put", "put"] and process.data == entries
    embedded = EmbeddedMap()
    FlinkState({}, {"m": embedded}).write_entries("m", entries)
    assert embedded.calls == ["put_all"] and embedded.data == entries
    mixed = FlinkState({}, {"a": EmbeddedMap(), "b": FakeMap()})
    assert not mixed.bulk_puts


class FakeValue:
    """A PyFlink ValueState of one key that counts its reads (each a call into the JVM)."""

    def __init__(self, value: str | None = None) -> None:
        self.data, self.reads = value, 0

    def value(self) -> str | None:
        self.reads += 1
        return self.data

    def update(self, value: str) -> None:
        self.data = value

    def clear(self) -> None:
        self.data = None


def test_an_older_layouts_value_is_read_until_it_is_found_absent_or_cleared_then_never_again():
    old, cleared, current = FakeValue(), FakeValue("{}"), FakeValue('{"v":2}')
    state = FlinkState({"old": old, "cleared": cleared, "now": current}, {}, frozenset({"old", "cleared"}))
    state.key = "a"
    assert [state.read("old") for _ in range(3)] == [None] * 3 and old.reads == 1
    assert state.read("cleared") == "{}" and state.read("cleared") == "{}" and cleared.reads == 2  # (kept until moved)
    state.write("cleared", None)
    assert state.read("cleared") is None and cleared.reads == 2 and cleared.data is None
    assert state.read("now") == state.read("now") == '{"v":2}' and current.reads == 1  # (the value cache)
    state.key = "b"
    assert state.read("old") is None and old.reads == 2  # (another key is read once too)


class FakeCounter:
    def __init__(self) -> None:
        self.incs: list[int] = []

    def inc(self, n: int = 1) -> None:
        self.incs.append(n)


class FakeGroup:
    def __init__(self) -> None:
        self.counters: dict[str, FakeCounter] = {}

    def counter(self, name: str) -> FakeCounter:
        return self.counters.setdefault(name, FakeCounter())


def test_metric_increments_reach_flink_summed():
    clock = {"t": 100.0}
    group = FakeGroup()
    tally = Tally(group, clock=lambda: clock["t"])
    for _ in range(1000):
        tally.add("records_in")
    tally.add("llm_in_flight", 3)
    tally.add("llm_in_flight", -3)
    assert group.counters == {}  # nothing handed to Flink yet: each inc is a JVM call
    clock["t"] += metrics.METRIC_FLUSH_S
    tally.add("records_in")
    assert group.counters["records_in"].incs == [1001]
    assert "llm_in_flight" not in group.counters  # a level that came back to where it was costs no call
    tally.add("dead_letters", 2)
    tally.flush()  # (at close)
    assert group.counters["dead_letters"].incs == [2]


def test_checkpoints_go_beside_a_remote_output_as_well_as_a_local_one(tmp_path, monkeypatch):
    from flink_memory.flink.pipeline import _beside

    monkeypatch.chdir(tmp_path)
    assert _beside("s3://bucket/memory/", "_checkpoints") == "s3://bucket/memory/_checkpoints"
    assert _beside("out", "_checkpoints") == str(tmp_path / "out" / "_checkpoints")
    assert _beside(f"file://{tmp_path}/o", "_checkpoints") == str(tmp_path / "o" / "_checkpoints")


class FakeDistribution:
    def __init__(self) -> None:
        self.values: list[int] = []

    def update(self, value: int) -> None:
        self.values.append(value)


def test_calls_are_counted_when_they_end_and_once_when_their_core_consumes_them():
    """At the end of a bounded input a core consumes results only between rounds: the counters must move as
    the provider answers, and a result counted then must not count again when the core takes it."""
    from flink_memory.flink.metrics import CallMeter
    from flink_memory.requests import ChatRequest, ChatResult

    clock = {"t": 0.0}
    group = FakeGroup()
    tally = Tally(group, clock=lambda: clock["t"])
    meter = CallMeter(tally, FakeDistribution(), clock=lambda: clock["t"])
    requests = [ChatRequest.build(model="m", prompt_version="t", messages=[{"role": "user", "content": str(k)}],
                                  max_tokens=8, kind="batch") for k in range(3)]
    meter.submitted(requests)
    meter.submitted(requests[:1])  # (submitted again: still one call)
    assert meter.open_calls == 3
    done = ChatResult(text="a", prompt_tokens=10, completion_tokens=2, model="m", latency_s=1.5, kind="batch")
    hit = ChatResult(text="b", prompt_tokens=7, completion_tokens=1, model="m", from_journal=True, kind="batch")
    finished = {requests[0].digest: done, requests[1].digest: hit}
    meter.sync(finished)  # too soon after the last look: nothing yet
    assert meter.open_calls == 3
    meter.sync(finished, force=True)
    assert meter.open_calls == 1
    tally.flush()
    assert [sum(group.counters[n].incs) for n in ("llm_calls", "llm_calls_batch", "journal_hits", "llm_call_ms",
                                                   "prompt_tokens")] == [1, 1, 1, 1500, 17]
    late = ChatResult(text="c", prompt_tokens=5, completion_tokens=1, model="m", latency_s=0.5, kind="batch")
    meter.consumed([done, hit, late], [r.digest for r in requests])  # `late` ended between two looks
    tally.flush()
    assert sum(group.counters["llm_calls"].incs) == 2 and sum(group.counters["journal_hits"].incs) == 1
    assert sum(group.counters["prompt_tokens"].incs) == 22 and meter.open_calls == 0


def test_time_left_is_the_open_calls_at_the_mean_latency_so_far():
    from flink_memory.cli.progress import time_left_s

    assert time_left_s({"llm_calls": 0, "llm_in_flight": 5}, 2) is None  # no latency seen yet
    assert time_left_s({"llm_calls": 4, "llm_call_ms": 8000, "llm_in_flight": 0}, 2) is None  # nothing left
    assert time_left_s({"llm_calls": 4, "llm_call_ms": 8000, "llm_in_flight": 5}, 2) == 6.0  # 3 rounds of 2 s


def test_records_read_are_the_parse_operators_own_input_count():
    """The ids as a local run's REST API lists them (/jobs/<id>/vertices/<vid>/subtasks/metrics)."""
    from flink_memory.cli.progress import records_read_metric

    fused = ["Source__memory-input.numRecordsIn", "numRecordsIn",
             "memory-to-json__parse-validate.numRecordsInPerSecond", "_stream_key_by_map_operator.numRecordsIn",
             "memory-to-json__parse-validate.numRecordsIn", "Map.numRecordsIn"]
    assert records_read_metric(fused) == "memory-to-json__parse-validate.numRecordsIn"
    assert records_read_metric(["numRecordsIn", "parse-validate.numRecordsIn"]) == "parse-validate.numRecordsIn"
    later = ["batch-summaries.numRecordsIn", "numRecordsIn", "0.flink_memory.records_in",
             "not-parse-validate.numRecordsIn"]
    assert records_read_metric(later) is None
