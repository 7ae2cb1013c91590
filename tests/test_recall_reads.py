"""What a recall spares itself: the agent's row count is counted again only when the agent's generation moved,
and the question is embedded in a thread while the store searches by keyword (its errors reach the caller,
and the embedder is done when recall returns)."""

import threading
import time

import numpy as np
import pytest

from flink_memory.embeddings import Embedder, EmbeddingError
from flink_memory.records import MemoryUnit
from flink_memory.store import open_store
from flink_memory.store.schema import ROWS_OF_AGENT
from flink_memory.store.vectors import VectorCache


class Slow(Embedder):
    """A toy model that takes its time and records the threads it ran in; `fail` makes its questions fail."""

    dim, name = 4, "slow"

    def __init__(self, fail=False):
        super().__init__()
        self.fail, self.threads, self.running = fail, set(), False

    def _embed(self, texts, query):
        self.running = True
        self.threads.add(threading.current_thread().name)
        time.sleep(0.05)
        self.running = False
        if query and self.fail:
            raise EmbeddingError("the model is down")
        return np.array([[len(t) % 3, 1.0, "boat" in t, 0.5] for t in texts], dtype=np.float32)


def unit(uid, text):
    return MemoryUnit(agent_id="a", unit_id=uid, source_id=uid, text=text, ts="2026-01-01T00:00:00Z")


def test_a_row_count_is_counted_again_only_when_the_generation_moves():
    cache, counted = VectorCache(max_agents=2), []

    def count(agent):
        counted.append(agent)
        return 10 * len(counted)

    assert [cache.rows("a", 1, count), cache.rows("a", 1, count), cache.rows("a", 2, count)] == [10, 10, 20]
    assert [cache.rows("a", None, count), cache.rows("a", None, count)] == [30, 40]  # no generations: no cache
    cache.rows("b", 1, count), cache.rows("c", 1, count)
    assert cache.rows("a", 2, count) == 70 and counted == ["a"] * 4 + ["b", "c", "a"]  # (a left: 2 agents kept)


def test_recall_counts_the_agents_rows_once_per_generation(tmp_path):
    with open_store(str(tmp_path / "m.sqlite"), create=True) as store:
        store.upsert_units([unit("u1", "a boat at dawn"), unit("u2", "a harbour")])
        fetch, counts = store.connection.fetch, []
        store.connection.fetch = lambda sql, params: (counts.append(sql) if sql == ROWS_OF_AGENT else None) or fetch(
            sql, params)
        for _ in range(3):
            assert [h.node_id for h in store.recall("a", "boat", mode="keyword")] == ["u1"]
        store.upsert_units([unit("u3", "another boat")])
        assert {h.node_id for h in store.recall("a", "boat", mode="keyword")} == {"u1", "u3"}
    assert len(counts) == 2


def test_the_question_is_embedded_in_a_thread_and_done_when_recall_returns(tmp_path):
    embedder = Slow()
    with open_store(str(tmp_path / "m.sqlite"), create=True, embedder=embedder) as store:
        store.upsert_units([unit("u1", "a boat at dawn"), unit("u2", "a harbour")])
        hits = store.recall("a", "the boat", mode="hybrid")
        assert hits and hits[0].node_id == "u1" and not embedder.running
        assert "embed-question" in embedder.threads
        assert (embedder.query_meanwhile("the boat")() == embedder.query("the boat")).all()


def test_an_embedding_error_reaches_the_caller_and_a_search_error_waits_for_the_embedder(tmp_path):
    with open_store(str(tmp_path / "m.sqlite"), create=True, embedder=Slow()) as store:
        store.upsert_units([unit("u1", "a boat at dawn")])
        store.embedder = Slow(fail=True)
        with pytest.raises(EmbeddingError, match="the model is down"):
            store.recall("a", "the boat", mode="vector")
        store.embedder = slow = Slow()

        def broken(*_args, **_kwargs):
            raise RuntimeError("the index is broken")

        store.search.matching = broken
        with pytest.raises(RuntimeError, match="the index is broken"):
            store.recall("a", "the boat", mode="hybrid")
        assert not slow.running and slow.embedded == 1


def test_a_large_agents_search_starts_from_signs_and_still_finds_the_nearest_rows():
    import numpy as np

    from flink_memory.store.vectors import SHORTLIST_ABOVE, AgentVectors, nearest

    rng = np.random.default_rng(5)
    rows = SHORTLIST_ABOVE + 5000
    matrix = rng.standard_normal((rows, 48)).astype(np.float32) @ rng.standard_normal((48, 256)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    keys = [f"u{i}" for i in range(rows)]
    signed = AgentVectors.of(1, keys, matrix)
    exact = AgentVectors.of(1, keys, matrix, shortlist_above=rows)
    assert signed.signs is not None and exact.signs is None
    found = 0
    for i in range(0, 2000, 100):
        question = matrix[i] + 0.5 * rng.standard_normal(256).astype(np.float32) / 16
        question /= np.linalg.norm(question)
        best = set(np.argsort(-(matrix @ question))[:5].tolist())
        assert set(nearest(exact, question, 50)) >= best
        shortlisted = nearest(signed, question, 50)
        assert len(shortlisted) == 50 and i in shortlisted
        found += len(best & set(shortlisted))
    assert found >= 0.95 * 5 * 20
