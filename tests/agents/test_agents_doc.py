"""Every code block of docs/flink-agents.md runs, read from the doc itself (so the doc cannot drift): the Python
blocks as the files they name (`# my_agent.py`), in a directory holding a job's store (`out/memory.sqlite`) and
its followed `inbox/`; the shell blocks' make targets and scripts exist. The MCP block runs against
`flink-memory serve` from `.venv`; the composed job's block builds its job graph in a JVM (slow)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agentkit import FACTS, Service, write_store

from flink_memory.service.keys import add_key

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "flink-agents.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def python_blocks() -> dict[str, str]:
    """The Python blocks by the file name on their first line."""
    found = {}
    for block in blocks("python"):
        first = block.splitlines()[0]
        name = first.split()[1].rstrip(":") if first.startswith("# ") else ""
        assert name.endswith(".py"), f"a block names no file: {first!r}"
        found[name] = block
    return found


def run(workdir: Path, name: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, name], cwd=workdir, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def workdir(tmp_path):
    """The doc's directory: the memory job's store (two agents, facts alike) and its followed inbox."""
    (tmp_path / "out").mkdir()
    (tmp_path / "inbox").mkdir()
    store = write_store(tmp_path / "out" / "memory.sqlite")
    for name, block in python_blocks().items():
        (tmp_path / name).write_text(block)
    return tmp_path, store


def test_the_doc_has_the_blocks_this_test_runs():
    assert set(python_blocks()) == {"my_agent.py", "show_plan.py", "ltm_agent.py", "mcp_agent.py",
                                   "compose_job.py"}
    # (the other blocks: the Maven command build-jars.sh runs, and `make agents-sample` with its output, which
    # test_agents_sample.py compares)
    assert len(blocks("sh")) == 3


def test_the_vector_store_agent_recalls_its_own_memory_and_remembers_into_the_inbox(workdir):
    tmp, _ = workdir
    (tmp / "out" / "memory.sqlite").unlink()
    write_store(tmp / "out" / "memory.sqlite")
    out = run(tmp, "my_agent.py")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 2, out  # the statement and the question, each answered
    [written] = [json.loads(p.read_text()) for p in (tmp / "inbox").iterdir()]
    assert written["agent_id"] == "ana" and written["text"] == "I am allergic to peanuts."
    assert not any(fact in out for facts in FACTS.values() for fact in facts.values())  # ana has no memory yet


def test_the_plan_json_block_shows_the_resources(workdir):
    tmp, _ = workdir
    plan = json.loads(run(tmp, "show_plan.py"))
    store = plan["resource_providers"]["vector_store"]["memory"]
    assert "out/memory.sqlite" in json.dumps(store) and "inbox/" in json.dumps(store)


def test_the_long_term_memory_block_writes_the_sets_record(workdir):
    tmp, _ = workdir
    out = run(tmp, "ltm_agent.py")
    [written] = [json.loads(p.read_text()) for p in (tmp / "inbox").iterdir()]
    assert written["agent_id"] == "ana:chat_history" and written["text"] == "I moved to Porto."
    assert "'summary': None" in out  # (the job has not summarized ana's set)


def test_the_mcp_block_recalls_through_the_service(workdir):
    tmp, store = workdir
    key, _ = add_key(tmp / "keys.json", ["alice"])
    (tmp / "memory_key").write_text(key)
    service = Service(store, tmp / "keys.json", tmp / "inbox", tmp / "service.log")
    try:
        block = (tmp / "mcp_agent.py").read_text()
        assert "http://127.0.0.1:8765/mcp" in block
        # the doc's port, and its agent ana, made this test's (a free port, the store's alice)
        (tmp / "mcp_agent.py").write_text(block.replace("http://127.0.0.1:8765", service.url)
                                          .replace('"key": "ana"', '"key": "alice"')
                                          .replace("Which foods must I avoid?", "What is my dog called?"))
        out = run(tmp, "mcp_agent.py")
    finally:
        service.close()
    assert "beagle named Rex" in out and "poodle" not in out  # alice's fact, none of bob's


def test_the_shell_blocks_name_make_targets_and_scripts_that_exist():
    makefile = (ROOT / "Makefile").read_text()
    for block in blocks("sh"):
        for target in re.findall(r"^make ([\w-]+)", block, flags=re.M):
            assert re.search(rf"^{target}:", makefile, flags=re.M), target
        for script in re.findall(r"(third_party/\S+\.sh)", block):
            assert (ROOT / script).is_file(), script
    help_text = subprocess.run([str(ROOT / ".venv" / "bin" / "flink-memory"), "run", "--help"], capture_output=True,
                               text=True).stdout if (ROOT / ".venv" / "bin" / "flink-memory").exists() else None
    if help_text is not None:
        assert "--follow" in help_text and "--input" in help_text


@pytest.mark.slow
def test_the_composed_job_block_builds_its_job_graph(workdir):
    tmp, _ = workdir
    (tmp / "turns").mkdir()
    plan = json.loads(run(tmp, "compose_job.py", timeout=180))
    names = json.dumps(plan)
    assert "action-execute-operator" in names or "agent" in names.lower()


@pytest.mark.parametrize("script", ["samples/agents_memory.py", "jobs/agents_memory.py"])
def test_the_sample_and_the_job_script_import(script):
    """What ruff cannot see (a module that moved): their imports, in seconds (test_agents_sample.py runs them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main)
