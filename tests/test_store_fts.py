"""SQLite's full-text search per agent: the agent's token and the question's terms in one MATCH, ids that
the stemmer or the tokenizer could confuse kept apart, a store indexed by text only read as before and
migrated by the next writer, and which rows a match of more than the candidate limit keeps."""

import sqlite3

from flink_memory.records import MemoryUnit
from flink_memory.store import open_store
from flink_memory.store.rules import query_terms
from flink_memory.store.schema import FTS, NODES
from flink_memory.store.sqlite import FTS_CONTENT, agent_token, replace_fts

# ids that share a porter stem ("ab", "abed"), a word and its plural, punctuation, quotes and non-ASCII
AGENTS = ["ab", "abed", "boat", "boats", 'a "quoted" id', "agent-0", "élan", "日本", ""]

# the full-text index of a store written before the agent column (text only)
TEXT_ONLY = [
    f"CREATE VIRTUAL TABLE {FTS} USING fts5(text, content='{NODES}', content_rowid='id', "
    "tokenize='porter unicode61')",
    f"CREATE TRIGGER {NODES}_ai AFTER INSERT ON {NODES} BEGIN "
    f"INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END",
    f"CREATE TRIGGER {NODES}_ad AFTER DELETE ON {NODES} BEGIN "
    f"INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text); END",
    f"CREATE TRIGGER {NODES}_au AFTER UPDATE OF text ON {NODES} BEGIN "
    f"INSERT INTO {FTS} ({FTS}, rowid, text) VALUES ('delete', old.id, old.text); "
    f"INSERT INTO {FTS} (rowid, text) VALUES (new.id, new.text); END",
]


def unit(agent, uid, text):
    return MemoryUnit(agent_id=agent, unit_id=uid, source_id=uid, text=text, ts="2026-01-01T00:00:00Z")


def write(store):
    for agent in AGENTS:
        store.upsert_units([unit(agent, "u1", f"the boat of {agent or 'nobody'} sails at dawn"),
                            unit(agent, "u2", "a boat and a harbour"), unit(agent, "u3", "nothing to see")])


def recalled(store):
    return {agent: [(h.node_id, h.text, h.score) for h in store.recall(agent, "boat dawn", k=5, mode="keyword")]
            for agent in AGENTS}


def test_the_agent_token_is_what_sqlite_computes():
    db = sqlite3.connect(":memory:")
    for agent in AGENTS:
        assert db.execute("SELECT hex(?) || '0'", (agent,)).fetchone()[0] == agent_token(agent)


def test_each_agent_recalls_its_own_rows_only(tmp_path):
    with open_store(str(tmp_path / "m.sqlite"), create=True) as store:
        write(store)
        assert store.connection.per_agent
        found = recalled(store)
        store.delete_units("abed", ["u1"])
        after = store.recall("abed", "boat dawn", k=5, mode="keyword")
        store.upsert_units([unit("ab", "u2", "a raft at dawn")])
        changed = store.recall("ab", "raft", k=5, mode="keyword")
    for agent in AGENTS:
        assert [key for key, _, _ in found[agent]] == ["u1", "u2"], agent
        assert agent in found[agent][0][1] or not agent
    assert [h.node_id for h in after] == ["u2"]
    assert [h.node_id for h in changed] == ["u2"]


def test_a_text_only_index_is_read_as_before_and_migrated_by_a_writer(tmp_path):
    path = str(tmp_path / "m.sqlite")
    open_store(path, create=True).close()
    db = sqlite3.connect(path, isolation_level=None)
    for name in ("ai", "ad", "au"):
        db.execute(f"DROP TRIGGER {NODES}_{name}")
    db.execute(f"DROP TABLE {FTS}")
    db.execute(f"DROP VIEW {FTS_CONTENT}")
    for statement in TEXT_ONLY:
        db.execute(statement)
    db.close()
    with open_store(path, create=False) as reader:  # opened before any writer of this release
        assert not reader.connection.per_agent
        with open_store(path, create=True) as writer:
            assert writer.connection.per_agent  # migrated (empty), then written through the new triggers
            write(writer)
            expected = recalled(writer)
        assert recalled(reader) == expected  # the old query still reads the migrated index
    db = sqlite3.connect(path, isolation_level=None)
    replace_fts(db, TEXT_ONLY)  # (back to a store of the release before)
    db.close()
    with open_store(path) as old:
        assert not old.connection.per_agent
        assert recalled(old) == expected
    with open_store(path, create=True) as migrated:
        assert migrated.connection.per_agent
        assert recalled(migrated) == expected
        assert migrated.connection.fetch(f"INSERT INTO {FTS} ({FTS}) VALUES ('integrity-check')", ()) == []


def test_a_match_over_the_limit_keeps_the_rows_holding_rarer_and_more_terms_then_the_newest(tmp_path):
    with open_store(str(tmp_path / "m.sqlite"), create=True) as store:
        store.upsert_units([unit("a", f"c{i}", f"common filler {i}") for i in range(20)])
        store.upsert_units([unit("a", f"o{i}", f"extra filler {i}") for i in range(10)])
        store.upsert_units([unit("a", "r1", "rare common extra"), unit("a", "r2", "rare alone"),
                            unit("a", "s1", "scarce common")])
        store.upsert_units([unit("a", f"co{i}", f"common extra {i}") for i in range(4)])
        store.upsert_units([unit("b", f"x{i}", "rare scarce common extra") for i in range(10)])  # another agent

        def keys(question, limit):
            return [row[0].removeprefix("unit:") for row in store.search.matching("a", query_terms(question), limit)]

        assert sorted(keys("rare scarce", 5)) == ["r1", "r2", "s1"]  # at most `limit`: every match
        # rare (2 rows) and scarce (1 row) are under the limit, common (26) and extra (15) over it: the rows
        # of the rarer terms by how many terms they hold (r1 3, s1 2, r2 1), then rows holding both common
        # terms, newest first (r1 is taken already)
        assert keys("rare scarce common extra", 5) == ["r1", "s1", "r2", "co3", "co2"]
        assert keys("rare scarce", 2) == ["s1", "r2"]  # as many terms: the rarer term's rows, then the newest
        # only common terms: those holding all of them first, then any, newest first
        assert keys("common extra", 6) == ["co3", "co2", "co1", "co0", "r1", "s1"]
        assert keys("common", 3) == ["co3", "co2", "co1"]
