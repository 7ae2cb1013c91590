"""The stored layout of a summary job (`summarize.reduce.ReduceJob`), which the batcher and the merger keep
between calls (layout version 2: these names are in every checkpoint)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from flink_memory.state_layout import StateModel
from flink_memory.summarize.prompts import Purpose
from flink_memory.summarize.reduce import ReduceJob


class ReduceJobV2(StateModel):
    stores: ClassVar = ReduceJob

    purpose: Purpose
    entries: list[dict[str, Any]]
    target_tokens: int | None = None
    scale: float | None = None
    round_scale: float | None = None
    own_ratio: float | None = None
    round: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    attempts: int = 0
    retry_at_ms: int = 0
    rejections: int = 0
    truncated: bool = False
    models: list[str] = Field(default_factory=list)
