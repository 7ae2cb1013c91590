"""The versioned JSON envelope of operator state, apart from PyFlink so the version rule is testable alone.

State is `{"v": STATE_VERSION, "d": data}` text. A restore from a checkpoint or savepoint written by a
release with another state layout must stop with a clear reason, never be read as if it were ours.
"""

from __future__ import annotations

import json
from typing import Any

STATE_VERSION = 1


class StateVersionError(RuntimeError):
    """Stored operator state this release cannot read (another release's layout, or not our envelope)."""


def encode_state(data: Any) -> str:
    return json.dumps({"v": STATE_VERSION, "d": data}, ensure_ascii=False)


def decode_state(raw: str | None, default: Any) -> Any:
    """The data of one state value; `default` when the key has none yet."""
    if raw is None:
        return default
    try:
        envelope = json.loads(raw)
    except ValueError as exc:
        raise StateVersionError(f"operator state is not JSON ({exc}); it was not written by flink-memory") from None
    if not isinstance(envelope, dict) or "v" not in envelope or "d" not in envelope:
        raise StateVersionError("operator state has no version tag; it was not written by this release's layout")
    if envelope["v"] != STATE_VERSION:
        raise StateVersionError(
            f"operator state version {envelope['v']!r} is not readable by this release (it reads version "
            f"{STATE_VERSION}): restore with the release that wrote the checkpoint, or start without --restore"
        )
    return envelope["d"]
