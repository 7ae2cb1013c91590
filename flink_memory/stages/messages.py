"""What flows between the keyed stages: one tagged union, parsed once where a stage receives it.

The planner receives input records, the batcher memory units, the merger summary nodes; besides them a stage
tells the next one to retract units, to forget an agent, to hold nodes being made again, and that an agent's
input has ended. Each message has a tag (`kind_of`); between Flink operators it travels as the pair (tag, JSON),
so the receiving shell picks the model by its tag (`from_wire`) and never guesses from the JSON. The in-memory
runner hands the objects over as they are. A stage's core receives a `StageMessage`, never text.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

from flink_memory.records import RECORD_KINDS, InputRecord, MemoryUnit, SummaryNode


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Retract(_Control):
    """Units of a record that was updated or deleted: they must leave every live node."""

    units: list[str]
    reason: str


class ForgetAgent(_Control):
    """Everything of this agent goes; node ids keep counting, so nothing written before is reused."""


class HoldNodes(_Control):
    """Batch nodes being summarized again after a change: the merger holds them, and what their replacements
    will be merged with, in its state until the replacements arrive, however long their calls take."""

    node_ids: list[str]


class EndOfInput(_Control):
    """This agent's input has ended at the stage before (a bounded input): close what is open, do not wait."""


class Rebase(_Control):
    """The job was restored: the agent's logs open this job's branch now, input or not (flink_memory.memory_log), so a
    store that applied an abandoned branch of it follows the restored one without waiting for its input."""


Control = Retract | ForgetAgent | HoldNodes | EndOfInput | Rebase
StageMessage = InputRecord | MemoryUnit | SummaryNode | Control

_MODELS: dict[str, type[BaseModel]] = {
    **RECORD_KINDS,  # (an input record's tag is its `kind`)
    "unit": MemoryUnit,
    "node": SummaryNode,
    "retract": Retract,
    "forget-agent": ForgetAgent,
    "hold": HoldNodes,
    "end": EndOfInput,
    "rebase": Rebase,
}
_TAGS: dict[type[BaseModel], str] = {model: tag for tag, model in _MODELS.items()}
END = EndOfInput()


def kind_of(message: StageMessage) -> str:
    return _TAGS[type(message)]


def to_wire(message: StageMessage) -> tuple[str, str]:
    """(tag, JSON): how a message crosses a Flink boundary."""
    tag = _TAGS[type(message)]
    return tag, "" if tag == "end" else message.model_dump_json()


def from_wire(tag: str, body: str) -> StageMessage:
    """The message a (tag, JSON) pair carries; a tag of no message is an error of ours (ValueError)."""
    if tag == "end":
        return END
    model = _MODELS.get(tag)
    if model is None:
        raise ValueError(f"no stage message is tagged {tag!r} (tags: {', '.join(_MODELS)})")
    return model.model_validate_json(body)  # type: ignore[return-value]


def text_of(message: StageMessage) -> str:
    """The message as one JSON text (a dead letter's `raw`, a fault's fingerprint, the planner's queue); a
    control's names its tag, which its own fields do not."""
    if isinstance(message, _Control):
        return json.dumps({"control": _TAGS[type(message)], **message.model_dump(mode="json")}, ensure_ascii=False)
    return message.model_dump_json()
