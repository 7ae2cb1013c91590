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
    assert [h.key for h in taken] == ["a", "batch-2", "d"]  # the batch holding b and c: one slot for both
    assert taken[1].folds == ["c", "b"] and taken[0].folds == ["batch-1", "merge-1"]
    assert set().union(*(covers[h.key] for h in taken)) == {"a", "b", "c", "d"}


def test_a_summary_of_one_matching_unit_is_shown_as_that_unit():
    ranked = [node("batch-1", 0.9), unit("a", 0.85, "batch-1"), unit("d", 0.5, "batch-3")]
    taken = diversify(ranked, stands_for(ranked, children), k=3, weight=1.0)
    assert [h.key for h in taken] == ["a", "d"] and taken[0].folds == ["batch-1"]


def test_a_summary_that_adds_what_no_unit_holds_keeps_its_slot():
    ranked = [unit("a", 0.9, "batch-1"), node("theme", 0.8), node("batch-1", 0.7), unit("d", 0.5, "batch-3")]
    taken = diversify(ranked, stands_for(ranked, children), k=3, weight=1.0)
    assert [h.key for h in taken] == ["a", "theme", "d"]


def test_a_summary_that_matched_beyond_its_units_keeps_its_slot_and_folds_them():
    # (the question in other words: the summary matched by meaning, its units by a name only)
    ranked = [node("batch-2", 0.9), unit("b", 0.5, "batch-2"), unit("d", 0.45, "batch-3")]
    taken = diversify(ranked, stands_for(ranked, children), k=3, weight=1.0)
    assert [h.key for h in taken] == ["batch-2", "d"] and taken[0].folds == ["b"]


def test_weight_zero_is_relevance_alone_and_a_partial_weight_only_lowers_repeats():
    ranked = [unit("a", 1.0, "batch-1"), node("batch-1", 0.9), unit("d", 0.5, "batch-3")]
    covers = stands_for(ranked, children)
    assert [h.key for h in diversify(ranked, covers, k=3, weight=0)] == ["a", "batch-1", "d"]
    assert [h.key for h in diversify(ranked, covers, k=3, weight=0.5)] == ["a", "d", "batch-1"]  # 0.45 < 0.5
    assert [h.key for h in diversify(ranked, covers, k=2, weight=0.5)] == ["a", "d"]


def test_four_planted_vault_codes_come_back_as_four_facts_in_the_top_5(tmp_path, request):
    """Issue 34's store: four vault codes, each in its own note, among other notes; batches of 10 whose
    summaries keep names and numbers (like the scripted provider), a merge and a global above them."""
    from test_store_units import Hashed, new_location

    from flink_memory.records import MemoryUnit, SummaryNode
    from flink_memory.store import open_store

    codes = ["4711", "5822", "6933", "7044"]
    notes = [f"Note {i}: Ferris walked the dog Bolt{i} in the park." for i in range(20)]
    for place, code in zip((1, 6, 12, 17), codes):
        notes[place] = f"Vault code of door {place}: {code}."
    units = [MemoryUnit(agent_id="a", unit_id=f"n{i}", source_id=f"n{i}", text=t) for i, t in enumerate(notes)]

    def summary(node_id, kind, level, children, texts):
        kept = " ".join(w.strip(".:") for t in texts for w in t.split() if w[0].isupper() or w[0].isdigit())
        return SummaryNode(agent_id="a", node_id=node_id, kind=kind, level=level, children=children,
                           text=f"Summary: {kept}", item_count=len(texts), model="scripted",
                           version=1 if kind == "global" else None)

    batches = [summary(f"batch-00000{b + 1}", "batch", 1, [u.unit_id for u in units[b * 10:b * 10 + 10]],
                       notes[b * 10:b * 10 + 10]) for b in range(2)]
    merge = summary("merge-L2-000001", "merge", 2, [b.node_id for b in batches], [b.text for b in batches])
    top = summary("global-v000001", "global", 3, [merge.node_id], [merge.text])
    for backend in ("sqlite", "postgres"):
        with open_store(new_location(backend, request, tmp_path / backend), create=True, embedder=Hashed()) as store:
            store.upsert_units(units)
            store.upsert([*batches, merge, top])
            for mode in ("keyword", "hybrid"):
                hits = store.recall("a", "what is the vault code", k=5, mode=mode)
                found = {c for c in codes if any(c in h.text for h in hits)}
                assert found == set(codes), (backend, mode, [(h.node_id, h.text[:40]) for h in hits])
                assert len({h.node_id for h in hits}) == len(hits) <= 5
                units_shown = [h for h in hits if h.kind == "unit"]
                assert len(units_shown) == len({h.text for h in units_shown})  # four facts, no repeat
            plain = store.recall("a", "what is the vault code", k=5, mode="keyword", diversity=0)
            repeated = sum(1 for c in codes for h in plain if c in h.text) > len({c for c in codes for h in plain
                                                                                  if c in h.text})
            assert repeated  # (relevance alone spends slots on a fact twice: the defect this fixes)


def test_by_keyword_a_summary_whose_terms_its_one_unit_holds_is_shown_as_the_unit():
    # (a short summary outscores its unit by length alone: "Summary: Alice Fitzwell 9182" against the note)
    ranked = [Ranked(key="batch-1", unit=False, score=1.0, terms=frozenset({"9182"})),
              Ranked(key="a", unit=True, score=0.5, covered_by="batch-1", terms=frozenset({"9182"}))]
    taken = diversify(ranked, stands_for(ranked, children), k=3, weight=1.0)
    assert [h.key for h in taken] == ["a"] and taken[0].folds == ["batch-1"]
