"""What a stage tells the next one besides its records: retract units, forget an agent.

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


Control = Retract | ForgetAgent


def control_of(payload: str) -> tuple[Control | None, dict[str, Any]]:
    """(the control message, None for a record) and the parsed JSON."""
    data = json.loads(payload)
    if "control" not in data:
        return None, data
    model: type[Control] = Retract if data["control"] == "retract" else ForgetAgent
    return model.model_validate(data), data
