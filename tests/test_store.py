"""The live-memory store on SQLite and on a real PostgreSQL: idempotent upserts, liveness by `replaces` in any
arrival order, the read API, recall on natural questions, concurrent writers and readers."""

import json
import multiprocessing
import random
import sqlite3
import sys
from pathlib import Path

import pytest
from pgserver import new_database

from flink_memory.cli.display import tree_lines
from flink_memory.records import SummaryNode
from flink_memory.store import StoreError, StoreNotFound, live_view, open_store
from flink_memory.store.rules import (
    SPECIFICITY,
    fts5_query,
    query_terms,
    specificity_steps,
    tsquery_term,
    walk_tree,
)
from flink_memory.store.schema import META


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "memory.sqlite")
    return new_database(request.getfixturevalue("postgres_url"))


def node(node_id, text="", agent="a", kind=None, level=None, children=(), version=None, replaces=(), items=1):
    kind = kind or node_id.split("-")[0]
    level = level if level is not None else {"batch": 1, "merge": 2, "global": 3}[kind]
    if kind == "global" and version is None:
        version = int(node_id.rsplit("v", 1)[1])
    return SummaryNode(agent_id=agent, node_id=node_id, kind=kind, level=level, children=list(children),
                       text=text or f"text of {node_id}", item_count=items, model="m", version=version,
                       replaces=list(replaces), first_ts="2026-01-01T00:00:00Z", last_ts="2026-01-02T00:00:00Z")


def changing_changelog(agent="a"):
    """A changelog with two recomputed paths, a chain of replacements and a forgotten-then-refilled memory."""
    return [
        node("batch-1", "Alice paid 300 EUR for the boat.", agent, children=["m1", "m2"]),
        node("batch-2", "Bob moved to Lisbon.", agent, children=["m3"]),
        node("merge-1", "Alice paid; Bob moved.", agent, children=["batch-1", "batch-2"]),
        node("global-v1", "Alice and Bob.", agent, children=["merge-1"]),
        # m2 deleted: batch-1 recomputed, its path redone
        node("batch-1b", "Alice paid 300 EUR.", agent, children=["m1"], replaces=["batch-1"]),
        node("merge-1b", "Alice paid 300; Bob moved.", agent, children=["batch-1b", "batch-2"], replaces=["merge-1"]),
        node("global-v2", "Alice paid, Bob moved.", agent, children=["merge-1b"], replaces=["global-v1"]),
        # m1 corrected: recomputed again (a chain: batch-1 -> batch-1b -> batch-1c)
        node("batch-1c", "Alice paid 350 EUR.", agent, children=["m1"], replaces=["batch-1b"]),
        node("merge-1c", "Alice paid 350; Bob moved.", agent, children=["batch-1c", "batch-2"],
             replaces=["merge-1b"]),
        node("global-v3", "Alice paid 350, Bob moved.", agent, children=["merge-1c"], replaces=["global-v2"]),
        node("batch-3", "Carol joined.", agent, children=["m4"]),
    ]


def stored(store, agent="a"):
    return {(n.agent_id, n.node_id): n for n in store.nodes(agent)}


# --- the rules in plain Python ---------------------------------------------------------------------------------


def test_query_terms_drop_stop_words_and_every_syntax_character():
    assert query_terms("What did Alice pay for the boat?") == ["alice", "pay", "boat"]
    assert query_terms('"boat" AND x* NEAR(a b) -c:d ^e \'f\' g\\h & | ! <-> {i} x_y Ünïcode boat') == [
        "boat", "x", "near", "b", "c", "d", "e", "f", "g", "h", "y", "ünïcode"]
    assert query_terms("What is it, and who was there?") == []
    assert fts5_query(["alice", "boat"]) == '"alice" OR "boat"'
    assert tsquery_term("o'brien") == "'o''brien'"


def test_specificity_steps_put_globals_above_merges_of_their_level():
    assert specificity_steps("batch", 1) == 0
    assert specificity_steps("merge", 2) == 1 and specificity_steps("merge", 3) == 2
    assert specificity_steps("global", 2) == 2  # a global over batch nodes is less specific than any merge


def test_live_view_follows_replaces_in_any_order():
    changelog = changing_changelog()
    expected = {"batch-1c", "batch-2", "merge-1c", "global-v3", "batch-3"}
    rng = random.Random(3)
    for _ in range(20):
        rng.shuffle(changelog)
        assert {nid for _, nid in live_view(changelog)} == expected


# --- the store -----------------------------------------------------------------------------------------------


def test_upserts_are_idempotent_and_a_replay_rewrites_the_same_rows(location):
    nodes = [node("batch-1", "first text"), node("batch-2"), node("global-v1", children=["batch-1", "batch-2"])]
    with open_store(location, create=True) as store:
        assert store.upsert(nodes) == 3
        first = stored(store)
        assert store.upsert(nodes) == 3 and store.upsert(reversed(nodes)) == 3  # a replay, in another order
        assert stored(store) == first and len(store.nodes("a")) == 3
        again = node("batch-1", "first text, written again by the replay")
        store.upsert([again.model_dump_json()])  # the sink's input: summaries/ JSON lines
        assert store.node("a", "batch-1") == again and len(store.nodes("a")) == 3
        assert [h.node_id for h in store.recall("a", "replay written")] == ["batch-1"]  # the index follows
        assert store.recall("a", "first text") and store.upsert([]) == 0


@pytest.mark.parametrize("one_call", [False, True])
def test_liveness_by_replaces_in_any_arrival_order(location, one_call):
    rng = random.Random(11)
    with open_store(location, create=True) as store:
        for attempt in range(5):
            agent = f"agent-{attempt}"
            changelog = changing_changelog(agent)
            rng.shuffle(changelog)
            if one_call:
                store.upsert(changelog)
            else:
                for n in changelog:
                    store.upsert([n])
            store.upsert(changelog[: len(changelog) // 2])  # a replay of the first half changes nothing
            assert stored(store, agent) == live_view(changelog)
            assert store.current(agent).node_id == "global-v3"
            assert store.node(agent, "batch-1") is None and store.node(agent, "batch-1b") is None
            assert store.children(agent, "merge-1c") == [store.node(agent, "batch-1c"), store.node(agent, "batch-2")]
            # the replaced texts have left the store: nothing recalls them
            assert [h.node_id for h in store.recall(agent, "How much did Alice pay?", k=10)
                    if "300" in h.text] == []


def test_current_is_the_live_global_with_the_highest_version(location):
    with open_store(location, create=True) as store:
        assert store.current("a") is None and store.agents() == []
        store.upsert([node("global-v2", "two"), node("batch-1"), node("global-v1", "one")])
        store.upsert([node("batch-9", agent="b")])
        assert store.current("a").text == "two" and store.current("b") is None
        assert store.agents() == ["a", "b"]
        # a forgotten agent: an empty global replaces everything written before
        store.upsert([node("global-v3", "", kind="global", level=1, items=0, version=3,
                           replaces=["global-v1", "global-v2", "batch-1"])])
        forgotten = store.current("a")
        assert forgotten.node_id == "global-v3" and forgotten.item_count == 0 and store.nodes("a") == [forgotten]


def test_children_in_order_and_batch_children_are_units(location):
    with open_store(location, create=True) as store:
        store.upsert([node("batch-2"), node("batch-1", children=["u1", "u2"]), node("batch-3"),
                      node("merge-1", children=["batch-3", "batch-1", "batch-2"]),
                      node("global-v1", children=["merge-1", "merge-absent"])])
        assert [c.node_id for c in store.children("a", "merge-1")] == ["batch-3", "batch-1", "batch-2"]
        assert [c.node_id for c in store.children("a", "global-v1")] == ["merge-1"]  # not written: left out
        assert store.children("a", "batch-1") == []  # its children are memory units
        assert store.children("a", "nope") == [] and store.children("b", "merge-1") == []
        tree = walk_tree(store.current("a"), lambda n: store.children("a", n.node_id))
        assert [(depth, n.node_id, missing) for depth, n, missing in tree] == [
            (0, "global-v1", 1), (1, "merge-1", 0), (2, "batch-3", 0), (2, "batch-1", 0), (2, "batch-2", 0)]
        lines = tree_lines(tree, width=12)
        assert lines[0] == ("global-v1 (global v1, level 3, 1 units, 2026-01-01T00:00:00Z .. 2026-01-02T00:00:00Z) "
                            "[1 children not stored]: text of g...")
        assert lines[3].startswith("    batch-1 (batch, level 1,")


def facts_and_distractors(agent="a"):
    subjects = ["Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan"]
    nodes = [node(f"batch-{i}", f"{s} paid {100 + i} EUR for the car. {s} moved to Porto.", agent)
             for i, s in enumerate(subjects)]
    nodes.append(node("batch-8", "Alice paid 300 EUR for the boat on Monday.", agent))
    nodes.append(node("merge-1", "Bob, Carol and Dave paid for cars; Erin moved.", agent,
                      children=[f"batch-{i}" for i in range(4)]))
    nodes.append(node("global-v1", "Eight people paid for cars and moved; Alice bought a boat.", agent,
                      children=["merge-1"] + [f"batch-{i}" for i in range(4, 9)]))
    return nodes


def test_recall_answers_a_natural_question_despite_stop_words_and_distractors(location):
    with open_store(location, create=True) as store:
        store.upsert(facts_and_distractors())
        store.upsert(facts_and_distractors(agent="other"))
        hits = store.recall("a", "What did Alice pay for the boat?", k=3)
        assert hits[0].node_id == "batch-8" and "300 EUR" in hits[0].text
        assert hits[0].model_dump().keys() == {"node_id", "kind", "level", "text", "score", "first_ts", "last_ts"}
        assert hits[0].first_ts == "2026-01-01T00:00:00Z" and hits[0].kind == "batch" and hits[0].level == 1
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True) and hits[-1].score > 0
        assert len(store.recall("a", "paid", k=4)) == 4 and store.recall("a", "the of what") == []
        assert store.recall("nobody", "Alice boat") == [] and store.recall("a", "Alice", k=0) == []


def test_recall_prefers_the_most_specific_level_at_equal_relevance(location):
    text = "Alice paid 300 EUR for the boat."
    with open_store(location, create=True) as store:
        store.upsert([node("global-v1", text, children=["merge-1"]), node("merge-1", text, children=["batch-1"]),
                      node("batch-1", text), node("batch-2", "Alice paid 300 EUR for the boat, the boat, the boat."),
                      *[node(f"batch-{i}", f"Person {i} bought a car.") for i in range(3, 9)]])
        hits = {h.node_id: h for h in store.recall("a", "Alice's boat", k=10)}
        order = [h for h in hits if h != "batch-2"]
        assert order == ["batch-1", "merge-1", "global-v1"]
        # the documented rule: equal relevance, scaled by 0.8 per step above the units
        assert SPECIFICITY == 0.8
        assert hits["merge-1"].score == pytest.approx(hits["batch-1"].score * 0.8, rel=1e-4)
        assert hits["global-v1"].score == pytest.approx(hits["batch-1"].score * 0.8 ** 3, rel=1e-4)
        # not absolute: a merge that matches far better than a batch node still comes first
        store.upsert([node("merge-2", "Alice boat. Alice boat. Alice boat.", children=["batch-3"]),
                      node("batch-9", "A boat, among many other things that were discussed at length that day.")])
        ranked = [h.node_id for h in store.recall("a", "Alice's boat", k=10)]
        assert ranked.index("merge-2") < ranked.index("batch-9")


SYNTAX = ['"', '"boat', "boat*", "NEAR(alice boat)", "alice AND OR NOT boat", "-boat", "text:alice", "^alice",
          "alice'); DROP TABLE x; --", "a & b | !c <-> (d)", "{alice boat}", "\\", "'", "''", "%s %(x)s ?",
          "ä\u0000b", ""]


def test_query_syntax_in_a_question_is_only_text(location):
    with open_store(location, create=True) as store:
        store.upsert(facts_and_distractors())
        for query in SYNTAX:
            assert isinstance(store.recall("a", query), list), query
        assert [h.node_id for h in store.recall("a", 'alice\'s "boat" AND (NOT car*)', k=1)] == ["batch-8"]
        assert len(store.nodes("a")) == 11


def test_a_reader_never_creates_a_store(tmp_path, location):
    missing = tmp_path / "nothing" / "memory.sqlite"
    with pytest.raises(StoreNotFound, match="no memory store"):
        open_store(str(missing))
    assert not missing.parent.exists()
    if not location.startswith("postgresql://"):
        sqlite3.connect(location).close()  # an empty SQLite file
    with pytest.raises(StoreNotFound, match="holds no flink-memory store"):
        open_store(location)  # an empty database, or an empty SQLite file
    open_store(location, create=True).close()
    open_store(location).close()
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("just text, and more than a header's worth of it " * 5)
    with pytest.raises(StoreError, match="not a readable SQLite database"):
        open_store(str(not_sqlite))


def test_a_store_of_another_schema_version_is_refused(tmp_path):
    path = str(tmp_path / "memory.sqlite")
    open_store(path, create=True).close()
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE {META} SET value = '2'")
    with pytest.raises(StoreError, match="schema version 2 .* not readable by this release"):
        open_store(path)


WRITERS, NODES_EACH = 3, 40


def write_agent(location: str, writer: int) -> None:
    with open_store(location, create=True) as store:
        for k in range(NODES_EACH):
            store.upsert([node(f"batch-{k}", f"writer {writer} node {k}", agent=f"agent-{writer}"),
                          node(f"global-v{k + 1}", f"global {k}", agent=f"agent-{writer}",
                               replaces=[f"global-v{k}"] if k else [])])


def test_concurrent_writers_in_processes_while_a_reader_reads(location):
    open_store(location, create=True).close()  # the schema exists, as the first subtask makes it
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=write_agent, args=(location, w)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    seen = 0
    with open_store(location) as reader:
        while any(w.is_alive() for w in workers):
            for agent in reader.agents():  # a reader sees whole writes only: one live global per agent
                assert len([n for n in reader.nodes(agent) if n.kind == "global"]) == 1
                seen += 1
        for worker in workers:
            worker.join(timeout=120)
            assert worker.exitcode == 0
        assert reader.agents() == [f"agent-{w}" for w in range(WRITERS)]
        for w in range(WRITERS):
            assert len(reader.nodes(f"agent-{w}")) == NODES_EACH + 1
            assert reader.current(f"agent-{w}").node_id == f"global-v{NODES_EACH}"
    assert seen > 0


# --- the CLI: flink-memory show | recall -------------------------------------------------------------------------


def cli(capsys, *argv):
    from flink_memory.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_and_recall_print_the_memory(location, capsys):
    with open_store(location, create=True) as store:
        store.upsert(facts_and_distractors())
        current = store.current("a")
    code, out, err = cli(capsys, "show", "a", "--store", location)
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "a: global-v1 (global v1, level 3, 1 units, 2026-01-01T00:00:00Z .. 2026-01-02T00:00:00Z)", current.text]
    code, out, _ = cli(capsys, "show", "a", "--store", location, "--json")
    assert code == 0 and out == current.model_dump_json() + "\n"  # exactly its summaries/ line
    code, out, _ = cli(capsys, "show", "a", "--store", location, "--tree")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 11 and lines[0].startswith("global-v1 (global v1")
    assert lines[1].startswith("  merge-1 (merge, level 2") and lines[2].startswith("    batch-0 (batch, level 1")
    assert (lines[-1].startswith("  batch-8 (batch")
            and lines[-1].endswith(": Alice paid 300 EUR for the boat on Monday."))
    code, out, _ = cli(capsys, "show", "a", "--store", location, "--tree", "--json")
    assert [SummaryNode.model_validate_json(line).node_id for line in out.splitlines()] == [
        "global-v1", "merge-1", "batch-0", "batch-1", "batch-2", "batch-3", "batch-4", "batch-5", "batch-6",
        "batch-7", "batch-8"]

    code, out, err = cli(capsys, "recall", "a", "What did Alice pay for the boat?", "--store", location, "--json")
    hits = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and err == "" and 1 < len(hits) <= 5
    assert set(hits[0]) == {"node_id", "kind", "level", "text", "score", "first_ts", "last_ts"}
    assert hits[0]["node_id"] == "batch-8" and hits[0]["score"] > hits[1]["score"]
    code, out, _ = cli(capsys, "recall", "a", "paid car", "--store", location, "--k", "3")
    table = out.splitlines()
    assert code == 0 and len(table) == 4 and table[0].split()[:5] == ["#", "score", "kind", "level", "node"]
    assert table[1].split()[0] == "1" and " EUR for the car." in table[1]


def test_show_and_recall_fail_with_a_message_and_an_exit_code(tmp_path, location, capsys):
    missing = tmp_path / "none" / "memory.sqlite"
    for command in (["show", "a"], ["recall", "a", "boat"]):
        code, out, err = cli(capsys, *command, "--store", str(missing))
        assert (code, out) == (3, "") and err == f"flink-memory: no memory store at {missing}\n"
    assert not missing.parent.exists()
    with open_store(location, create=True) as store:
        store.upsert([node("batch-1", "Alice paid 300 EUR for the boat.", agent="new"),
                      node("global-v1", "", agent="gone", level=1, items=0)])
    expected = {("show", "nobody"): (4, "agent 'nobody' has no memory in"),
                ("recall", "nobody"): (4, "agent 'nobody' has no memory in"),
                ("show", "new"): (4, "agent 'new' has no global summary yet (1 live nodes; try recall)"),
                ("show", "gone"): (4, "agent 'gone' has an empty memory (global-v1: forgotten)"),
                ("recall", "gone"): (4, "agent 'gone' has an empty memory (global-v1: forgotten)"),
                ("recall", "new"): (1, "nothing in the memory of 'new' matches 'zebra'")}
    for (command, agent), (want, message) in expected.items():
        argv = [command, agent] + (["zebra"] if command == "recall" else [])
        code, out, err = cli(capsys, *argv, "--store", location)
        assert (code, out) == (want, "") and err.startswith(f"flink-memory: {message}") and "Traceback" not in err
    with open_store(location) as store:  # new input after the forget, before its next global: recall finds it
        store.upsert([node("batch-2", "Carol bought a red bicycle.", agent="gone")])
    code, out, _ = cli(capsys, "recall", "gone", "bicycle", "--store", location)
    assert code == 0 and "batch-2" in out
    with pytest.raises(SystemExit) as usage:  # (argparse's exit for a wrong command line)
        cli(capsys, "recall", "new", "boat", "--store", location, "--k", "0")
    assert usage.value.code == 2 and "--k: must be at least 1, not 0" in capsys.readouterr().err


def test_the_sample_agent_prompt_holds_the_gist_and_the_detail(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
    from agent_prompt import memory_prompt

    with open_store(str(tmp_path / "memory.sqlite"), create=True) as store:
        store.upsert(facts_and_distractors())
        prompt = memory_prompt(store, "a", "What did Alice pay for the boat?", k=2)
        empty = memory_prompt(store, "nobody", "What did Alice pay for the boat?")
    gist, detail = prompt.index("Eight people paid for cars"), prompt.index("Alice paid 300 EUR")
    assert gist < detail < prompt.index("Question: What did Alice pay for the boat?")
    assert prompt.count("\n- (") == 2 and "(nothing yet)" in empty and "- (none)" in empty


def test_the_run_report_counts_live_units_once(tmp_path):
    from flink_memory.cli.report import report

    (tmp_path / "summaries").mkdir()
    lines = [n.model_dump_json() for n in changing_changelog()]
    (tmp_path / "summaries" / "part-0").write_text("\n".join(lines) + "\n")
    # batch-1c (m1), batch-2 (m3) and batch-3 (m4) are live; batch-1 and batch-1b were replaced
    assert "memory units summarized : 3 (1 agents)" in report(str(tmp_path), 1.0)


def test_the_run_report_ends_with_the_live_tree_of_the_agent_with_the_most_merges(tmp_path):
    from flink_memory.cli.report import report

    (tmp_path / "summaries").mkdir()
    flat = [node("batch-1", "Zed met Yan.", "z", children=["u1"]),
            node("global-v1", "Zed met Yan.", "z", children=["batch-1"], level=2)]
    lines = [n.model_dump_json() for n in changing_changelog("b") + flat]
    (tmp_path / "summaries" / "part-0").write_text("\n".join(lines) + "\n")
    text = report(str(tmp_path), 1.0)
    tree = text[text.index("live tree of b (1 merges):"):text.index("  global summary of b")].splitlines()[1:]
    assert [line.split(" (")[0].strip() for line in tree] == ["global-v3", "merge-1c", "batch-1c", "batch-2"]
    assert [len(line) - len(line.lstrip()) for line in tree] == [4, 6, 8, 8]  # indented by depth
    assert "1 units, 2026-01-01T00:00:00Z .. 2026-01-02T00:00:00Z" in tree[2]


def test_the_run_report_can_end_with_one_recall_on_the_store(tmp_path):
    from servicekit import write_store

    from flink_memory.cli.report import ask
    from flink_memory.config import load_config

    store = write_store(tmp_path / "memory.sqlite")
    lines = ask(store, "alice", "What did Alice pay for the boat?", load_config(None, [], environ={}).embeddings)
    assert lines[0] == "  recall alice 'What did Alice pay for the boat?' (keyword, top 3):"
    assert "Alice paid 300 EUR for the boat." in lines[2] and " unit " in lines[2]  # the unit itself ranks first
    assert all("spare key" not in line for line in lines)  # bob's memory is not alice's
    missing = ask(str(tmp_path / "absent.sqlite"), "alice", "boat?", load_config(None, [], environ={}).embeddings)
    assert missing[0].startswith("  recall 'boat?': no memory store at")


def test_openers_of_a_new_sqlite_store_at_once_all_open_it(tmp_path):
    """A job's store sink subtasks open a new store together: the columns added to an older store's schema were
    added by each, and the second ALTER failed ("duplicate column name"), failing the job's start (issue 33:
    the restart sent the batch requests made before it again)."""
    import threading

    from flink_memory.store.sqlite import sqlite_store

    errors = []
    for trial in range(20):
        path = tmp_path / f"m{trial}.sqlite"
        barrier = threading.Barrier(3)

        def opener(path=path, barrier=barrier):
            barrier.wait()
            try:
                sqlite_store(str(path), create=True).close()
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

        threads = [threading.Thread(target=opener) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_the_store_is_composed_of_parts_that_inherit_nothing_from_each_other(tmp_path):
    """MemoryStore is a face over the parts it holds (a connection, the vectors, a writer, the log part, a reader,
    recall and the dialect's search), each made with what it needs: no part inherits another, MemoryStore
    inherits none, and no part holds a method of another or the store that holds it (issue 47)."""
    import inspect

    from flink_memory.store import MemoryStore, postgres

    assert MemoryStore.__mro__ == (MemoryStore, object)
    names = ("connection", "vectors", "writer", "log", "reader", "recaller", "search")
    with open_store(str(tmp_path / "m.sqlite"), create=True) as store:
        parts = {name: getattr(store, name) for name in names}
        for name, part in parts.items():
            others = [type(other) for other in parts.values() if other is not part]
            assert not any(isinstance(part, other) for other in others), name
            assert all(value is not store and not inspect.ismethod(value) for value in vars(part).values()), name
        assert parts["writer"].connection is parts["log"].connection is parts["recaller"].connection
    dialect = (postgres.PostgresStoreConnection, postgres.PostgresSearch, postgres.PgvectorColumn)
    assert not any(issubclass(part, other) for part in dialect for other in dialect if other is not part)
    assert all(MemoryStore not in part.__mro__ for part in dialect)
