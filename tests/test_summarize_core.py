"""The summarization core without Flink: batch packing, the reduce job's budget, the summary tree."""

import math

import pytest
from stagekit import add

from flink_memory.config import load_config
from flink_memory.records import SummaryNode
from flink_memory.requests import ChatResult, RequestFactory
from flink_memory.summarize.batching import BatchBuffer, unit_entry
from flink_memory.summarize.prompts import Packer
from flink_memory.summarize.reduce import ReduceJob
from flink_memory.summarize.rooms import Rooms
from flink_memory.summarize.tree import SummaryTree
from flink_memory.tokens.estimate import estimate_messages


def cfg(*overrides):
    return load_config(None, list(overrides), environ={})


def unit(i, text="note", ts=None):
    return unit_entry({"agent_id": "a", "unit_id": f"u{i}", "source_id": f"u{i}", "text": text, "ts": ts,
                       "oversized": False})


def limits_of(config):
    budget = RequestFactory.from_config(config.llm).budget
    return Rooms.from_config(config, budget).batch, budget


def test_batches_close_at_max_items():
    limits, budget = limits_of(cfg("batching.max_items=3"))
    buffer = BatchBuffer()
    closed = [b.seqs for i in range(7) for b in add(buffer, unit(i), limits, budget)]
    assert closed == [range(0, 3), range(3, 6)]
    assert buffer.count == 1 and buffer.next_seq == 7


def test_batches_close_at_token_budget():
    limits, budget = limits_of(cfg("batching.max_tokens=200"))
    buffer = BatchBuffer()
    text = "word " * 40
    closed = [b.seqs for i in range(10) for b in add(buffer, unit(i, text), limits, budget)]

    def rendered(batch):  # what the batch request renders, counted entry by entry
        packer = Packer(budget.counter)
        return sum(packer.add(unit(i, text)) for i in batch)

    assert closed and all(rendered(b) <= 200 for b in closed)
    assert sum(len(b) for b in closed) + buffer.count == 10


def test_oversized_unit_is_a_batch_of_its_own():
    limits, budget = limits_of(cfg("batching.max_tokens=200"))
    buffer = BatchBuffer()
    add(buffer, unit(0), limits, budget)
    closed = add(buffer, unit(1, "word " * 1000), limits, budget)
    assert [b.seqs for b in closed] == [range(0, 1), range(1, 2)]


def fake(request, text="short summary"):
    return ChatResult(text=text, prompt_tokens=estimate_messages(request.message_dicts()), completion_tokens=3,
                      model="m")


def run(job, factory, answer=lambda r: "short summary"):
    seen = []
    while True:
        requests = job.requests(factory)
        seen.append(requests)
        text = job.advance(factory, [fake(r, answer(r)) for r in requests])
        if text is not None:
            return text, seen


@pytest.mark.parametrize("window", [1024, 2048, 8192])
def test_reduce_never_exceeds_the_window_and_keeps_every_word(window):
    config = cfg(f"llm.context_window={window}", "llm.max_output_tokens=64", "chunking.max_chunk_tokens=256")
    factory = RequestFactory.from_config(config.llm)
    huge = " ".join(f"w{i}" for i in range(6000))
    job = ReduceJob(purpose="batch", entries=[{"text": huge}, {"text": "tiny"}])
    sent = []

    def echo_words(request):
        sent.append(request)
        return "s"

    text, rounds = run(job, factory, echo_words)
    assert text == "s"
    assert len(rounds) >= 2  # the big item was split and reduced
    for request in sent:
        assert estimate_messages(request.message_dicts()) + request.max_tokens <= window
    first_round = "".join(c for r in rounds[0] for _, c in r.messages)
    assert all(f"w{i}" in first_round for i in range(0, 6000, 97))  # nothing truncated


def test_reduce_is_deterministic():
    factory = RequestFactory.from_config(
        cfg("llm.context_window=1024", "llm.max_output_tokens=64", "chunking.max_chunk_tokens=256").llm)
    entries = [{"text": "alpha beta " * 60} for k in range(12)]
    a = [r.digest for r in ReduceJob(purpose="batch", entries=list(entries)).requests(factory)]
    b = [r.digest for r in ReduceJob(purpose="batch", entries=list(entries)).requests(factory)]
    assert a == b and len(a) > 1


def node(i, level=1, text="summary"):
    return SummaryNode(agent_id="a", node_id=f"batch-{i:06d}", kind="batch", level=level, children=[f"u{i}"],
                       text=text, item_count=1, model="m")


class Tree:
    """A SummaryTree with its node contents (what the merger keeps in a map beside it)."""

    def __init__(self):
        self.tree, self.nodes = SummaryTree(), {}

    def add(self, node, fan_in, budget):
        node = node if isinstance(node, SummaryNode) else SummaryNode(model="m", **node)
        self.nodes[node.node_id] = node
        return self.tree.add(node, fan_in, budget, self.nodes.__getitem__)

    def frontier(self):
        return [self.nodes[i] for i in self.tree.frontier()]

    def settled(self):
        return self.tree.settled()


def grow(tree, n, fan_in, budget, start=0):
    """Add n batch nodes, completing merges instantly; returns the merges each addition caused."""
    per_batch = []
    for i in range(start, start + n):
        pending = tree.add(node(i), fan_in, budget)
        merges = 0
        while pending:
            merges += len(pending)
            nxt = []
            for m in pending:
                merged = {"agent_id": "a", "node_id": m.node_id, "kind": "merge", "level": m.level,
                          "children": [c.node_id for c in m.children], "text": "merged",
                          "item_count": sum(c.item_count for c in m.children)}
                nxt.extend(tree.add(merged, fan_in, budget))
            pending = nxt
        per_batch.append(merges)
    return per_batch


@pytest.mark.parametrize(("n", "fan_in"), [(64, 8), (100, 4), (1000, 8), (81, 3)])
def test_merge_count_grows_linearly_and_a_late_batch_costs_log_n(n, fan_in):
    budget = RequestFactory.from_config(cfg().llm).budget
    tree = Tree()
    per_batch = grow(tree, n, fan_in, budget)
    total = sum(per_batch)
    assert total <= math.ceil(n / (fan_in - 1))
    assert total >= n // fan_in
    assert max(per_batch) <= math.ceil(math.log(n, fan_in)) + 1
    assert sum(n.item_count for n in tree.frontier()) == n  # the frontier covers every unit once


def test_merges_cut_early_when_the_next_node_would_not_fit():
    config = cfg("llm.context_window=2048", "llm.max_output_tokens=128", "chunking.max_chunk_tokens=256")
    budget = RequestFactory.from_config(config.llm).budget
    tree = Tree()
    big = "detail " * 300
    starts = [s for i in range(6) for s in tree.add(node(i, text=big), 8, budget)]
    assert starts and all(2 <= len(s.children) < 8 for s in starts)


def test_merge_groups_are_packed_at_the_upper_bound_whatever_the_process_learned():
    """Summaries full of numbers: the estimate overcounts them far more than prose. What other calls taught the
    process never packs a merge (it depends on which calls ended first, so a rerun would group differently);
    the provider's count of each summary when it was written does, and fills the group to the fan-in."""
    config = cfg("llm.context_window=2048", "llm.max_output_tokens=256")
    budget = RequestFactory.from_config(config.llm).budget
    text = " ".join(f"{k * 7919 % 100000} 2026-03-{1 + k % 28:02d}" for k in range(24))  # ~400 characters
    before = Tree()
    assert [len(s.children) for i in range(8) for s in before.add(node(i, text=text), 8, budget)] == [4]
    budget.counter.calibration.observe(1000, 250, "merge")  # merges have reported: still the same groups
    learned = Tree()
    assert [len(s.children) for i in range(8) for s in learned.add(node(i, text=text), 8, budget)] == [4]
    written = Tree()  # each summary with the provider's count of it (a third of our estimate)
    counted = [node(i, text=text).model_copy(update={"completion_tokens": budget.counter.raw(text) // 3})
               for i in range(8)]
    assert [len(s.children) for n in counted for s in written.add(n, 8, budget)] == [8]


def test_tree_waits_for_earlier_merges_to_keep_chronology():
    budget = RequestFactory.from_config(cfg().llm).budget
    tree = Tree()
    first = [s for i in range(2) for s in tree.add(node(i), 2, budget)]
    second = [s for i in range(2, 4) for s in tree.add(node(i), 2, budget)]
    assert [s.node_id for s in first + second] == ["merge-L2-000001", "merge-L2-000002"]
    done2 = {"node_id": "merge-L2-000002", "level": 2, "text": "b", "item_count": 2, "kind": "merge",
             "children": [], "agent_id": "a"}
    assert tree.add(done2, 2, budget) == []  # the later merge finished first: no level-3 merge yet
    assert not tree.settled()
    done1 = dict(done2, node_id="merge-L2-000001", text="a")
    (level3,) = tree.add(done1, 2, budget)
    assert [c.node_id for c in level3.children] == ["merge-L2-000001", "merge-L2-000002"]
    assert level3.node_id == "merge-L3-000001"


def test_node_ids_do_not_depend_on_llm_timing():
    """A level-2 merge and a level-3 merge that become ready in either order get the same ids."""
    budget = RequestFactory.from_config(cfg().llm).budget

    def merged(node_id, level=2):
        return {"node_id": node_id, "level": level, "text": node_id, "item_count": 2, "kind": "merge",
                "children": [], "agent_id": "a"}

    ids = []
    for l2_first in (True, False):
        tree = Tree()
        starts = [s for i in range(4) for s in tree.add(node(i), 2, budget)]  # L2 #1 and #2
        starts += tree.add(merged("merge-L2-000001"), 2, budget)
        if l2_first:  # batches 4,5 arrive before merge #2 finishes
            starts += [s for i in range(4, 6) for s in tree.add(node(i), 2, budget)]
            starts += tree.add(merged("merge-L2-000002"), 2, budget)
        else:
            starts += tree.add(merged("merge-L2-000002"), 2, budget)
            starts += [s for i in range(4, 6) for s in tree.add(node(i), 2, budget)]
        ids.append(sorted((s.node_id, tuple(c.node_id for c in s.children)) for s in starts))
    assert ids[0] == ids[1]


def test_an_open_batch_closes_where_its_units_say_whatever_the_counter_learns_meanwhile():
    """A buffer packs at the scale it was opened with: what the process learns meanwhile never moves a
    boundary, so a replay after a restore, or a rerun, cuts the same batches."""
    closes = []
    for learn in (False, True):
        limits, budget = limits_of(cfg("batching.max_tokens=300", "batching.max_items=1000"))
        buffer = BatchBuffer()
        closed = []
        for i in range(150):
            if learn and i == 3:  # a batch answer arrives while the first batch is open
                budget.counter.calibration.observe(1000, 300, "batch")
            closed += add(buffer, unit(i, f"note {i} about the quarterly budget review"), limits, budget)
        closes.append(closed)
    assert closes[0] == closes[1] and {c.scale for c in closes[0]} == {1.0}


def test_a_held_buffer_keeps_its_units_in_order_and_closes_nothing():
    limits, budget = limits_of(cfg("batching.max_items=3"))
    buffer = BatchBuffer()
    assert [b for i in range(7) for b in add(buffer, unit(i), limits, budget, None)] == []
    assert buffer.held and buffer.count == 7 and buffer.next_seq == 7
    assert buffer.unpack() == 0 and buffer.count == 0 and buffer.first == 0


def test_a_failed_call_of_a_round_does_not_throw_away_the_answers_of_the_others():
    """A round of several requests where one fails: after the backoff only that one is made again."""
    from flink_memory.requests import LLMCallError
    from flink_memory.stages.calls import RetryPolicy, drive

    config = cfg("llm.context_window=1024", "llm.max_output_tokens=64")
    factory = RequestFactory.from_config(config.llm)
    job = ReduceJob(purpose="batch", entries=[unit(i, f"fact {i} " * 60) for i in range(12)])
    requests = job.requests(factory)
    assert len(requests) >= 3  # one round of several part requests
    finished = {r.digest: fake(r) for r in requests}
    finished[requests[1].digest] = LLMCallError("provider down")
    progress = drive(job, factory, finished, 0, RetryPolicy(1.0, 1.0))
    assert progress.state == "failed" and progress.consumed == [requests[1].digest]
    for digest in progress.consumed:
        finished.pop(digest)
    progress = drive(job, factory, finished, 10_000, RetryPolicy(1.0, 1.0))  # after the backoff
    assert [r.digest for r in progress.start] == [requests[1].digest]


def test_later_rounds_of_a_job_pack_by_what_its_own_requests_counted():
    """Emoji summaries count a sixth of our estimate; the global kind learned 0.6 from another agent's
    numbers. At that scale no two of these summaries fit one request: packed by the ratio its own last
    round reported, the job ends in a few rounds instead of never."""

    config = cfg("llm.context_window=1024", "llm.max_output_tokens=192")
    factory = RequestFactory.from_config(config.llm)
    factory.counter.calibration.observe(1000, 600, "global")
    summary = "🎉👋😀🚀🧪 " * 30
    job = ReduceJob(purpose="global", entries=[{"text": summary, "from": None, "to": None} for _ in range(4)])
    text = None
    for _ in range(6):
        requests = job.requests(factory)
        counted = [factory.counter.raw_request(r.message_dicts()) // 6 for r in requests]
        text = job.advance(factory, [ChatResult(text=summary, prompt_tokens=n, completion_tokens=192, model="m")
                                     for n in counted])
        if text is not None:
            break
    assert text is not None and job.round <= 2
