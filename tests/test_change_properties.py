"""Random mixes of updates, deletions, forgets, waits and provider outages on the stage cores: whatever the
order, the live memory ends as what was accepted. Every live unit is in exactly one live batch node, no
retracted text is in any live node, and the current global covers exactly the live units."""

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from stagekit import Pipeline, cfg, keeping_answer, live

from flink_memory.requests import LLMCallError

KINDS = ["put"] * 6 + ["delete"] * 4 + ["forget"] + ["settle"] * 3 + ["wait"] * 3  # (forgets are rare)
OPERATIONS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 11), st.sampled_from([1, 5, 20])),
                      min_size=10, max_size=60)


def final_memory(operations, failure_rate, seed, *settings_):
    """Runs the operations; returns the pipeline and what was accepted (id -> the token of its version)."""
    outages = random.Random(seed)

    def answer(request):
        if outages.random() < failure_rate:
            raise LLMCallError("provider outage")
        return keeping_answer(request)

    pipeline = Pipeline(cfg("batching.max_items=3", "summarization.fan_in=2", "memory.editable_for=200",
                            "batching.flush_after_s=10", "summarization.global_refresh_s=30", *settings_),
                        answer, bounded=False)
    accepted: dict[str, str] = {}
    versions: Counter[str] = Counter()
    for kind, number, seconds in operations:
        arg = f"m{number}"
        before = len(pipeline.dead_letters)
        if kind == "put":
            versions[arg] += 1
            token = f"Tok{arg}v{versions[arg]}x"
            pipeline.feed({"agent_id": "a", "id": arg, "text": f"Fact {token} of a."})
            after = {**accepted, arg: token}
        elif kind == "delete":
            pipeline.feed({"agent_id": "a", "id": arg, "deleted": True})
            after = {k: v for k, v in accepted.items() if k != arg}
        elif kind == "forget":
            pipeline.feed({"agent_id": "a", "forget": True})
            after = {}
        elif kind == "settle":
            pipeline.settle()
            continue
        else:
            pipeline.advance(seconds)
            continue
        if len(pipeline.dead_letters) == before:  # (refused changes leave the memory as it was)
            accepted = after
    outages.seed(-1)  # the provider recovers: everything pending finishes
    pipeline.advance(400).end()
    written = {f"Tok{i}v{v}x" for i, n in versions.items() for v in range(1, n + 1)}
    return pipeline, accepted, written


def assert_memory_is(pipeline, accepted, written):
    nodes = [n for n in live(pipeline.summaries) if n["agent_id"] == "a"]
    units = Counter(u for n in nodes if n["kind"] == "batch" for u in n["children"])
    assert units == Counter(list(accepted))
    text = "\n".join(n["text"] for n in nodes)
    assert not [t for t in written - set(accepted.values()) if t in text]
    current = pipeline.current("a")
    if accepted:
        assert current["item_count"] == len(accepted)
        assert all(token in current["text"] for token in accepted.values())
    else:
        assert current is None or current["item_count"] == 0


@settings(max_examples=60, deadline=None)
@given(OPERATIONS, st.sampled_from([0.0, 0.3]), st.integers(0, 10_000))
def test_changes_in_any_order_leave_exactly_the_accepted_memory(operations, failure_rate, seed):
    assert_memory_is(*final_memory(operations, failure_rate, seed))


@settings(max_examples=30, deadline=None)
@given(OPERATIONS, st.integers(0, 10_000))
def test_the_same_holds_when_only_batches_and_globals_are_kept(operations, seed):
    pipeline, accepted, written = final_memory(operations, 0.3, seed, "summarization.retention=batch_and_global")
    assert_memory_is(pipeline, accepted, written)
    written_ids = {n["node_id"] for n in pipeline.summaries}
    current = pipeline.current("a")
    assert current is None or set(current["children"]) <= written_ids
