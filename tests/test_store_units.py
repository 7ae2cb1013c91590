"""Memory units and vectors in the store (SQLite and PostgreSQL): units beside nodes, deletions that leave no
row and no vector, the embedding model recorded and enforced, the same ranking on both stores."""

import json
import zlib

import numpy as np
import pytest
from pgserver import new_database

from flink_memory.embeddings import Embedder, from_bytes
from flink_memory.records import MemoryUnit, SummaryNode
from flink_memory.store import StoreError, open_store
from flink_memory.store.ranking import words
from flink_memory.store.schema import NODES


class Hashed(Embedder):
    """A toy model: hashed word counts (64 dimensions); `salt` makes another, incompatible model."""

    dim = 64

    def __init__(self, salt=0):
        super().__init__(batch_size=4)
        self.salt, self.name = salt, f"hashed-{salt}"

    def _embed(self, texts, query):
        out = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            for word in words(text):
                out[i, (zlib.crc32(word.encode()) + self.salt) % self.dim] += 1
        return out + 0.01


def new_location(kind, request, tmp_path) -> str:
    """A new store: SQLite; PostgreSQL (with pgvector when the test server has it); or PostgreSQL whose user
    may not create the extension (`postgres-bytes`: vectors as bytes, searched in each reader's memory)."""
    if kind == "sqlite":
        return str(tmp_path / "memory.sqlite")
    url = request.getfixturevalue("postgres_url")
    return new_database(url, owner="plain") if kind == "postgres-bytes" else new_database(url)


@pytest.fixture(params=["sqlite", "postgres", "postgres-bytes"])
def location(request, tmp_path) -> str:
    return new_location(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "postgres-bytes"])
def exact_location(request, tmp_path) -> str:
    """The stores whose readers search vectors in their own memory."""
    return new_location(request.param, request, tmp_path)


def unit(uid, text, agent="a"):
    return MemoryUnit(agent_id=agent, unit_id=uid, source_id=uid.split("#")[0], text=text, ts="2026-01-0%sT00:00:00Z"
                      % (1 + len(uid) % 9))


def batch(node_id, children, text, replaces=(), agent="a"):
    return SummaryNode(agent_id=agent, node_id=node_id, kind="batch", level=1, children=list(children), text=text,
                       item_count=len(children), model="m", replaces=list(replaces))


def as_vector(stored):
    """A stored vector: float32 bytes, or pgvector's text form on PostgreSQL with the extension."""
    if stored is None or isinstance(stored, (bytes, memoryview)):
        return None if stored is None else from_bytes(bytes(stored))
    return np.array(json.loads(stored), dtype=np.float32)


def rows_and_vectors(store):
    rows = store.connection.query(f"SELECT text, body, vector FROM {NODES}", ())
    return [(text, body, as_vector(v)) for text, body, v in rows]


def assert_gone(store, old_text):
    vector = store.embedder.passages([old_text])[0]
    for text, body, stored in rows_and_vectors(store):
        assert old_text not in text and old_text not in body
        assert stored is None or not np.allclose(stored, vector)


def test_units_are_recalled_beside_nodes_and_say_which(location):
    with open_store(location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("m1", "I adopted a beagle puppy and named it Rex."), unit("m2", "Rent is 900 EUR.")])
        hits = store.recall("a", "What did I name the beagle puppy?", k=2)
        assert hits[0].kind == "unit" and hits[0].node_id == "m1" and hits[0].covered_by is None
        assert store.agents() == ["a"] and store.nodes("a") == []
        store.upsert([batch("batch-1", ["m1", "m2"], "A beagle called Rex; rent 900 EUR.")])
        hits = {h.node_id: h for h in store.recall("a", "beagle Rex", k=2, diversity=0)}  # (relevance alone)
        assert {(h.kind, h.node_id) for h in hits.values()} == {("unit", "m1"), ("batch", "batch-1")}
        assert (hits["m1"].covered_by == "batch-1"
                and hits["m1"].first_ts == hits["m1"].last_ts == "2026-01-03T00:00:00Z")
        assert "covered_by" in hits["m1"].model_dump() and "covered_by" not in hits["batch-1"].model_dump()
        found = store.recall("a", "beagle Rex", k=5, mode="keyword", diversity=0)
        assert {h.node_id for h in found} == {"m1", "batch-1"}
        [shown] = store.recall("a", "beagle Rex", k=5, mode="keyword")  # (distinct memory: one fact, one result)
        assert {shown.node_id, *shown.folds} == {"m1", "batch-1"}
        assert store.recall("a", "Rent EUR", k=1, mode="vector")[0].node_id == "m2"
        assert [(u.unit_id, c) for u, c in store.units("a")] == [("m1", "batch-1"), ("m2", "batch-1")]


def test_update_delete_and_forget_leave_no_row_and_no_vector(location):
    with open_store(location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("m1", "Alice paid 300 EUR for the boat."), unit("m2", "Bob moved to Lisbon."),
                            unit("m3", "Carol likes green tea.")])
        store.upsert([batch("batch-1", ["m1", "m2", "m3"], "Alice paid 300 EUR for the boat; Bob moved to Lisbon; "
                            "Carol likes green tea.")])
        # an update of m1: its new text, and a batch node without the old one
        store.upsert_units([unit("m1", "Alice paid 350 EUR for the yacht.")])
        store.upsert([batch("batch-1b", ["m1", "m2", "m3"], "Alice paid 350 EUR for the yacht; Bob moved to Lisbon; "
                            "Carol likes green tea.", replaces=["batch-1"])])
        assert_gone(store, "Alice paid 300 EUR for the boat.")
        # a deletion of m2: the recomputed batch node does not list it
        store.upsert([batch("batch-1c", ["m1", "m3"], "Alice paid 350 EUR for the yacht; Carol likes green tea.",
                            replaces=["batch-1b"])])
        assert_gone(store, "Bob moved to Lisbon.")
        assert [u.unit_id for u, _ in store.units("a")] == ["m1", "m3"]
        assert all(v is not None for _, _, v in rows_and_vectors(store))  # every live row is embedded
        # a unit accepted after the forget's batch nodes, not yet in any: it stays
        store.upsert_units([unit("m9", "Dave bought a kayak.")])
        # a forget: an empty global replaces every node
        store.upsert([SummaryNode(agent_id="a", node_id="global-v2", kind="global", level=1, text="", item_count=0,
                                  children=[], model="m", version=2, replaces=["batch-1c"])])
        assert_gone(store, "Alice paid 350 EUR for the yacht.")
        assert_gone(store, "Carol likes green tea.")
        assert [u.unit_id for u, _ in store.units("a")] == ["m9"]
        store.delete_units("a", ["m9"])
        assert_gone(store, "Dave bought a kayak.")
        assert store.recall("a", "kayak yacht tea Lisbon boat") == []


def test_a_store_written_with_one_model_refuses_recall_with_another(location):
    with open_store(location, create=True, embedder=Hashed(salt=0)) as store:
        store.upsert_units([unit("m1", "Rex is a beagle.")])
    with open_store(location, embedder=Hashed(salt=1)) as reader:
        with pytest.raises(StoreError, match="embedding model hashed-0 .* not hashed-1"):
            reader.recall("a", "beagle")
        assert reader.recall("a", "beagle", mode="keyword")[0].node_id == "m1"
    with open_store(location) as plain:
        assert plain.recall("a", "beagle")[0].node_id == "m1"  # no embedder: keyword
        with pytest.raises(StoreError, match="needs an embedding model"):
            plain.recall("a", "beagle", mode="vector")
    with open_store(location, create=True, embedder=Hashed(salt=2)) as writer, pytest.raises(StoreError):
        writer.upsert_units([unit("m2", "Rex likes walks.")])


def test_sqlite_and_postgres_give_the_same_top_results(tmp_path, postgres_url):
    people = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank"]
    units = [unit(f"{p}-{i}", f"{p} {fact}") for p in people for i, fact in enumerate(
        ["paid 300 EUR for the boat.", "moved to Lisbon last spring.", "is allergic to peanuts.",
         "adopted a beagle named Rex.", "takes the allergy pills daily."])]
    results = []
    for location in (str(tmp_path / "memory.sqlite"), new_database(postgres_url)):
        with open_store(location, create=True, embedder=Hashed()) as store:
            store.upsert_units(units)
            results.append([[h.node_id for h in store.recall("a", question, k=5, mode=mode)]
                            for question in ("What is Carol allergic to?", "Where did Erin move?", "beagle Rex")
                            for mode in ("keyword", "vector", "hybrid")])
    assert results[0] == results[1]
    assert results[0][0][0] == "Carol-2"


def test_the_cli_recalls_by_mode_and_refuses_vectors_of_another_model(tmp_path, capsys):
    from flink_memory.cli import main

    location = str(tmp_path / "memory.sqlite")
    with open_store(location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("m1", "Rex is a beagle.")])
    assert main(["recall", "a", "beagle", "--store", location, "--mode", "keyword", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert '"kind":"unit"' in out and '"node_id":"m1"' in out
    # the default mode is hybrid on a store with vectors: the configured model is not the store's
    assert main(["recall", "a", "beagle", "--store", location, "--set", "embeddings.model=nope"]) == 3
    assert "not a bundled model" in capsys.readouterr().err
    assert main(["recall", "a", "beagle", "--store", location, "--mode", "vector",
                 "--set", "embeddings.provider=none"]) == 3
    assert "needs an embedding model" in capsys.readouterr().err


def test_rows_written_without_waiting_get_their_vectors_from_the_backfill(location):
    """The job's sink writes rows and names their agents; vectors follow on a thread of their own, and
    closing the backfill leaves every row embedded."""
    from flink_memory.store.backfill import VectorBackfill

    with open_store(location, create=True) as store:
        vectors = VectorBackfill(location, Hashed())
        for k in range(5):
            store.upsert([batch(f"batch-{k}", [f"m{k}"], f"Alice paid {k} EUR for the boat.", agent=f"a{k % 2}")])
            store.upsert_units([unit(f"m{k}", f"Alice paid {k} EUR.", agent=f"a{k % 2}")])
            vectors.name([f"a{k % 2}"])
        vectors.close(timeout_s=60)
        rows = store.connection.query(f"SELECT text, vector FROM {NODES}", ())
    assert len(rows) == 10 and all(vector is not None for _, vector in rows)
    assert vectors.embedded == 10 and vectors.lag == 0


def test_the_backfill_retries_a_failing_provider_and_refuses_another_models_store(tmp_path):
    from flink_memory.store.backfill import VectorBackfill

    class Flaky(Hashed):
        def __init__(self):
            super().__init__()
            self.failures = 1

        def _embed(self, texts, query):
            if self.failures:
                self.failures -= 1
                raise RuntimeError("provider down")
            return super()._embed(texts, query)

    location = str(tmp_path / "memory.sqlite")
    with open_store(location, create=True) as store:
        vectors = VectorBackfill(location, Flaky())
        store.upsert([batch("batch-1", ["m1"], "Alice paid 300 EUR for the boat.")])
        vectors.name(["a"])
        vectors.close(timeout_s=60)
        assert vectors.error is None and vectors.embedded == 1  # the failed pass was tried again
        other = VectorBackfill(location, Hashed(salt=1))
        store.upsert([batch("batch-2", ["m2"], "Bob moved to Lisbon.")])
        other.name(["a"])
        other.close(timeout_s=60)
    assert isinstance(other.error, StoreError) and "hashed-0" in str(other.error)
    with pytest.raises(StoreError):
        other.name(["a"])  # the writer sees it: vectors of two models are never mixed


def test_a_reader_keeps_an_agents_vectors_until_a_write_moves_its_generation(exact_location):
    """The per-agent matrix is reused while nothing of the agent changed, and reloaded after any write."""
    with open_store(exact_location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("m1", "Rex is a beagle."), unit("m2", "Rent is 900 EUR.")])
        with open_store(exact_location, embedder=Hashed()) as reader:
            assert reader.recall("a", "beagle", mode="vector")[0].node_id == "m1"
            loaded = reader.recaller.vector_cache._agents["a"]
            assert reader.recall("a", "rent", mode="vector")[0].node_id == "m2"
            assert reader.recaller.vector_cache._agents["a"] is loaded  # not read again
            store.upsert_units([unit("m3", "Carol owns a kayak.")])
            assert reader.recall("a", "kayak", mode="vector")[0].node_id == "m3"
            store.delete_units("a", ["m3"])
            assert "m3" not in {h.node_id for h in reader.recall("a", "kayak", mode="vector")}


def test_an_updated_unit_survives_the_replacement_of_its_old_batch_node(location):
    """The batcher's rows and the merger's nodes reach the store on two streams: the update of a unit can be
    stored before the node that replaces its old batch without it. The new text must not leave with the
    units that node dropped."""
    with open_store(location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("fact", "Zorbatin paid 4711 EUR."), unit("m1", "Rex is a beagle.")])
        store.upsert([batch("batch-1", ["fact", "m1"], "Zorbatin paid 4711; Rex.")])
        store.upsert_units([unit("fact", "Zorbatin paid 5822 EUR, corrected.")])  # the update, first
        store.upsert([batch("batch-1-r1", ["m1"], "Rex.", replaces=["batch-1"])])  # its old batch, without it
        assert "5822" in store.recall("a", "Zorbatin paid", k=1, mode="keyword")[0].text
        store.upsert([batch("batch-2", ["fact"], "Zorbatin paid 5822.")])  # its new batch
        units = [h for h in store.recall("a", "Zorbatin paid", k=3, mode="keyword") if h.kind == "unit"]
        assert [(h.node_id, h.covered_by) for h in units] == [("fact", "batch-2")]
