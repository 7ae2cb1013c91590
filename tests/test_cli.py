"""The CLI pays only for what a command needs: reading memory (`show`, `recall`, `--help`) loads neither
PyFlink nor the LLM client, so it starts fast and works where only the store is installed."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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
