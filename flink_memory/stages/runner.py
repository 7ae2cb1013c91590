"""What a runner does with one activation's effects, written once for every runner: the Flink shell
(flink_memory.flink.operators) and the in-memory runner (flink_memory.local).

A runner starts the calls a core asks for, lets the pool forget the results it consumed, wakes the key when its
calls should be done or its deadline is due, sends the stage's messages to the next stage (the last stage's out
of the job) and emits the rest on its channel: dead letters, and the side channels of flink_memory.topology,
as typed messages (flink_memory.stages.channels: a runner that leaves Python writes each as one line there).
(The words: a stage *sends* a message to the next stage and *emits* a line on a side channel; docs/architecture.md.)
"""

from __future__ import annotations

from typing import Any, Protocol

from flink_memory.requests import ChatRequest
from flink_memory.stages.calls import Effects
from flink_memory.stages.channels import DEAD_LETTERS, Channel
from flink_memory.stages.messages import StageMessage


class Runner(Protocol):
    def start(self, requests: list[ChatRequest]) -> None:
        """Submit calls (idempotent by request digest)."""

    def forget(self, digests: list[str]) -> None:
        """Results the core consumed: the pool may drop them."""

    def wake(self, key: str, effects: Effects) -> None:
        """Set the key's wake-ups: when its calls should be done, its next deadline, its housekeeping."""

    def send(self, key: str, message: StageMessage) -> None:
        """Send one message of the key to the next stage (the last stage's summary nodes: out of the job)."""

    def emit(self, key: str, channel: Channel[Any], message: Any) -> None:
        """Emit one message of the key on `channel` (DEAD_LETTERS or a side channel), as the channel's model."""


def carry_out(runner: Runner, key: str, effects: Effects) -> None:
    """Carry out one activation's effects. Side channels and dead letters go before the records: a runner that
    hands messages straight to the next stage (the in-memory one) then keeps each channel in the order written."""
    runner.start(effects.start)
    runner.forget(effects.consumed)
    runner.wake(key, effects)
    for channel, messages in effects.side.items():
        for message in messages:
            runner.emit(key, channel, message)
    for dead in effects.dead_letters:
        runner.emit(key, DEAD_LETTERS, dead)
    for message in effects.out:
        runner.send(key, message)
