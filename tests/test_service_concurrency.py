"""The service under concurrent calls: recalls from many threads at once give the answers of one at a time,
on a bounded pool of store connections sharing one vector cache; the embedder embeds in several threads at
once; a waiter is served in its turn, and one that waits too long gets a 503, never a hang."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_store_units import Hashed

from flink_memory.embeddings import Embedder
from flink_memory.records import MemoryUnit
from flink_memory.service.memory import Everyone, MemoryService, Unavailable
from flink_memory.service.models import RecallRequest
from flink_memory.service.pool import PoolBusy, SharedVectorCache, StorePool
from flink_memory.store import open_store

WORDS = "boat dog beagle key flowerpot garden tax invoice river bread violin paris train salary".split()


@pytest.fixture
def store(tmp_path) -> str:
    """Two agents with 150 units each, embedded by the toy model."""
    rng = random.Random(3)
    path = str(tmp_path / "memory.sqlite")
    with open_store(path, create=True, embedder=Hashed()) as memory:
        for agent in ("a", "b"):
            memory.upsert_units([MemoryUnit(agent_id=agent, unit_id=f"u{i}", source_id=f"u{i}",
                                            text=" ".join(rng.choices(WORDS, k=6)), ts="2026-01-01T00:00:00Z")
                                 for i in range(150)])
    return path


def questions(n: int) -> list[tuple[str, str, str]]:
    rng = random.Random(5)
    return [(rng.choice("ab"), " ".join(rng.sample(WORDS, 3)), rng.choice(["hybrid", "keyword", "vector"]))
            for _ in range(n)]


def test_many_threads_recalling_at_once_get_the_answers_of_one_at_a_time(store):
    asked = questions(120)

    def answers(service: MemoryService, workers: int) -> list[list[dict]]:
        def one(q: tuple[str, str, str]) -> list[dict]:
            agent, question, mode = q
            hits = service.recall(Everyone(), agent, RecallRequest(question=question, k=5, mode=mode)).hits
            return [h.model_dump() for h in hits]

        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, asked))

    alone = MemoryService(store, embedder=Hashed(), threads=1)
    together = MemoryService(store, embedder=Hashed(), threads=3)
    loads = []
    together._pool.vectors = counting = SharedVectorCache()
    original = counting.vectors

    def counted(agent_id, generation, load):
        return original(agent_id, generation, lambda agent: loads.append(agent) or load(agent))

    counting.vectors = counted
    try:
        expected = answers(alone, 1)
        assert all(expected) and len({str(e) for e in expected}) > 50
        assert answers(together, 16) == expected
        assert together._pool._opened == 3  # at most `threads` store connections, whatever the callers
        assert sorted(loads) == ["a", "b"]  # one matrix per agent, shared by the pool's stores
    finally:
        alone.close()
        together.close()


def test_the_embedder_embeds_in_several_threads_at_once_and_caches_safely():
    class Meeting(Embedder):
        """A toy model whose calls wait for each other: a lock around them would break the barrier."""

        name, dim = "meeting", 4

        def __init__(self):
            super().__init__(batch_size=8, cache_size=50)
            self.barrier = threading.Barrier(4, timeout=10)

        def _embed(self, texts, query):
            if texts[0].startswith("meet"):
                self.barrier.wait()
            return np.array([[len(t), t.count("a"), t.count("e"), 1.0] for t in texts])

    model = Meeting()
    with ThreadPoolExecutor(4) as pool:
        # (passages: questions that arrive together share one call instead, test_embeddings.py)
        met = list(pool.map(lambda t: model.passages([t]), [f"meet {i}" for i in range(4)]))
    assert len(met) == 4 and model.embedded == 4
    texts = [f"text {'a' * (i % 30)} {'e' * (i % 7)}" for i in range(400)]
    with ThreadPoolExecutor(8) as pool:  # more texts than the cache holds: entries leave while others read
        together = list(pool.map(lambda t: model.passages([t, texts[0]])[0], texts))
    alone = Meeting().passages(texts)
    assert np.allclose(np.array(together), alone) and len(model._cache) <= 50


def test_a_waiter_gets_the_next_store_in_its_turn_and_a_long_wait_is_a_503(store):
    pool = StorePool(lambda: open_store(store), size=1, busy_timeout_s=5)
    order = []
    with pool.lend() as first:
        def wait(name):
            with pool.lend() as lent:
                order.append(name)
                assert lent is first  # the one connection, handed over

        threads = []
        for name in ("early", "late"):
            threads.append(threading.Thread(target=wait, args=(name,)))
            threads[-1].start()
            time.sleep(0.2)  # (queued in this order)
    for thread in threads:
        thread.join(10)
    assert order == ["early", "late"]

    pool.busy_timeout_s = 0.2
    with pool.lend(), pytest.raises(PoolBusy):
        with pool.lend():
            pass
    pool.close()
    service = MemoryService(store, threads=1)
    service._pool.busy_timeout_s = 0.2
    with service.store():
        with pytest.raises(Unavailable, match="busy"):
            service.recall(Everyone(), "a", RecallRequest(question="boat"))
    service.close()


def test_a_store_that_fails_to_open_lets_a_waiter_try_itself(store):
    attempts = []

    def opening():
        attempts.append(1)
        if len(attempts) == 1:
            time.sleep(0.3)
            raise OSError("not yet")
        return open_store(store)

    pool = StorePool(opening, size=1)
    failed, served = [], []

    def first():
        try:
            with pool.lend():
                pass
        except OSError:
            failed.append(1)

    def second():
        with pool.lend() as lent:
            served.append(lent)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for thread in threads:
        thread.join(10)
    assert failed == [1] and len(served) == 1 and len(attempts) == 2
    pool.close()
