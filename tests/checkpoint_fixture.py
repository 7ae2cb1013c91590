"""Writes tests/data/state-<STATE_VERSION>/: a retained checkpoint of this checkout's job, for the test that
restores it with later code (tests/test_recovery.py). Run it when the state layout version changes:

    python tests/checkpoint_fixture.py

The recovery workload is followed from ROOT/input (FileSource and FileSink state name absolute paths, so the
test copies the fixture back to ROOT) with slow plans, and the process is killed while conversations are still
being planned: the planner holds queued conversations, the batcher partial batches and the merger its trees.
Only the latest checkpoint is kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobkit import cli_command, kill_group, latest_checkpoint, slow_script, spawn, wait_for, write_lines  # noqa: E402
from scripted_server import ScriptedServer  # noqa: E402
from test_recovery import SETTINGS, workload  # noqa: E402

from flink_memory.outputs import read_outputs  # noqa: E402
from flink_memory.state_layout import STATE_VERSION  # noqa: E402

ROOT = Path(f"/tmp/flink-memory-state-{STATE_VERSION}")
FIXTURE = Path(__file__).resolve().parent / "data" / f"state-{STATE_VERSION}"


def main() -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    input_dir = write_lines(ROOT / "input" / "part-0.jsonl", workload()).parent
    output = ROOT / "output"
    with ScriptedServer(lambda body: slow_script(body, planner_s=2.0)) as server:
        job = spawn(cli_command(input_dir, output, server, None, *SETTINGS, "batching.flush_after_s=600",
                                "job.recheck_s=2", args=("--follow",)), ROOT / "job.log")
        try:
            wait_for(lambda: len(read_outputs(str(output))["manifests"]) >= 2 and latest_checkpoint(output),
                     timeout_s=240, every_s=0.1)
        finally:
            kill_group(job)
    kept = latest_checkpoint(output)
    assert kept is not None
    for checkpoint in kept.parent.glob("chk-*"):
        if checkpoint != kept:
            shutil.rmtree(checkpoint)
    (ROOT / "job.log").unlink()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    shutil.rmtree(FIXTURE, ignore_errors=True)
    shutil.copytree(ROOT, FIXTURE)
    (FIXTURE / "README.md").write_text(
        f"A retained checkpoint written by commit {commit} (thread mode, state layout version {STATE_VERSION}) with\n"
        "`python tests/checkpoint_fixture.py`: the recovery workload of `tests/test_recovery.py` followed from\n"
        f"`{ROOT}/input`, killed while conversations were still being planned. The restore test copies this\n"
        f"folder to `{ROOT}` (FileSource and FileSink state name absolute paths) before restoring `{kept.name}`.\n")
    print(f"{FIXTURE}: {kept.name} of commit {commit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
