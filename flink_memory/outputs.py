"""Reading a run's output directory as plain Python: the committed records of summaries/, manifests/ and
dead-letters/, and each agent's latest global summary. Benchmarks, tests and the run report read outputs
through this module, so none of them needs the CLI (or PyFlink) to do it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_outputs(output_dir: str) -> dict[str, list[dict[str, Any]]]:
    """Committed output records (in-progress part files are hidden and skipped). `output_dir`: a path, or a
    URL the store applier reads too (file://, s3://: flink_memory.store.log_location)."""
    if "://" in output_dir:
        return _read_remote(output_dir)
    found: dict[str, list[dict[str, Any]]] = {}
    for name in ("summaries", "manifests", "dead-letters"):
        rows: list[dict[str, Any]] = []
        folder = Path(output_dir) / name
        for path in sorted(folder.glob("*")) if folder.exists() else []:
            if path.name.startswith(".") or not path.is_file():
                continue
            rows.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        found[name] = rows
    return found


def _read_remote(output: str) -> dict[str, list[dict[str, Any]]]:
    from flink_memory.store.log_location import LogLocation

    found: dict[str, list[dict[str, Any]]] = {}
    for name in ("summaries", "manifests", "dead-letters"):
        folder = LogLocation(output, name)
        rows: list[dict[str, Any]] = []
        for file in sorted(folder.committed(), key=lambda f: f.name):
            text = folder.read_bytes(file.name).decode("utf-8")
            rows.extend(json.loads(line) for line in text.splitlines() if line.strip())
        found[name] = rows
    return found


def latest_globals(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each agent's global node with the highest version: its current memory, by agent id."""
    best: dict[str, dict[str, Any]] = {}
    for node in summaries:
        if node["kind"] == "global" and node["version"] > best.get(node["agent_id"], {}).get("version", 0):
            best[node["agent_id"]] = node
    return best
