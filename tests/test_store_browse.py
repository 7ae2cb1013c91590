"""The store's reads behind the browser page (SQLite and PostgreSQL): a batch node's units by id, the agent's
rows over time, parents, and the share of rows with a vector."""

from test_store_units import Hashed, batch, location, unit  # noqa: F401 (location: a fixture)

from flink_memory.records import SummaryNode
from flink_memory.store import open_store


def test_units_timeline_parents_and_vectors(location):  # noqa: F811
    with open_store(location, create=True, embedder=Hashed()) as store:
        store.upsert_units([unit("u1", "Alice paid 300 EUR."), unit("u22", "Rex is a beagle."), unit("u333", "x y")])
        store.upsert([batch("b1", ["u1", "u22"], "Alice and Rex."),
                      SummaryNode(agent_id="a", node_id="g1", kind="global", level=2, version=1, children=["b1"],
                                  text="All.", item_count=2, model="m", first_ts="2026-01-02T00:00:00Z",
                                  last_ts="2026-01-09T00:00:00Z")])
        store.upsert([batch("b1-r1", ["u1"], "Alice.", replaces=["b1"])])
        store.embed_pending(["a"])
        found = store.units_by_id("a", ["u22", "nothing", "u1"])
        assert [(u.unit_id, covered, pending) for u, covered, pending in found] == [("u1", "b1-r1", False)]
        assert [u.unit_id for u, _, _ in store.units_by_id("a", ["u333", "u1"])] == ["u333", "u1"]
        rows, total = store.timeline("a", 0, 10)
        assert total == len(rows) == 4  # u1, u333 (u22 left with b1), b1-r1, g1
        assert rows[0]["node_id"] == "g1" and {r["node_id"] for r in rows} == {"u1", "u333", "b1-r1", "g1"}
        assert next(r for r in rows if r["node_id"] == "b1-r1")["replaces"] == ["b1"]
        assert store.timeline("a", 3, 10)[0] == rows[3:]
        assert store.replaced_count("a") == 1
        assert store.parents("a") == {"u1": "b1-r1", "b1": "g1"}
        assert store.agent_vectors("a") == (4, 4)
        assert store.agent_vectors("nobody") == (0, 0)
