"""The functional core loads no I/O SDK: every module outside `llm/`, `flink/` and the CLI, imported alone in
a fresh interpreter, leaves `openai`, `httpx` and `pyflink` out of `sys.modules`.

Modules are found by walking the package, so a new module is covered without editing this test. Each one is
imported in its own interpreter (run in parallel), since a module imported earlier would hide the imports of
the next; a failure names the lines of flink_memory that pulled the SDK in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path

FORBIDDEN = ("openai", "httpx", "pyflink")
# the I/O edges, free to import them: the LLM client and servers, the Flink shell, the command line, the Flink
# Agents shell (flink-agents imports pyflink and httpx; it installs in its own environment: docs/flink-agents.md)
EDGES = ("flink_memory.llm", "flink_memory.flink", "flink_memory.cli", "flink_memory.agents.vector_store",
         "flink_memory.agents.actions", "flink_memory.agents.example", "flink_memory.agents.mcp",
         "flink_memory.agents.pipeline", "flink_memory.agents.long_term_memory")

# Imports one module and prints, for each forbidden package it loaded, the flink_memory lines on the stack
# when that package was first looked up (the import chain to move).
CHILD = r"""
import importlib, json, sys, traceback
forbidden = set(sys.argv[2].split(","))
chains = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in forbidden and top not in chains:
            chains[top] = [f"{f.filename}:{f.lineno} {f.line}" for f in traceback.extract_stack()[:-1]
                           if "flink_memory" in f.filename]
        return None
sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
print(json.dumps({top: chains.get(top, []) for top in sorted(forbidden) if top in sys.modules}))
"""


def package_root() -> Path:
    spec = find_spec("flink_memory")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def core_modules(root: Path) -> list[str]:
    """Every importable module under flink_memory except the I/O edges (and `__main__`, which runs a program)."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = ["flink_memory", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if parts[-1] == "__main__" or any(name == edge or name.startswith(edge + ".") for edge in EDGES):
            continue
        names.append(name)
    return names


def import_alone(module: str, env: dict[str, str]) -> tuple[str, str | None]:
    """(module, None) when it loads none of FORBIDDEN, else (module, what it loaded and through which lines)."""
    done = subprocess.run([sys.executable, "-c", CHILD, module, ",".join(FORBIDDEN)], env=env,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return module, f"import failed:\n{done.stderr[-2000:]}"
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    if not loaded:
        return module, None
    return module, "; ".join(f"{top} via {' -> '.join(chain) or '?'}" for top, chain in loaded.items())


def test_core_modules_load_no_io_sdk():
    root = package_root()
    modules = core_modules(root)
    assert {"flink_memory.budgets", "flink_memory.stages.batcher", "flink_memory.tokens.counter",
            "flink_memory.agents.core", "flink_memory.agents.memory"} <= set(modules)
    env = dict(os.environ)  # the child imports the same flink_memory as this process
    env["PYTHONPATH"] = os.pathsep.join([str(root.parent), *filter(None, [env.get("PYTHONPATH")])])
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda module: import_alone(module, env), modules))
    offending = {module: problem for module, problem in results if problem}
    assert not offending, "\n".join(f"{module}: {problem}" for module, problem in offending.items())


def imports_of(root: Path) -> dict[str, set[str]]:
    """Each module of flink_memory and the flink_memory modules it imports (anywhere in it, lazy imports too,
    except those only a type checker reads)."""
    import ast

    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["flink_memory", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                       for node in ast.walk(block)}
        found = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                             else node.module for alias in node.names)
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def test_no_module_imports_itself_through_others():
    """The package's imports form no circle (docs/architecture.md, Layers): a circle would tie modules that
    must change together and load in an order that depends on who imports first."""
    graph = imports_of(package_root())
    assert {"flink_memory.topology", "flink_memory.stages.driver"} <= set(graph)
    index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, circles
