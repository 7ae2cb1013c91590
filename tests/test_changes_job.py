"""Memory that changes, on the MiniCluster: originals, then (many records later) an update of an item, a
grown and edited conversation, an identical re-delivery, a deletion, a deletion of an unknown id and a
forgotten agent. Checked through the changelog's live view (`replaces`): every live unit in exactly one live
batch node, item counts, superseded and deleted facts in no live node and not in the current global, new
facts present. The same again with a kill and a restore between the originals and the changes."""

import contextlib
import re
import time
from collections import Counter

import pytest
from jobkit import cli_command, kill_group, latest_checkpoint, run, spawn, wait_for, write_lines
from scripted_server import ScriptedServer

from flink_memory.outputs import latest_globals, read_outputs

pytestmark = pytest.mark.slow

SETTINGS = ("batching.max_items=4", "summarization.fan_in=2", "chunking.max_chunk_tokens=400",
            "chunking.semantic=false", "llm.max_output_tokens=256")


def name(prefix, i):
    """A capitalized word unique to (prefix, i): the scripted summarizer keeps such words."""
    return prefix.upper() + "".join(chr(97 + int(d)) for d in f"{i:03d}")


def fact(agent, i, word=None):
    return {"agent_id": agent, "id": f"m{i}", "text": f"{word or name(agent, i)} paid {i} EUR."}


def conversation(turns, edited=False):
    messages = []
    for t in range(turns):
        text = f"{name('t', t)} about the launch " + "with details " * 12
        if edited and t == 1:
            text = f"{name('t', t)} moved the launch to Harbor " + "with details " * 12
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": f"Reply{t} noted " + "and agreed " * 12})
    return {"agent_id": "a", "id": "conv", "messages": messages}


def originals():
    return ([fact("a", i) for i in range(10)] + [conversation(8)] + [fact("b", i) for i in range(6)]
            + [fact("c", i) for i in range(5)] + [fact("d", i) for i in range(150)])


def changes():
    return [fact("a", 3, word="Corrected"), conversation(12, edited=True), fact("a", 5),
            {"agent_id": "b", "id": "m2", "deleted": True}, {"agent_id": "b", "id": "nope", "deleted": True},
            {"agent_id": "c", "forget": True}]


def live(summaries):
    replaced = {(n["agent_id"], old) for n in summaries for old in n.get("replaces", [])}
    return [n for n in summaries if (n["agent_id"], n["node_id"]) not in replaced]


def check(out, all_summarized_first=True):
    """`all_summarized_first`: every changed fact was in a summary before its change (a change later in the
    same input can reach a unit whose batch call is still running: it is rebuilt without it, also correct)."""
    nodes = live(out["summaries"])
    units = Counter((n["agent_id"], u) for n in nodes if n["kind"] == "batch" for u in n["children"])
    assert all(count == 1 for count in units.values()), "a live unit is in two live batch nodes"
    updated = [m for m in out["manifests"] if m.get("replaces_input_digest")]
    assert len(updated) == 1 and updated[0]["source_id"] == "conv"
    chunks = len(updated[0]["chunks"])
    expected = Counter({("a", f"m{i}"): 1 for i in range(10)})
    expected.update({("a", f"conv#{k}"): 1 for k in range(chunks)})
    expected.update({("b", f"m{i}"): 1 for i in range(6) if i != 2})
    expected.update({("d", f"m{i}"): 1 for i in range(150)})
    assert units == expected
    current = latest_globals(out["summaries"])
    assert {a: g["item_count"] for a, g in current.items()} == {
        "a": 10 + chunks, "b": 5, "c": 0, "d": 150}
    live_text = " ".join(n["text"] for n in nodes)
    everything = " ".join(n["text"] for n in out["summaries"])
    gone = [name("a", 3), name("b", 2), name("c", 1)]  # superseded, deleted, forgotten
    assert not [fact for fact in gone if fact in live_text]
    summarized = [fact for fact in gone if fact in everything]
    assert summarized == gone if all_summarized_first else summarized, summarized
    assert "Corrected" in current["a"]["text"] and "Harbor" in live_text and name("t", 11) in live_text
    assert current["c"]["text"] == "" and [n["agent_id"] for n in nodes].count("c") == 1
    stages = Counter(d["stage"] for d in out["dead-letters"])
    assert stages == {"duplicate": 1, "change": 1}


def records_shown(log):
    """The records count of the last progress line in `log` (None before one)."""
    counts = re.findall(r"\| records (\d+) \|", log.read_text())
    return int(counts[-1]) if counts else None


def test_changes_later_in_the_same_input(tmp_path):
    with ScriptedServer() as server:
        out = run(tmp_path, originals() + changes(), server.base_url, *SETTINGS)
    check(out, all_summarized_first=False)


def test_changes_after_a_kill_and_a_restore(tmp_path):
    inbox, output = tmp_path / "inbox", tmp_path / "output"
    write_lines(inbox / "part-0.jsonl", originals())
    with ScriptedServer() as server:
        first = spawn(cli_command(inbox, output, server, tmp_path / "journal.sqlite", *SETTINGS,
                                  "batching.flush_after_s=1", "summarization.global_refresh_s=1",
                                  args=("--follow", "--progress-every", "1")), tmp_path / "first.log")
        try:
            wait_for(lambda: len(read_outputs(str(output))["summaries"]) >= 40, timeout_s=180)
            # the input is quiet now: the progress line counts every record read, not those before a flush
            wait_for(lambda: records_shown(tmp_path / "first.log") == len(originals()), timeout_s=15)
            time.sleep(2)  # a checkpoint after the originals were summarized
        finally:
            kill_group(first)
        checkpoint = latest_checkpoint(output)
        write_lines(inbox / ".part-1.jsonl", changes()).rename(inbox / "part-1.jsonl")
        second = spawn(cli_command(inbox, output, server, tmp_path / "journal.sqlite", *SETTINGS,
                                   "batching.flush_after_s=1", "summarization.global_refresh_s=1",
                                   args=("--follow", "--restore", str(checkpoint))), tmp_path / "second.log")
        try:
            def settled():
                """The committed outputs hold every change (on a loaded machine the last global of an agent
                can come a refresh after another's: waiting for some of them left the rest unsettled)."""
                try:
                    check(read_outputs(str(output)))
                except (AssertionError, KeyError):
                    return False
                return True

            with contextlib.suppress(AssertionError):  # (not in time: the check below says what differs)
                wait_for(settled, timeout_s=180)
            time.sleep(3)  # the last global refreshes and a checkpoint
        finally:
            kill_group(second)
    check(read_outputs(str(output)))
