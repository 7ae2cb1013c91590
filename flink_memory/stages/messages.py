"""What a stage tells the next one besides its records: retract units, hold nodes being made again, forget.

Records between stages are JSON objects: memory units (planner -> batcher) and summary nodes (batcher ->
merger). A control message is a JSON object with `"control"`, which neither of those has.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Retract(_Control):
    """Units of a record that was updated or deleted: they must leave every live node."""

    control: Literal["retract"] = "retract"
    units: list[str]
    reason: str


class ForgetAgent(_Control):
    """Everything of this agent goes; node ids keep counting, so nothing written before is reused."""

    control: Literal["forget"] = "forget"


class HoldNodes(_Control):
    """Batch nodes being summarized again after a change: the merger holds them, and what their replacements
    will be merged with, in its state until the replacements arrive, however long their calls take."""

    control: Literal["revising"] = "revising"  # (its wire value, also in checkpointed in-flight messages)
    node_ids: list[str]


Control = Retract | ForgetAgent | HoldNodes
_CONTROLS: dict[str, type[Control]] = {"retract": Retract, "forget": ForgetAgent, "revising": HoldNodes}


def control_of(payload: str) -> tuple[Control | None, dict[str, Any]]:
    """(the control message, None for a record) and the parsed JSON."""
    data = json.loads(payload)
    if "control" not in data:
        return None, data
    return _CONTROLS[data["control"]].model_validate(data), data
