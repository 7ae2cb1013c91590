"""Another revision of this repository checked out beside it, for benchmarks that run it against this one."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """`revision` checked out in a temporary folder (`git worktree`, detached), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="flink-memory-baseline-") as tmp:
        checkout = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), revision],
                       check=True, capture_output=True)
        try:
            yield checkout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                           capture_output=True)
