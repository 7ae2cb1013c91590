"""The protocol every stage core implements, so the driver and the Flink shell call each stage alike.

A core owns its decisions and its typed state (`schema`); it never waits and never touches a pool. The
driver (`stages.driver`) loads a key's state, calls one of these methods, and commits the state when it
returns: `on_input` for a record of the stage before, `on_wake` when calls finished or a deadline is due,
`on_end` when the agent's input ended, and `evict` when an error of ours keeps coming back on this key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from flink_memory.records import DeadLetter
from flink_memory.stages.calls import Effects, Finished
from flink_memory.stages.messages import StageMessage, text_of
from flink_memory.state import StateSchema, StateTransaction

if TYPE_CHECKING:
    from flink_memory.config import Config
    from flink_memory.requests import RequestFactory


def internal_dead_letter(raw: str, reason: str, agent_id: str, record_id: str | None = None) -> DeadLetter:
    """An error of ours that came again on this input (stage `internal`): every stage's and the driver's."""
    return DeadLetter(raw=raw, reason=reason, stage="internal", agent_id=agent_id, record_id=record_id)


@dataclass(frozen=True)
class Culprit:
    """What an error of ours is blamed on: the message the activation brought (`message`; None for a wake-up
    or an end of input) and/or a record the stage holds in its queue (`seq`, from a RecordFault)."""

    message: StageMessage | None = None
    seq: int | None = None

    def dead_letter(self, reason: str, agent_id: str, record_id: str | None = None) -> DeadLetter | None:
        """The brought message as a dead letter (None when the activation brought none)."""
        if self.message is None:
            return None
        return internal_dead_letter(text_of(self.message), reason, agent_id, record_id)


class StageCore(Protocol):
    """One stage's decisions for one agent at a time; each method returns what the shell must do."""

    schema: StateSchema

    def on_input(self, state: StateTransaction, message: StageMessage, finished: Finished, now_ms: int) -> Effects:
        """A message of the stage before (flink_memory.stages.messages)."""

    def on_wake(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        """Calls finished or a deadline came due: go on with what is pending."""

    def on_end(self, state: StateTransaction, finished: Finished, now_ms: int) -> Effects:
        """The agent's input ended here: close what is open, do not wait for timeouts."""

    def evict(self, state: StateTransaction, reason: str, culprit: Culprit | None = None) -> Effects:
        """An error of ours came again: turn the culprit (and the work it blocks) into dead letters, so the
        agent's other work goes on."""


class CoreFactory(Protocol):
    """How the shell makes a core in each subtask (a core class is one): picklable, built in `open()`."""

    def __call__(self, config: Config, factory: RequestFactory, *, bounded: bool = False) -> StageCore: ...
