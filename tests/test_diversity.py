"""Results that cover distinct memory (flink_memory/store/diversity.py): the covering rule in milliseconds."""

from flink_memory.store.diversity import Ranked, diversify, stands_for

TREE = {"batch-1": ["a", "x"], "batch-2": ["b", "c"], "batch-3": ["d"], "merge-1": ["batch-1", "batch-2"],
        "global-1": ["merge-1", "batch-3"]}


def children(node_ids):
    return {n: TREE[n] for n in node_ids if n in TREE}


def unit(key, score, batch):
    return Ranked(key=key, unit=True, score=score, covered_by=batch)


def node(key, score):
    return Ranked(key=key, unit=False, score=score)


def test_a_hit_stands_for_the_matching_units_below_it():
    hits = [unit("a", 1, "batch-1"), unit("b", 1, "batch-2"), unit("d", 1, "batch-3"), node("merge-1", 1),
            node("global-1", 1), node("batch-2", 1), node("theme", 1)]
    covers = stands_for(hits, children)
    assert covers["merge-1"] == {"a", "b"} and covers["global-1"] == {"a", "b", "d"}
    assert covers["batch-2"] == {"b"} and covers["a"] == {"a"}
    assert covers["theme"] == frozenset()  # matched on its own words: nothing below it matched


def test_four_facts_of_one_kind_come_back_as_four_facts_and_the_repeats_are_folded():
    # the shape of issue 34: unit A, the batch holding B, unit C, unit B again, the batch holding A, unit D
    ranked = [unit("a", 0.9, "batch-1"), node("batch-2", 0.85), unit("c", 0.8, "batch-2"), unit("b", 0.75, "batch-2"),
              node("batch-1", 0.7), unit("d", 0.6, "batch-3"), node("merge-1", 0.5)]
    covers = stands_for(ranked, children)
    taken = diversify(ranked, covers, k=5, weight=1.0)
    assert [h.key for h in taken] == ["a", "batch-2", "d"]
    assert taken[1].folds == ["c", "b"] and taken[0].folds == ["batch-1", "merge-1"]
    facts = set().union(*(covers[h.key] for h in taken))
    assert facts == {"a", "b", "c", "d"}  # every fact is in the list: as a unit, or in the node shown


def test_a_summary_that_adds_what_no_unit_holds_keeps_its_slot():
    ranked = [unit("a", 0.9, "batch-1"), node("theme", 0.8), node("batch-1", 0.7), unit("d", 0.5, "batch-3")]
    taken = diversify(ranked, stands_for(ranked, children), k=3, weight=1.0)
    assert [h.key for h in taken] == ["a", "theme", "d"]


def test_weight_zero_is_relevance_alone_and_a_partial_weight_only_lowers_repeats():
    ranked = [unit("a", 1.0, "batch-1"), node("batch-1", 0.9), unit("d", 0.5, "batch-3")]
    covers = stands_for(ranked, children)
    assert [h.key for h in diversify(ranked, covers, k=3, weight=0)] == ["a", "batch-1", "d"]
    assert [h.key for h in diversify(ranked, covers, k=3, weight=0.5)] == ["a", "d", "batch-1"]  # 0.45 < 0.5
    assert [h.key for h in diversify(ranked, covers, k=2, weight=0.5)] == ["a", "d"]
